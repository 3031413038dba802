"""Decode side of the pair: the output-verified pair check (I/O around `paircheck`) and the monitor that makes
decode follow its prefill peers.

Pair check, per prefill peer and prompt (`paircheck.pair_lengths`, PAIR_ROUNDS rounds of fresh prompts; the first
rounds one prompt at a time, the last `pair_check_concurrency` at a time, so that decode has met concurrent NIXL reads
and long local prefills beside running P->D decodes before it turns Ready; a canary is one sequential round):
1. prefill gets the prompt with `kv_transfer_params={do_remote_decode: true, ...}`, `max_tokens=1`;
2. this decode gets the same prompt with the kv_transfer_params prefill returned, greedy, `logprobs=1`,
   `return_token_ids`, PAIR_MAX_TOKENS tokens (a real P->D request, as the router sends it);
3. this decode gets the same prompt again without kv_transfer_params (local), same sampling;
`paircheck.compare` judges 2 against 3. Never prefill's own token: it is computed from the prompt minus its last
token.

Monitor (decode follows prefill): every `pair_recheck_seconds` (the canary's period when that is shorter) it
resolves the prefill headless Service (Ready pods only) and asks each peer's runtime for its boot id
(`GET /identity` on the runtime port: a new id = a new vLLM process, because `launch` exits with vLLM). A new
address or a new boot id is re-checked at once; a peer that is gone is forgotten. While a pair is faulted the state
carries the reason (readiness 503, probe output, Event) and the check repeats (every poll when the pair had passed
before, else every FAULT_RECHECK_SECONDS) until it passes, so decode recovers without a human. If a pair that
had passed turns bad on RESTART_AFTER_FAILURES consecutive re-checks, `on_broken` is called: `launch` then stops
vLLM and exits with EXIT_PAIR_BROKEN, so the kubelet restarts the container with a fresh NIXL agent (vllm#49238:
on 0.20 nothing else releases a stale agent), which also closes vLLM's port: the router (which keeps routing to
NotReady pods, router#279) gets connection errors instead of wrong answers.

Canary (after Ready, `canary_seconds`, 0 = off): a pair that passed is re-proved on that period even when nothing
changed identity (a wedged NIXL agent, a UCX transport change, an OOM-restarted prefill between two polls): one
round of CANARY_LENGTHS prompts, logprob-checked and transfer-proven like the pair check, against every Ready
prefill, straight to the peers (never through the router). A failing canary is a failed pair check: decode turns
not Ready with the reason, and RESTART_AFTER_FAILURES in a row restart vLLM. It never runs while a pair is faulted
(the fault's own re-checks run then) nor before the warmup's pair check passed (the monitor starts after it).

Every check and canary reads decode's own NIXL counters around it (`kvstats`): the KV rate and bytes per request go
into the readiness report (`ok; KV moved at 21.3 GB/s, 178 MB per request over rdma ...`) and the metrics; below the
floor of the declared fabric (HPD_KV_FLOOR_BYTES_PER_SECOND) the report says so (Ready stays as it is).

The KV path report on the CR's kv-reporter Lease (kube_events) also lists the peers whose pair check passed and still
holds (`peer_report`: each prefill's IP and when its current vLLM process passed): the operator switches degraded
mode back to the router only once a decode lists a Ready prefill pod there. It is written as soon as that list
changes (a peer passed, failed or is gone), with or without KV figures; unchanged, it goes with the rate-limited
figures.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hpd_runtime import contract as c
from hpd_runtime import kube_events, kvstats, ucx_transport
from hpd_runtime import paircheck as pc
from hpd_runtime.config import RuntimeConfig
from hpd_runtime.http_client import RequestError, Response, base_url, request
from hpd_runtime.log import log_event
from hpd_runtime.readiness import RuntimeState

Resolver = Callable[[str, int], list[tuple[str, int]]]
IdentityFetch = Callable[[str, int], str | None]

PAIR_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
PAIR_TOKEN_MIN = 3
PAIR_TOKEN_MAX = 1000
REQUEST_TIMEOUT_SECONDS = 300.0
"""The first P->D request on a cold decode compiles its 1-token recompute path (29 s measured on the H200)."""
FAULT_RECHECK_SECONDS = 60.0
RESTART_AFTER_FAILURES = 2
IDENTITY_TIMEOUT_SECONDS = 2.0


class PairTransportError(Exception):
    """The pair could not be exercised (no prefill, HTTP error, no kv_transfer_params): retry, not a verdict."""


@dataclasses.dataclass(frozen=True)
class PairResult:
    ok: bool
    summary: str
    verdicts: tuple[pc.Verdict, ...]
    kv: kvstats.KVSpan | None = None
    """Decode's NIXL counters over the check (None: vLLM exports none)."""


