"""The output-verified pair check and the pair monitor, against the vLLM stand-in (loopback only)."""

from __future__ import annotations

import datetime
import itertools
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import pytest

from hpd_runtime import contract as c
from hpd_runtime import kube_events as ke
from hpd_runtime import kvstats
from hpd_runtime import paircheck as pc
from hpd_runtime import warmup as w
from hpd_runtime.config import RuntimeConfig, load_config
from hpd_runtime.pairing import RESTART_AFTER_FAILURES, PairChecker, PairMonitor, PairResult
from hpd_runtime.readiness import ReadinessServer, RuntimeMetrics, RuntimeState, evaluate_readiness
from hpd_runtime.warmup import Warmup

from .conftest import LOOPBACK, REPO, Fake, free_port, http, wait_until

# --- the comparison (pure) ---------------------------------------------------------------------------------------


def comp(lps: list[float], ids: list[int] | None = None, cached: int | None = 299) -> pc.Completion:
    return pc.Completion(tuple(ids) if ids else None, tuple(lps), cached, 300)


def test_close_logprobs_pass_and_report_the_largest_delta() -> None:
    v = pc.compare(comp([-1.0, -2.0], [5, 6]), comp([-1.1, -2.05], [5, 6]))
    assert v.ok and math.isclose(v.max_delta, 0.1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -9999.0])
def test_a_non_finite_or_clamped_logprob_fails(bad: float) -> None:
    v = pc.compare(comp([-1.0, bad], [5, 0]), comp([-1.0, -2.0], [5, 6]))
    assert not v.ok and "P->D logprob at token 1" in v.reason


def test_a_gap_beyond_the_bound_fails_and_names_the_tokens() -> None:
    v = pc.compare(comp([-4.0], [0]), comp([-1.0], [7]))
    assert not v.ok and "token 0 vs 7" in v.reason and "> 0.5 nats" in v.reason


def test_positions_after_the_first_divergence_are_not_compared() -> None:
    # ids diverge at token 1 into another valid id (heterogeneous TP does this); token 2 conditions on other text
    v = pc.compare(comp([-1.0, -1.2, -9.0], [5, 6, 7]), comp([-1.0, -1.3, -1.0], [5, 8, 9]))
    assert v.ok


def test_no_transfer_means_no_verdict() -> None:
    assert "0 tokens from prefill" in pc.compare(comp([-1.0], cached=0), comp([-1.0])).reason
    assert "--enable-prompt-tokens-details" in pc.compare(comp([-1.0], cached=None), comp([-1.0])).reason


def test_pair_lengths_span_the_diagnosis_set_and_clamp_to_the_limit() -> None:
    assert pc.pair_lengths(4091) == pc.PAIR_PROMPT_LENGTHS
    assert pc.pair_lengths(1000) == (300, 650, 1000)


def test_summary_names_the_mismatch_and_the_block_size_hint() -> None:
    bad = pc.Verdict(False, "650-token prompt: ...", math.nan)
    text = pc.summarize([pc.Verdict(True, "ok", 0.01), bad], "10.0.0.1:8000")
    assert text.startswith("P->D output differs from local on 1/2 prompts via prefill 10.0.0.1:8000")
    assert "spec.blockSize" in text


# --- against the stand-in ----------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(w, "RETRY_BACKOFF_SECONDS", (0.05,))
    monkeypatch.setattr(w, "HEALTH_POLL_SECONDS", 0.05)


def decode_cfg(decode: Fake, **env: str) -> RuntimeConfig:
    base = {
        c.ENV_VLLM_HOST: LOOPBACK,
        c.ENV_VLLM_PORT: str(decode.port),
        c.ENV_MODEL: "fake-model",
        c.ENV_ROLE: "decode",
        c.ENV_WARMUP_PAIR_CHECK: "true",
        c.ENV_PREFILL_SERVICE: "demo-prefill.ns.svc",
        c.ENV_MAX_MODEL_LEN: "1200",
        c.ENV_WARMUP_CONCURRENCY: "1",
        c.ENV_WARMUP_TIMEOUT_SECONDS: "60",
    }
    return load_config({**base, **env})


class Peers:
    """What DNS and the prefill runtimes would answer: one prefill address and its boot id."""

    def __init__(self, prefill: Fake) -> None:
        self.addrs = [(LOOPBACK, prefill.port)]
        self.boot = "boot-1"

    def resolve(self, service: str, port: int) -> list[tuple[str, int]]:
        return list(self.addrs)

    def identity(self, host: str, port: int) -> str | None:
        return self.boot


def warm(
    cfg: RuntimeConfig, peers: Peers, on_broken: Callable[[str], None] | None = None
) -> tuple[Warmup, RuntimeState]:
    state = RuntimeState(RuntimeMetrics())
    wu = Warmup(cfg, state, threading.Event(), peers.resolve, identity=peers.identity, on_broken=on_broken)
    assert wu.run()
    return wu, state


@pytest.mark.parametrize("mode", ["wrong-tokens", "nan", "no-transfer"])
def test_decode_stays_unready_when_pd_output_is_wrong(start_fake: Callable[..., Fake], mode: str) -> None:
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details", "--pd-output", mode)
    cfg = decode_cfg(decode)
    _, state = warm(cfg, Peers(prefill))
    ready, why = evaluate_readiness(state, cfg)
    assert not ready
    if mode == "no-transfer":
        assert "no KV transfer happened" in why
    else:
        assert why.startswith(pc.DIFFERS) and "spec.blockSize" in why
    assert state.metrics.registry.get_sample_value("hpd_runtime_pair_ok") == 0


def test_decode_is_ready_when_pd_matches_local(start_fake: Callable[..., Fake]) -> None:
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details")
    cfg = decode_cfg(decode)
    _, state = warm(cfg, Peers(prefill))
    assert evaluate_readiness(state, cfg) == (True, "ok")
    delta = state.metrics.registry.get_sample_value("hpd_runtime_pair_max_logprob_delta")
    assert delta is not None and math.isclose(delta, 0.01, abs_tol=1e-6)  # the stand-in's healthy P->D shift


def test_a_prefill_restart_triggers_a_recheck_and_decode_follows(start_fake: Callable[..., Fake]) -> None:
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details")
    cfg = decode_cfg(decode)
    peers = Peers(prefill)
    broken: list[str] = []
    wu, state = warm(cfg, peers, broken.append)
    monitor = wu.monitor
    assert isinstance(monitor, PairMonitor)
    n_prefill = len(prefill.requests())

    monitor.step()  # nothing changed: no new pair requests
    assert len(prefill.requests()) == n_prefill

    decode.control(pd_output="wrong-tokens")  # the stale-agent failure, as decode would see it
    peers.boot = "boot-2"  # the prefill's vLLM restarted
    monitor.step()
    assert len(prefill.requests()) > n_prefill
    ready, why = evaluate_readiness(state, cfg)
    assert not ready and why.startswith(pc.DIFFERS)

    for _ in range(RESTART_AFTER_FAILURES - 1):  # still broken on the next polls: give up on this vLLM
        monitor.step()
    assert broken and broken[0].startswith(pc.DIFFERS)

    decode.control(pd_output="ok")  # after the restart (or once the prefill is fixed) the pair passes again
    peers.boot = "boot-3"
    monitor.step()
    assert evaluate_readiness(state, cfg) == (True, "ok")


def test_a_new_prefill_address_is_checked_and_a_gone_one_forgotten(start_fake: Callable[..., Fake]) -> None:
    prefill, other = start_fake(), start_fake()
    decode = start_fake("--enable-prompt-tokens-details")
    cfg = decode_cfg(decode)
    peers = Peers(prefill)
    wu, _ = warm(cfg, peers)
    assert wu.monitor is not None
    peers.addrs = [(LOOPBACK, other.port)]  # the headless Service's DNS answer changed (a new pod IP)
    wu.monitor.step()
    assert other.requests() and set(wu.monitor.verified) == {(LOOPBACK, other.port)}