def pair_prompt(length: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randint(PAIR_TOKEN_MIN, PAIR_TOKEN_MAX) for _ in range(length)]


def fetch_identity(host: str, port: int) -> str | None:
    """The boot id of the runtime on host:port (`GET /identity`), None when it does not answer or is not warm yet
    (a peer counts only once Ready, as the headless Service's DNS would have it)."""
    try:
        resp = request("GET", base_url(host, port) + "/identity", timeout=IDENTITY_TIMEOUT_SECONDS)
    except RequestError:
        return None
    if resp.status != 200 or not isinstance(resp.body, dict) or resp.body.get("ready") is False:
        return None
    boot = resp.body.get("bootId")
    return str(boot) if boot else None


class PairChecker:
    """Runs the pair check of this decode against one prefill peer."""

    def __init__(self, cfg: RuntimeConfig, state: RuntimeState, limit: int, timeout: Callable[[], float]) -> None:
        self.cfg, self.state, self.limit, self.timeout = cfg, state, limit, timeout
        self.local = base_url(cfg.vllm_host, cfg.vllm_port)

    def _post(self, url: str, body: dict[str, Any], rid: str, kind: str) -> Response:
        t = min(self.timeout(), REQUEST_TIMEOUT_SECONDS)
        if t <= 0:
            raise PairTransportError("deadline reached")
        t0 = time.monotonic()
        try:
            resp = request("POST", url + "/v1/completions", body, {"X-Request-Id": rid}, timeout=t)
        except RequestError as e:
            if self.timeout() <= 0:  # cut short by the deadline: the retry loop keeps the earlier cause
                raise PairTransportError(f"{kind}: {e}; deadline reached") from e
            raise PairTransportError(f"{kind}: {e}") from e
        log_event("pair_request", kind=kind, prompt_tokens=len(body["prompt"]), status=resp.status,
                  seconds=round(time.monotonic() - t0, 4))  # fmt: skip
        if resp.status != 200:
            raise PairTransportError(f"{kind}: HTTP {resp.status}: {str(resp.body)[:300]}")
        return resp

    def _body(self, prompt: list[int], **extra: Any) -> dict[str, Any]:
        return {"model": self.cfg.served_model_name, "prompt": prompt, "temperature": 0, "ignore_eos": True,
                "stream": False, **extra}  # fmt: skip

    def one(self, prefill_url: str, prompt: list[int]) -> pc.Verdict:
        rid = f"hpd-pair-{uuid.uuid4().hex[:12]}"
        p = self._post(prefill_url, self._body(prompt, max_tokens=1, kv_transfer_params=dict(PAIR_KV_PARAMS)),
                       rid, "pair_prefill")  # fmt: skip
        params = p.body.get("kv_transfer_params") if isinstance(p.body, dict) else None
        if not params:
            raise PairTransportError("prefill returned no kv_transfer_params")
        # return_tokens_as_token_ids: vLLM then needs no tokenizer for the logprobs' token strings (with
        # --skip-tokenizer-init it would answer 400 "Unable to get tokenizer"), and skips detokenizing them
        sampling = {"max_tokens": pc.PAIR_MAX_TOKENS, "logprobs": 1, "return_token_ids": True,
                    "return_tokens_as_token_ids": True}  # fmt: skip
        try:
            d = self._post(self.local, self._body(prompt, kv_transfer_params=params, **sampling), rid, "pair_decode")
        except PairTransportError as e:
            if "HTTP " not in str(e):
                raise
            # A NaN logprob cannot be serialized (vLLM 0.20 answers HTTP 400 "Out of range float values are not
            # JSON compliant: nan", measured on the H200 with blockSize 128). If the same
            # prompt computed locally answers, the failure belongs to the P->D path: a verdict, not a retry.
            self._post(self.local, self._body(prompt, **sampling), f"{rid}-local", "pair_local")
            return pc.Verdict(False, f"{len(prompt)}-token prompt: the P->D request failed ({e}) while the same "
                              "prompt computed locally succeeded", float("nan"))  # fmt: skip
        loc = self._post(self.local, self._body(prompt, **sampling), f"{rid}-local", "pair_local")
        try:
            pd_c = pc.parse_completion(d.body, len(prompt))
            local_c = pc.parse_completion(loc.body, len(prompt))
        except ValueError as e:
            return pc.Verdict(False, f"{len(prompt)}-token prompt: {e}", float("nan"))
        return pc.compare(pd_c, local_c, self.cfg.pair_max_logprob_delta)

    def lengths(self, canary: bool) -> list[tuple[int, int]]:
        """(round, prompt length) of a pair check, or of a canary (the shortest and longest lengths, one round)."""
        lengths = pc.pair_lengths(self.limit)
        if canary:
            return [(0, n) for n in sorted({min(lengths), max(lengths)})][: c.CANARY_LENGTHS]
        return [(rnd, n) for rnd in range(pc.PAIR_ROUNDS) for n in lengths]

    def check(self, host: str, port: int, *, canary: bool = False) -> PairResult:
        """All rounds against one prefill (one short round: `canary`); raises PairTransportError when the pair
        cannot be exercised."""
        url = base_url(host, port)
        verdicts: list[pc.Verdict] = []
        t0 = time.monotonic()
        before = kvstats.read(self.cfg.vllm_host, self.cfg.vllm_port)
        salt = int(time.time()) % 1000
        plan = [
            (rnd, pair_prompt(n, seed=7919 * (rnd + 1) + i + salt)) for i, (rnd, n) in enumerate(self.lengths(canary))
        ]
        width = 1 if canary else self.cfg.pair_check_concurrency
        alone = [p for rnd, p in plan if width <= 1 or rnd < pc.PAIR_ROUNDS - 1]
        together = [p for rnd, p in plan if width > 1 and rnd == pc.PAIR_ROUNDS - 1]
        verdicts.extend(self.one(url, p) for p in alone)
        if together:  # concurrent P->D reads, local prefills beside running P->D decodes: all seen before Ready
            with ThreadPoolExecutor(width, thread_name_prefix="hpd-pair") as pool:
                verdicts.extend(pool.map(lambda p: self.one(url, p), together))
        kv = kvstats.span(before, kvstats.read(self.cfg.vllm_host, self.cfg.vllm_port))
        ok = all(v.ok for v in verdicts)
        summary = pc.summarize(verdicts, f"{host}:{port}")
        m = self.state.metrics
        m.pair_checks.labels(result="ok" if ok else "differs").inc()
        finite = [v.max_delta for v in verdicts if v.max_delta == v.max_delta]
        if finite:
            m.pair_max_logprob_delta.set(max(finite))
        log_event("canary" if canary else "pair_check", level="info" if ok else "error", prefill=f"{host}:{port}",
                  ok=ok, summary=summary, seconds=round(time.monotonic() - t0, 3),
                  deltas=[round(v.max_delta, 4) for v in verdicts],
                  kv=dataclasses.asdict(kv) if kv is not None else None)  # fmt: skip
        return PairResult(ok, summary, tuple(verdicts), kv)