# --- the exec probe ------------------------------------------------------------------------------------------------


def test_probe_prints_the_readiness_reason_and_fails(start_fake: Callable[..., Fake]) -> None:
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details", "--pd-output", "nan")
    port = free_port()
    cfg = decode_cfg(decode, **{c.ENV_RUNTIME_HOST: LOOPBACK, c.ENV_RUNTIME_PORT: str(port)})
    _, state = warm(cfg, Peers(prefill))
    server = ReadinessServer(state, cfg).start()
    try:
        assert http("GET", f"http://{LOOPBACK}:{port}{c.PATH_IDENTITY}")[1].startswith('{"bootId"')
        env = {"PYTHONPATH": str(REPO / "images" / "runtime"), c.ENV_RUNTIME_PORT: str(port)}
        out = subprocess.run(
            [sys.executable, "-m", "hpd_runtime", "probe"], env=env, capture_output=True, text=True, check=False
        )
    finally:
        server.stop()
    assert out.returncode == 1
    assert out.stdout.startswith(pc.DIFFERS) and "is nan" in out.stdout


def test_a_pd_request_that_fails_while_local_succeeds_is_a_mismatch(start_fake: Callable[..., Fake]) -> None:
    """vLLM 0.20 answers HTTP 400 when a P->D answer's logprobs are NaN (blockSize 128 on the H200,
    bench/results/2026-11-29-gpu-issue12-block128.json): that must read as a P->D mismatch, not a config error."""
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details", "--pd-output", "nan-http-400")
    cfg = decode_cfg(decode)
    _, state = warm(cfg, Peers(prefill))
    ready, why = evaluate_readiness(state, cfg)
    assert not ready and why.startswith(pc.DIFFERS) and "HTTP 400" in why and "nan" in why


# --- after Ready: the canary, the KV path's figures, re-checks past the warmup deadline ---------------------------
DECODE_CONNECTOR = ("--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}')


def test_the_pair_check_reports_the_kv_path_it_measured_and_a_rate_below_the_fabric_floor(
    start_fake: Callable[..., Fake],
) -> None:
    """#26: the KV rate and bytes per request of the pair check's own transfers (decode's NIXL counters around it)
    in the readiness report and the metrics; below the declared fabric's floor the report says so, Ready stays."""
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details", *DECODE_CONNECTOR)
    cfg = decode_cfg(decode, **{c.ENV_KV_FABRIC: "rdma", c.ENV_KV_FLOOR_BYTES_PER_SECOND: str(5e9)})
    _, state = warm(cfg, Peers(prefill))
    ready, why = evaluate_readiness(state, cfg)
    assert ready and why.startswith("ok; KV moved at ") and " over rdma (" in why, why
    assert "below the 5 GB/s floor of fabric rdma" in why  # the stand-in moves ~0.5 GB/s
    rate = state.metrics.registry.get_sample_value("hpd_runtime_kv_transfer_bytes_per_second", {"fabric": "rdma"})
    per = state.metrics.registry.get_sample_value("hpd_runtime_kv_transfer_bytes_per_request", {"fabric": "rdma"})
    assert rate is not None and 1e8 < rate < 5e9 and per is not None and per > 0
    assert state.metrics.registry.get_sample_value("hpd_runtime_kv_transfer_below_floor", {"fabric": "rdma"}) == 1


def test_the_canary_reproves_each_prefill_on_its_period_and_a_failing_one_turns_decode_not_ready(
    start_fake: Callable[..., Fake],
) -> None:
    """#31: a pair that passed at Ready goes bad later with no identity change (a wedged agent): the canary finds
    it within one period, decode turns not Ready with the reason, and recovers once the path is good again."""
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details", *DECODE_CONNECTOR)
    cfg = decode_cfg(decode, **{c.ENV_CANARY_SECONDS: "0.5"})
    peers = Peers(prefill)
    wu, state = warm(cfg, peers)
    monitor = wu.monitor
    assert isinstance(monitor, PairMonitor)
    n = len(prefill.requests())
    monitor.step()  # within the period: nothing
    assert len(prefill.requests()) == n
    time.sleep(0.6)
    monitor.step()
    sent = prefill.requests()[n:]
    assert len(sent) == c.CANARY_LENGTHS and all(r["body"].get("kv_transfer_params") for r in sent), sent
    reg = state.metrics.registry
    assert reg.get_sample_value("hpd_runtime_canary_checks_total", {"result": "ok"}) == 1
    assert (reg.get_sample_value("hpd_runtime_canary_last_success_timestamp_seconds",
                                 {"prefill": f"{LOOPBACK}:{prefill.port}"}) or 0) > time.time() - 60  # fmt: skip
    assert evaluate_readiness(state, cfg)[0]

    decode.control(pd_output="wrong-tokens")  # the path goes bad; nothing changes identity
    time.sleep(0.6)
    monitor.step()
    ready, why = evaluate_readiness(state, cfg)
    assert not ready and why.startswith(pc.DIFFERS)
    assert reg.get_sample_value("hpd_runtime_canary_checks_total", {"result": "differs"}) == 1

    decode.control(pd_output="ok")
    monitor.step()  # while faulted, the fault's own re-check runs on every poll of a pair that had passed
    assert evaluate_readiness(state, cfg)[0]


def test_the_canary_is_off_at_zero(start_fake: Callable[..., Fake]) -> None:
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details")
    wu, _ = warm(decode_cfg(decode, **{c.ENV_CANARY_SECONDS: "0"}), Peers(prefill))
    assert wu.monitor is not None
    n = len(prefill.requests())
    time.sleep(0.2)
    wu.monitor.step()
    assert len(prefill.requests()) == n


def test_a_prefill_restart_is_rechecked_after_the_warmup_timeout_has_passed(start_fake: Callable[..., Fake]) -> None:
    """The warmup's deadline bounded the monitor's re-checks too: once warmupTimeoutSeconds had passed since start,
    every re-check ended "deadline reached" and decode stopped following its prefill."""
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details")
    cfg = decode_cfg(decode, **{c.ENV_WARMUP_TIMEOUT_SECONDS: "2"})
    peers = Peers(prefill)
    wu, state = warm(cfg, peers)
    assert wu.monitor is not None
    time.sleep(2.2)  # past the warmup's deadline
    decode.control(pd_output="wrong-tokens")
    peers.boot = "boot-2"
    wu.monitor.step()
    ready, why = evaluate_readiness(state, cfg)
    assert not ready and why.startswith(pc.DIFFERS), why


@pytest.mark.parametrize(("canary", "poll"), [("5", 5.0), ("0", 10.0), ("300", 10.0), ("0.5", 0.5)])
def test_the_monitor_polls_at_least_as_often_as_the_canary_period(
    start_fake: Callable[..., Fake], canary: str, poll: float
) -> None:
    """The canary runs from the monitor's poll (every HPD_PAIR_RECHECK_SECONDS, 10 s by default): a canary period
    shorter than the poll ran on the poll's period instead of its own."""
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details")
    wu, _ = warm(decode_cfg(decode, **{c.ENV_CANARY_SECONDS: canary}), Peers(prefill))
    assert wu.monitor is not None and wu.monitor.poll_seconds() == poll


def test_a_running_monitor_fires_the_canary_on_its_own_period(start_fake: Callable[..., Fake]) -> None:
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details")
    wu, state = warm(decode_cfg(decode, **{c.ENV_CANARY_SECONDS: "0.3"}), Peers(prefill))
    assert wu.monitor is not None
    thread = threading.Thread(target=wu.monitor.run, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: (state.metrics.registry.get_sample_value("hpd_runtime_canary_checks_total", {"result": "ok"})
                     or 0) >= 3,
            timeout=8, what="three canaries from the running monitor",
        )  # fmt: skip
    finally:
        wu.stop.set()
        thread.join(10)


def pd_arrivals(decode: Fake) -> list[float]:
    """When decode received each P->D request (one carrying prefill's kv_transfer_params), in order."""
    return sorted(
        r["t"] for r in decode.requests() if r["path"] == "/v1/completions" and r["body"].get("kv_transfer_params")
    )


@pytest.mark.parametrize("width", [4, 1])
def test_the_last_round_of_the_start_up_pair_check_runs_its_prompts_together(
    start_fake: Callable[..., Fake], width: int
) -> None:
    """#31: the first canary on a decode under load stalled ~2 s on the H200 (0.20) when decode first met concurrent
    P->D reads and a long local prefill beside running P->D decodes after Ready. The start-up check's last round now
    sends its prompts `HPD_PAIR_CHECK_CONCURRENCY` at a time (4 by default), so decode meets both before Ready; 1 keeps
    every prompt after the previous one. The canary stays one prompt at a time."""
    delay = 0.3
    prefill = start_fake()
    decode = start_fake("--enable-prompt-tokens-details", "--completion-delay", str(delay))
    cfg = decode_cfg(decode, **{c.ENV_PAIR_CHECK_CONCURRENCY: str(width), c.ENV_CANARY_SECONDS: "0.1"})
    wu, state = warm(cfg, Peers(prefill))
    assert evaluate_readiness(state, cfg)[0]
    n = len(pc.pair_lengths(wu.monitor.checker.limit if wu.monitor else 0))
    t = pd_arrivals(decode)
    assert len(t) == pc.PAIR_ROUNDS * n, t
    first, last = t[:n], t[-n:]
    gaps_first = [b - a for a, b in itertools.pairwise(first)]
    assert min(gaps_first) >= 2 * delay * 0.9, gaps_first  # P->D, then the local answer, then the next prompt
    if width > 1:
        assert max(last) - min(last) < delay, last  # all in flight before the first one was answered
    else:
        assert min(b - a for a, b in itertools.pairwise(last)) >= 2 * delay * 0.9, last
    assert wu.monitor is not None
    time.sleep(0.15)
    wu.monitor.step()  # the canary: its prompts one after another
    canary = pd_arrivals(decode)[len(t) :]
    assert len(canary) == c.CANARY_LENGTHS and canary[1] - canary[0] >= 2 * delay * 0.9, canary


# --- the verified peers on the KV path report (no vLLM: a stand-in checker) -----------------------------------------


class Checker:
    """A pair check that passes (or not) at once, with or without KV figures."""

    def __init__(self) -> None:
        self.ok, self.kv = True, None
        self.checked: list[tuple[str, int]] = []

    def check(self, host: str, port: int, *, canary: bool = False) -> PairResult:
        self.checked.append((host, port))
        return PairResult(self.ok, "ok" if self.ok else pc.DIFFERS + " via prefill", (), self.kv)


class Dns:
    """The prefill headless Service's answer and each address's boot id."""

    def __init__(self) -> None:
        self.boots: dict[str, str] = {}

    def resolve(self, service: str, port: int) -> list[tuple[str, int]]:
        return [(ip, port) for ip in sorted(self.boots)]

    def identity(self, host: str, port: int) -> str | None:
        return self.boots.get(host)


def reporting_monitor(monkeypatch: pytest.MonkeyPatch) -> tuple[PairMonitor, Checker, Dns, list[dict[str, Any]]]:
    """A decode's monitor whose reporter writes to a stand-in Lease: returns the reports the Lease got, in order."""
    written: list[dict[str, Any]] = []

    def patch(t: ke.Target, body: dict[str, Any]) -> int:
        written.extend(json.loads(v) for v in body["metadata"]["annotations"].values())
        return 200

    monkeypatch.setattr(ke, "patch_report", patch)
    monkeypatch.setattr(ke, "post", lambda t, body: 201)
    cfg = load_config({c.ENV_ROLE: "decode", c.ENV_MODEL: "m", c.ENV_WARMUP_PAIR_CHECK: "true",
                       c.ENV_PREFILL_SERVICE: "demo-prefill.ns.svc", c.ENV_CANARY_SECONDS: "0"})  # fmt: skip
    checker, dns = Checker(), Dns()
    monitor = PairMonitor(cfg, RuntimeState(RuntimeMetrics()), cast("PairChecker", checker), threading.Event(),
                          resolver=dns.resolve, identity=dns.identity)  # fmt: skip
    monitor.reporter = ke.Reporter(ke.Target("https://10.0.0.1:443", "/t", None, "d-0", "ns", "u", lease="m-kv"))
    return monitor, checker, dns, written


def ips(report: dict[str, Any]) -> list[str]:
    return [p["ip"] for p in report[c.KV_REPORT_PREFILLS]]


def test_the_report_lists_the_verified_prefills_as_they_change_with_or_without_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator holds degraded mode on decode until a Ready decode lists a Ready prefill pod as verified: the
    list reaches the Lease when a prefill passes (also from a check that measured no KV figures), fails or is gone,
    and not while nothing changes."""
    monitor, checker, dns, written = reporting_monitor(monkeypatch)
    dns.boots = {"10.0.0.5": "boot-1"}
    monitor.step()  # a new address: checked, passed, no figures: the list alone
    assert checker.checked == [("10.0.0.5", 8000)] and len(written) == 1
    assert ips(written[-1]) == ["10.0.0.5"] and "bytesPerSecond" not in written[-1]
    first = written[-1][c.KV_REPORT_PREFILLS][0]["verifiedTime"]
    assert abs(time.time() - ke_time(first)) < 5
    monitor.step()  # nothing changed: nothing written
    assert len(written) == 1
    dns.boots = {}  # the prefill pod deleted: gone from the Service
    monitor.step()
    assert len(written) == 2 and ips(written[-1]) == []
    dns.boots = {"10.0.0.9": "boot-1"}  # its replacement, once checked (figures this time: one write with both)
    checker.kv = kvstats.KVSpan(bytes=4e9, seconds=1.0, transfers=10, failed=0)
    monitor.step()
    assert len(written) == 3 and ips(written[-1]) == ["10.0.0.9"] and written[-1]["bytesPerSecond"] == 4e9
    checker.ok, dns.boots = False, {"10.0.0.9": "boot-2"}  # its vLLM restarted, and the pair now fails: unlisted
    monitor.step()
    assert len(written) == 4 and ips(written[-1]) == [] and written[-1]["bytesPerSecond"] == 4e9


def test_a_new_process_at_a_verified_address_is_listed_with_the_time_of_its_own_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An IP taken over by another prefill pod: the entry's time moves to that pod's check, so the operator never
    counts the earlier pod's check for the later pod; a canary of the same process keeps the time."""
    monitor, checker, dns, written = reporting_monitor(monkeypatch)
    dns.boots = {"10.0.0.5": "boot-1"}
    monitor.step()
    monitor.verified_at[("10.0.0.5", 8000)] -= 600  # checked 10 minutes ago
    before = monitor.peer_report()[0]["verifiedTime"]
    monitor.record("10.0.0.5", 8000, checker.check("10.0.0.5", 8000, canary=True))  # the same process re-proved
    assert monitor.peer_report()[0]["verifiedTime"] == before
    dns.boots = {"10.0.0.5": "boot-2"}  # another process (another pod) at the address
    monitor.step()
    assert len(checker.checked) == 3 and ke_time(ips_at(written[-1])) > ke_time(before)


def ips_at(report: dict[str, Any]) -> str:
    return str(report[c.KV_REPORT_PREFILLS][0]["verifiedTime"])


def ke_time(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