class PairMonitor:
    """Background re-checks when the prefill peers change (see the module doc)."""

    def __init__(  # noqa: PLR0913 - the monitor's collaborators, each injected (tests pass stand-ins)
        self,
        cfg: RuntimeConfig,
        state: RuntimeState,
        checker: PairChecker,
        stop: threading.Event,
        *,
        resolver: Resolver,
        identity: IdentityFetch = fetch_identity,
        on_broken: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg, self.state, self.checker, self.stop = cfg, state, checker, stop
        self.resolver, self.identity, self.on_broken = resolver, identity, on_broken
        self.verified: dict[tuple[str, int], str | None] = {}
        """Peer address -> the boot id it had when its pair check passed."""
        self.verified_at: dict[tuple[str, int], float] = {}
        """Peer address -> when its pair check first passed with that boot id (wall clock)."""
        self.was_good = False
        self.failures = 0
        self.last_fault_check = 0.0
        self.last_canary = time.monotonic()
        self.reporter = kube_events.Reporter(kube_events.target_from_env())
        """Posts the KV path as an Event on this pod (rate-limited; nothing outside a cluster)."""

    def record_kv(self, kv: kvstats.KVSpan | None) -> None:
        """The KV path's figures of one passed check: readiness report, metrics, and a warning below the floor."""
        if kv is None or kv.bytes_per_second is None or kv.bytes_per_transfer is None:
            return
        fabric, floor = self.cfg.kv_fabric, self.cfg.kv_floor_bytes_per_second
        transport = self.state.kv_transport()
        report = kv.describe(fabric)
        if transport is not None:
            report += f"; UCX transport {transport}"
            if transport == ucx_transport.TCP_EMULATION:
                report += f" ({ucx_transport.TCP_EMULATION_WHY})"
        slow = floor > 0 and kv.bytes_per_second < floor
        if slow:
            report += f": below the {floor / 1e9:g} GB/s floor of fabric {fabric}"
            if transport is None:
                report += " (did UCX fall back to TCP?)"
        m = self.state.metrics
        m.kv_bytes_per_second.labels(fabric=fabric).set(kv.bytes_per_second)
        m.kv_bytes_per_request.labels(fabric=fabric).set(kv.bytes_per_transfer)
        m.kv_below_floor.labels(fabric=fabric).set(1 if slow else 0)
        self.state.set_kv_report(report)
        log_event("kv_path", level="warning" if slow else "info", report=report)
        self.reporter.report(
            report,
            rate=kv.bytes_per_second,
            per_request=kv.bytes_per_transfer,
            fabric=fabric,
            slow=slow,
            transport=transport,
            prefills=self.peer_report(),
        )

    def peer_report(self) -> kube_events.Peers:
        """The report's `prefills` (contract.KV_REPORT_PREFILLS): each verified peer's address (the prefill pod's IP,
        as the headless Service answers) and when its current vLLM process passed, so that the operator never takes
        a check of an earlier pod with the same IP for one of the pod that has it now."""
        out = []
        for host, port in sorted(self.verified):
            entry = {"ip": host}
            if (at := self.verified_at.get((host, port))) is not None:
                entry["verifiedTime"] = kube_events.stamp(at)
            out.append(entry)
        return out

    def post_peers(self) -> None:
        """Write the verified peers to the Lease if they changed since the last write (kube_events.Reporter.peers)."""
        self.reporter.peers(self.peer_report())

    def _forget(self, peer: tuple[str, int]) -> None:
        self.verified.pop(peer, None)
        self.verified_at.pop(peer, None)

    def record(self, host: str, port: int, result: PairResult) -> None:
        """Apply one check's outcome to the state (used by the warmup's initial check too)."""
        if result.ok:
            boot = self.identity(host, self.cfg.prefill_runtime_port)
            if (host, port) not in self.verified_at or self.verified.get((host, port)) != boot:
                self.verified_at[(host, port)] = time.time()  # a new peer, or a new process at that address
            self.verified[(host, port)] = boot
            self.was_good, self.failures = True, 0
            # the pair was just proven: the canary's period runs from here (the start-up check can take longer
            # than a short period, which made the first canary fire at once after Ready)
            self.last_canary = time.monotonic()
            self.state.set_pair_fault(None)
            self.record_kv(result.kv)
        else:
            self._forget((host, port))
            self.failures += 1
            self.state.set_pair_fault(result.summary)
        self.last_fault_check = time.monotonic()
        self.post_peers()  # the list changed without KV figures (or they were not due): the operator waits for it

    def changed_peers(self) -> list[tuple[str, int]]:
        """Peers that need a check now: new addresses, new boot ids; forgets peers that are gone."""
        service = self.cfg.prefill_service
        assert service is not None
        peers = self.resolver(service, self.cfg.prefill_port)
        for gone in set(self.verified) - set(peers):
            log_event("pair_peer_gone", prefill=f"{gone[0]}:{gone[1]}")
            self._forget(gone)
        out = []
        for host, port in peers:
            boot = self.identity(host, self.cfg.prefill_runtime_port)
            if (host, port) not in self.verified or (boot is not None and boot != self.verified[(host, port)]):
                out.append((host, port))
        return out

    def apply(self, host: str, port: int, result: PairResult) -> bool:
        """Record a re-check's or canary's outcome; True when a pair that had passed stayed broken and `on_broken`
        was called (vLLM is being restarted: stop checking)."""
        good_before = self.was_good
        self.record(host, port, result)
        if not result.ok and good_before and self.failures >= RESTART_AFTER_FAILURES and self.on_broken:
            self.on_broken(result.summary)
            return True
        return False

    def canary(self) -> None:
        """One canary round trip against every verified peer (see the module doc)."""
        self.last_canary = time.monotonic()
        m = self.state.metrics
        for host, port in list(self.verified):
            try:
                result = self.checker.check(host, port, canary=True)
            except PairTransportError as e:
                m.canary_checks.labels(result="error").inc()
                log_event("canary_error", level="warning", prefill=f"{host}:{port}", error=str(e))
                continue  # the peer may be going away; the next poll sees it
            m.canary_checks.labels(result="ok" if result.ok else "differs").inc()
            if result.ok:
                m.canary_last_success.labels(prefill=f"{host}:{port}").set(time.time())
            if self.apply(host, port, result):
                return

    def canary_due(self) -> bool:
        period = self.cfg.canary_seconds
        return period > 0 and self.was_good and time.monotonic() - self.last_canary >= period

    def step(self) -> None:
        """One poll: re-check changed peers (and, while faulted, everything every FAULT_RECHECK_SECONDS); when
        nothing else is due and the pair is good, the canary on its period."""
        faulted = self.state.pair_fault() is not None
        todo = self.changed_peers()
        self.post_peers()  # a peer gone; or a write that failed, retried
        if not todo and not faulted and self.canary_due():
            self.canary()
            return
        every = self.cfg.pair_recheck_seconds if self.was_good else FAULT_RECHECK_SECONDS
        if faulted and not todo and time.monotonic() - self.last_fault_check >= every:
            todo = self.resolver(self.cfg.prefill_service or "", self.cfg.prefill_port)
        if not todo:
            return
        log_event("pair_recheck", peers=[f"{h}:{p}" for h, p in todo], faulted=faulted)
        for host, port in todo:
            try:
                result = self.checker.check(host, port)
            except PairTransportError as e:
                log_event("pair_recheck_error", level="warning", prefill=f"{host}:{port}", error=str(e))
                continue  # the peer may be going away; the next poll sees it again
            if self.apply(host, port, result):
                return

    def poll_seconds(self) -> float:
        """The monitor's poll period: the re-check poll, shortened to the canary's period when that is shorter (the
        canary runs from the poll: before this, a 5 s canary on the 10 s default poll ran every 10 s)."""
        period = self.cfg.canary_seconds
        return min(self.cfg.pair_recheck_seconds, period) if period > 0 else self.cfg.pair_recheck_seconds

    def run(self) -> None:
        while not self.stop.wait(self.poll_seconds()):
            try:
                self.step()
            except Exception as e:  # the monitor must outlive any surprise; the next poll retries
                log_event("pair_monitor_error", level="error", error=repr(e))
