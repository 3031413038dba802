"""Warmup: pay vLLM's lazy first-use costs (Triton autotune/JIT of the Mamba2 SSD and conv1d kernels, decode
state paths, the first NIXL handshake) before the pod reports Ready.

What is sent, after vLLM `/health` answers 200 (all `/v1/completions`, token-id prompts, no tokenizer):
1. one at a time: `short` (16 tokens), `chunked` (2 x SSD chunk + 17: several SSD chunks in one prefill) and
   `long` (several chunks; longer than `--max-num-batched-tokens` when that fits, so chunked prefill carries an
   initial state into the next step), each with a few decode tokens;
2. `continuation`: the `chunked` prompt plus one more chunk of new tokens (with prefix caching on, the cached
   prefix makes the SSD kernels run with initial states; with it off, the `long` prompt covers that path);
3. `concurrent`: HPD_WARMUP_CONCURRENCY requests at once (batched prefill + batched decode);
4. `shape`: one prompt per length of `shape_lengths` (1-3, and p - 1, p, 1.5 p + 3 for every power of two p up to
   the prompt limit, then the limit): the first request of each new prompt length after Ready measured +10-20 ms
   on vLLM 0.20 and the token count's length classes (1 / multiple of 16 / other) are compiled
   separately by Triton, so every class and octave is paid for here (bench/gpu/README.md has the measurement);
5. `batch`: BATCH_CLASS_SIZE (16) short prompts at once, the "multiple of 16" decode batch class;
6. `split`: prompts of min(limit, budget) tokens, budget // that + 2 of them at once, budget being
   `--max-num-batched-tokens` or, unset, SPLIT_BUDGET_DEFAULT (above vLLM's own defaults: 8192 on the H200 for 0.20
   and 0.25.1). Their tokens exceed one step's budget, so the scheduler splits a prompt and its next chunk runs the
   SSD kernels with initial states (`_state_passing_fwd_kernel`, `_chunk_scan_fwd_kernel`: other Triton keys,
   autotuned on first use). Step 1's `long` prompt covers that only when it can be longer than the budget; on the
   H200 with vLLM 0.20, maxModelLen 4096 and the default budget 8192 it could not, and the first batch of
   concurrent long prompts after Ready autotuned both kernels on prefill for 30 s (bench/gpu/README.md);
7. `sampler`: two short prompts that ask for what user requests ask for and the other steps do not: `logprobs`
   (greedy, `logprobs=1`: vLLM's sampler ranks the sampled token with a torch.compile'd function,
   `batched_count_greater_than`, compiled by Inductor in the first request that asks for logprobs; vllm-router
   forwards a client's `logprobs` to prefill too, and on the H200 that first request through the router cost
   0.5-0.7 s with warm caches and about 2 s cold while every later one took 0.08 s) and `sampled`
   (temperature, top-p, top-k and a seed: the random-sampling path, FlashInfer's sampling kernels where the image
   has them);
8. decode with pair check only: the output-verified pair check (`hpd_runtime.pairing`) against every Ready
   prefill pod behind the prefill headless Service (it publishes only Ready endpoints): P->D answers compared with
   local answers by top-1 logprobs (`hpd_runtime.paircheck`). A mismatch is a verdict, not an error: the pod
   stays not ready with "P->D output differs from local ..." as the reason; the pair monitor then keeps
   re-checking, and re-checks whenever the prefill peers change (decode follows prefill).

HPD_WARMUP_PROMPT_LENGTHS replaces the lengths of step 1 (`custom`); steps 2-7 still run.

Token ids are drawn from a seeded RNG in [3, 1000]: the vocabulary is unknown here, ids 0-2 are often special
(pad/bos/eos) and every real tokenizer has more than 1000 ids. Prompts are never longer than
`max_model_len - max_tokens - 1`. `ignore_eos` keeps prefill from stopping early (on vLLM 0.20 a prefill that
stops on EOS returns no kv_transfer_params).

Deadline and retries: HPD_WARMUP_TIMEOUT_SECONDS counts from the first `/health` 200 (model load is the
startupProbe's business). A 4xx from the local vLLM is a configuration error and fails the warmup at once;
5xx and transport errors retry the local phase with backoff. The pair check retries (prefill may come up later)
until the deadline. Past the deadline the warmup has failed: the pod stays not ready for good, the reason is
logged as `warmup_failed` and repeated every minute as `not_ready` (a restart of the container retries, with
the keyed cache already warm).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from hpd_runtime.config import RuntimeConfig
from hpd_runtime.http_client import RequestError, Response, base_url, health_status, request
from hpd_runtime.log import log_event
from hpd_runtime.pairing import (
    PAIR_KV_PARAMS,
    IdentityFetch,
    PairChecker,
    PairMonitor,
    PairTransportError,
    Resolver,
    fetch_identity,
)
from hpd_runtime.readiness import RuntimeState

TOKEN_ID_MIN = 3
TOKEN_ID_MAX = 1000
SHORT_LENGTH = 16
LONG_CAP_CHUNKS = 8
"""Without a known max model len, the `long` prompt is at most this many SSD chunks."""
HEALTH_POLL_SECONDS = 1.0
RETRY_BACKOFF_SECONDS = (2.0, 5.0, 10.0, 20.0, 30.0)
NOT_READY_REMINDER_SECONDS = 60.0
__all__ = ["PAIR_KV_PARAMS", "Resolver", "Warmup", "plan_warmup", "resolve_prefill", "start_warmup_thread"]


@dataclasses.dataclass(frozen=True)
class WarmupPrompt:
    kind: str
    tokens: tuple[int, ...]
    max_tokens: int
    sampling: tuple[tuple[str, Any], ...] = ()
    """Request fields over the greedy defaults of `completion_body` (the `sampler` step)."""


LOGPROBS_FIELDS: tuple[tuple[str, Any], ...] = (("logprobs", 1), ("return_tokens_as_token_ids", True))
"""`return_tokens_as_token_ids`: with --skip-tokenizer-init vLLM 0.20 answers logprobs without it with HTTP 400."""
SAMPLED_FIELDS: tuple[tuple[str, Any], ...] = (
    ("temperature", 0.8), ("top_p", 0.95), ("top_k", 40), ("seed", 7), *LOGPROBS_FIELDS,
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class WarmupPlan:
    sequential: tuple[WarmupPrompt, ...]
    concurrent: tuple[WarmupPrompt, ...]
    pair: bool
    """Decode with pair check: run the output-verified pair check (hpd_runtime.pairing) after the local phase."""
    shapes: tuple[WarmupPrompt, ...] = ()
    """One prompt per length of `shape_lengths`: every length class up to the prompt limit."""
    batch: tuple[WarmupPrompt, ...] = ()
    """BATCH_CLASS_SIZE short prompts at once: a decode batch that is a multiple of 16."""
    split: tuple[WarmupPrompt, ...] = ()
    """Prompts at once whose tokens exceed one scheduler step's budget: a prompt split over two steps."""


class WarmupError(Exception):
    def __init__(self, reason: str, permanent: bool = False) -> None:
        super().__init__(reason)
        self.permanent = permanent


def prompt_tokens(length: int, seed: int) -> tuple[int, ...]:
    """Deterministic token ids in [TOKEN_ID_MIN, TOKEN_ID_MAX]."""
    rng = random.Random(seed)
    return tuple(rng.randint(TOKEN_ID_MIN, TOKEN_ID_MAX) for _ in range(length))


def prompt_limit(cfg: RuntimeConfig) -> int:
    """Longest prompt the warmup sends."""
    if cfg.max_model_len is not None:
        return max(1, cfg.max_model_len - cfg.warmup_max_tokens - 1)
    return LONG_CAP_CHUNKS * cfg.ssd_chunk_size + 13


SHAPE_MIN = 16
BATCH_CLASS_SIZE = 16
SPLIT_BUDGET_DEFAULT = 16384
"""The step budget the `split` step exceeds when `--max-num-batched-tokens` is not set: vLLM's defaults are 2048,
8192 (its OpenAI server on large GPUs: measured 8192 on the H200 with 0.20 and 0.25.1) or 16384."""


def split_lengths(limit: int, budget: int | None) -> tuple[int, ...]:
    """Prompt lengths sent at once so that their tokens exceed one step's budget by more than a prompt (even when the
    first one is scheduled alone, the rest still exceed a step): a prompt is split and continues with initial
    states."""
    step = budget if budget is not None else SPLIT_BUDGET_DEFAULT
    n = max(1, min(limit, step))
    return (n,) * (step // n + 2)


def shape_lengths(limit: int) -> tuple[int, ...]:
    """Prompt lengths that cover every length class up to `limit`: 1, 2, 3, and for every power of two p from
    SHAPE_MIN: p - 1 and p (Triton's "divisible by 16" and "not" classes of the token count on both sides of a
    boundary) and 1.5 p + 3 (a non-multiple between the powers, so GEMM heuristics that change with the token count
    see every octave twice). Ends with `limit` itself (and limit - 1 when limit is a multiple of 16)."""
    out: set[int] = {1, 2, 3}
    p = SHAPE_MIN
    while p <= limit:
        out.update({p - 1, p})
        mid = p + p // 2 + 3
        if mid <= limit:
            out.add(mid)
        p *= 2
    out.add(limit)
    if limit % 16 == 0:
        out.add(limit - 1)
    return tuple(sorted(n for n in out if 1 <= n <= limit))


def plan_warmup(cfg: RuntimeConfig) -> WarmupPlan:
    """The prompts to send (pure)."""
    limit = prompt_limit(cfg)
    chunk = cfg.ssd_chunk_size
    n_out = cfg.warmup_max_tokens

    def clamp(n: int) -> int:
        return max(1, min(n, limit))

    sequential: list[WarmupPrompt] = []
    if cfg.warmup_prompt_lengths:
        for i, n in enumerate(cfg.warmup_prompt_lengths):
            sequential.append(WarmupPrompt("custom", prompt_tokens(clamp(n), seed=10 + i), n_out))
        base = max(sequential, key=lambda p: len(p.tokens))
    else:
        long_len = 4 * chunk + 13
        if cfg.max_num_batched_tokens is not None:
            long_len = max(long_len, cfg.max_num_batched_tokens + chunk + 13)
        sequential.append(WarmupPrompt("short", prompt_tokens(clamp(SHORT_LENGTH), seed=1), n_out))
        base = WarmupPrompt("chunked", prompt_tokens(clamp(2 * chunk + 17), seed=2), n_out)
        sequential.append(base)
        sequential.append(WarmupPrompt("long", prompt_tokens(clamp(long_len), seed=3), n_out))
    extra = prompt_tokens(chunk + 5, seed=4)
    continued = (base.tokens + extra)[: max(limit, len(base.tokens))]
    sequential.append(WarmupPrompt("continuation", continued, n_out))
    short = clamp(SHORT_LENGTH)
    sequential.append(WarmupPrompt("logprobs", prompt_tokens(short, seed=5), n_out, LOGPROBS_FIELDS))
    sequential.append(WarmupPrompt("sampled", prompt_tokens(short, seed=6), n_out, SAMPLED_FIELDS))

    lengths = [clamp(SHORT_LENGTH), clamp(2 * chunk + 17)]
    concurrent = tuple(
        WarmupPrompt("concurrent", prompt_tokens(clamp(lengths[i % 2] + i), seed=100 + i), n_out)
        for i in range(cfg.warmup_concurrency)
    )
    shapes = tuple(WarmupPrompt("shape", prompt_tokens(n, seed=200 + i), 2) for i, n in enumerate(shape_lengths(limit)))
    batch = tuple(
        WarmupPrompt("batch", prompt_tokens(clamp(SHORT_LENGTH + 3 * i), seed=300 + i), n_out)
        for i in range(BATCH_CLASS_SIZE)
    )
    split = tuple(
        WarmupPrompt("split", prompt_tokens(n, seed=400 + i), n_out)
        for i, n in enumerate(split_lengths(limit, cfg.max_num_batched_tokens))
    )
    return WarmupPlan(tuple(sequential), concurrent, cfg.warmup_pair_check, shapes, batch, split)


def completion_body(cfg: RuntimeConfig, prompt: WarmupPrompt, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": cfg.served_model_name,
        "prompt": list(prompt.tokens),
        "max_tokens": prompt.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": False,
    }
    body.update(prompt.sampling)
    body.update(overrides)
    return body


def resolve_prefill(service: str, port: int) -> list[tuple[str, int]]:
    """Ready prefill pods behind the headless Service: one (ip, port) per address, sorted, deduplicated."""
    try:
        infos = socket.getaddrinfo(service, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({(str(info[4][0]), port) for info in infos})


class Warmup:
    """One warmup run against the local vLLM; owns the deadline, metrics and logs."""

    def __init__(
        self,
        cfg: RuntimeConfig,
        state: RuntimeState,
        stop: threading.Event | None = None,
        resolver: Resolver = resolve_prefill,
        *,
        identity: IdentityFetch = fetch_identity,
        on_broken: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.state = state
        self.stop = stop or threading.Event()
        self.resolver = resolver
        self.local = base_url(cfg.vllm_host, cfg.vllm_port)
        self.deadline = float("inf")
        self.monitor: PairMonitor | None = None
        if cfg.warmup_pair_check:
            checker = PairChecker(cfg, state, prompt_limit(cfg), self.remaining)
            self.monitor = PairMonitor(
                cfg, state, checker, self.stop, resolver=resolver, identity=identity, on_broken=on_broken
            )

    # --- helpers --------------------------------------------------------------------------------------------------
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _send(
        self, url: str, kind: str, body: dict[str, Any], request_id: str, target: str
    ) -> tuple[Response | None, str | None]:
        """POST one completion, log one JSON line, count it. Returns (response, error)."""
        timeout = self.remaining()
        if timeout <= 0:
            return None, "warmup deadline reached"
        t0 = time.monotonic()
        resp: Response | None = None
        error: str | None = None
        try:
            resp = request("POST", url + "/v1/completions", body, {"X-Request-Id": request_id}, timeout=timeout)
            if resp.status != 200:
                error = f"HTTP {resp.status}: {str(resp.body)[:300]}"
        except RequestError as e:
            # cut short by the deadline: "...deadline reached" lets the retry loop keep the earlier cause, if any
            error = str(e) if self.remaining() > 0 else f"{e}; warmup deadline reached"
        seconds = time.monotonic() - t0
        outcome = "ok" if error is None else "error"
        m = self.state.metrics
        m.warmup_requests.labels(kind=kind, outcome=outcome).inc()
        m.warmup_request_seconds.labels(kind=kind).observe(seconds)
        log_event(
            "warmup_request",
            level="info" if error is None else "warning",
            kind=kind,
            target=target,
            request_id=request_id,
            prompt_tokens=len(body["prompt"]),
            max_tokens=body["max_tokens"],
            status=resp.status if resp is not None else None,
            seconds=round(seconds, 4),
            outcome=outcome,
            **({"error": error} if error else {}),
        )
        return resp, error

    def _local(self, prompt: WarmupPrompt) -> None:
        rid = f"hpd-warmup-{prompt.kind}-{uuid.uuid4().hex[:12]}"
        resp, error = self._send(self.local, prompt.kind, completion_body(self.cfg, prompt), rid, "local")
        if error is not None:
            permanent = resp is not None and 400 <= resp.status < 500
            raise WarmupError(f"{prompt.kind} request ({len(prompt.tokens)} tokens) failed: {error}", permanent)

    # --- phases ---------------------------------------------------------------------------------------------------
    def wait_for_health(self, give_up: float | None = None) -> bool:
        """Poll vLLM /health until 200; False if stopped (child exited) or `give_up` (monotonic) passed."""
        self.state.set_phase("starting", f"waiting for vLLM {self.local}/health")
        while not self.stop.is_set():
            if health_status(self.cfg.vllm_host, self.cfg.vllm_port) == 200:
                return True
            if give_up is not None and time.monotonic() > give_up:
                return False
            self.stop.wait(HEALTH_POLL_SECONDS)
        return False

    def _at_once(self, prompts: Sequence[WarmupPrompt]) -> None:
        if not prompts:
            return
        with concurrent.futures.ThreadPoolExecutor(len(prompts), thread_name_prefix="hpd-warmup") as ex:
            futures = [ex.submit(self._local, p) for p in prompts]
            errors = [f.exception() for f in futures]
        for err in errors:
            if err is not None:
                raise err

    def local_phase(self, plan: WarmupPlan) -> None:
        for prompt in plan.sequential:
            self._local(prompt)
        self._at_once(plan.concurrent)
        for prompt in plan.shapes:
            self._local(prompt)
        self._at_once(plan.batch)
        self._at_once(plan.split)

    def pair_check(self) -> str:
        """The output-verified pair check against every Ready prefill peer; returns the peers checked.

        Raises WarmupError (retried) when the pair cannot be exercised; a verdict (match or not) is recorded in
        the state by the monitor (a mismatch keeps the pod not ready with the reason, it is not retried here)."""
        service = self.cfg.prefill_service
        assert service is not None and self.monitor is not None
        targets = self.resolver(service, self.cfg.prefill_port)
        if not targets:
            raise WarmupError(f"no Ready prefill pod behind {service} (DNS returned no address)")
        for host, port in targets:
            try:
                result = self.monitor.checker.check(host, port)
            except PairTransportError as e:  # a 4xx is a configuration error: retrying cannot help
                raise WarmupError(f"pair check with prefill {host}:{port}: {e}", permanent="HTTP 4" in str(e)) from e
            self.monitor.record(host, port, result)
        return ", ".join(f"{h}:{p}" for h, p in targets)

    def _retry(self, step: Callable[[], Any], what: str) -> Any:
        attempt = 0
        last: WarmupError | None = None
        while True:
            try:
                return step()
            except WarmupError as e:
                if e.permanent:
                    raise
                if last is None or not str(e).endswith("deadline reached"):
                    last = e  # "deadline reached" says nothing about why the earlier attempts failed
                wait = RETRY_BACKOFF_SECONDS[min(attempt, len(RETRY_BACKOFF_SECONDS) - 1)]
                if self.remaining() <= wait or self.stop.is_set():
                    raise WarmupError(
                        f"timed out after {self.cfg.warmup_timeout_seconds:g} s; last error: {last}"
                    ) from e
                log_event("warmup_retry", level="warning", step=what, attempt=attempt + 1, wait_s=wait, error=str(e))
                self.state.set_phase("warming", f"{what} retrying: {e}")
                attempt += 1
                if self.stop.wait(wait):
                    raise WarmupError("stopped") from e

    def run(self, health_give_up: float | None = None) -> bool:
        """Wait for health, warm up, mark the state warm or failed. Returns success."""
        if not self.wait_for_health(health_give_up):
            reason = "vLLM exited before /health" if self.stop.is_set() else "vLLM /health never returned 200"
            self.state.mark_failed(reason)
            log_event("warmup_failed", level="error", reason=reason)
            return False
        if not self.cfg.warmup_enabled:
            log_event("warmup_disabled")
            self.state.mark_warm("warmup disabled")
            return True
        t0 = time.monotonic()
        self.deadline = t0 + self.cfg.warmup_timeout_seconds
        plan = plan_warmup(self.cfg)
        log_event(
            "warmup_started",
            role=self.cfg.role,
            model=self.cfg.served_model_name,
            timeout_s=self.cfg.warmup_timeout_seconds,
            lengths=[len(p.tokens) for p in plan.sequential],
            concurrent=len(plan.concurrent),
            shape_lengths=[len(p.tokens) for p in plan.shapes],
            batch=len(plan.batch),
            split=[len(p.tokens) for p in plan.split],
            pair_check=plan.pair,
        )
        self.state.set_phase("warming", "sending warmup requests")
        try:
            self._retry(lambda: self.local_phase(plan), "local warmup")
            prefill = None
            if plan.pair:
                self.state.set_phase("warming", "pair check")
                prefill = self._retry(self.pair_check, "pair check")
        except WarmupError as e:
            took = time.monotonic() - t0
            self.state.metrics.warmup_duration.set(took)
            reason = f"{e}"
            self.state.mark_failed(reason)
            log_event("warmup_failed", level="error", reason=reason, seconds=round(took, 3))
            return False
        took = time.monotonic() - t0
        self.state.metrics.warmup_duration.set(took)
        log_event("warmup_finished", seconds=round(took, 3), pair_prefill=prefill,
                  pair_fault=self.state.pair_fault())  # fmt: skip
        # The warmup's deadline bounds the warmup only: the monitor's re-checks and canaries after it are bounded per
        # request (pairing.REQUEST_TIMEOUT_SECONDS). Left in place, every re-check once the warmup timeout had
        # passed since start ended "deadline reached" and decode stopped following its prefill.
        self.deadline = float("inf")
        self.state.mark_warm()
        return True

    def remind_not_ready(self) -> None:
        """After a failure: repeat why the pod is not ready, once a minute, until stopped."""
        while not self.stop.wait(NOT_READY_REMINDER_SECONDS):
            phase, reason = self.state.snapshot()
            log_event("not_ready", level="error", phase=phase, reason=reason)


def start_warmup_thread(
    cfg: RuntimeConfig,
    state: RuntimeState,
    stop: threading.Event,
    resolver: Resolver = resolve_prefill,
    *,
    identity: IdentityFetch = fetch_identity,
    on_broken: Callable[[str], None] | None = None,
) -> threading.Thread:
    """The warmup; then, on decode with the pair check, the pair monitor (decode follows prefill)."""

    def target() -> None:
        w = Warmup(cfg, state, stop, resolver, identity=identity, on_broken=on_broken)
        try:
            ok = w.run()
        except Exception as e:  # a bug here must not leave a silent, never-ready pod
            state.mark_failed(f"warmup crashed: {e!r}")
            log_event("warmup_failed", level="error", reason=f"warmup crashed: {e!r}")
            ok = False
        if not ok:
            w.remind_not_ready()
        elif w.monitor is not None:
            w.deadline = float("inf")  # re-checks are bounded per request (pairing.REQUEST_TIMEOUT_SECONDS)
            w.monitor.run()

    t = threading.Thread(target=target, name="hpd-warmup", daemon=True)
    t.start()
    return t


def describe_plan(plan: WarmupPlan) -> Sequence[tuple[str, int]]:
    """(kind, prompt length) of every request in the plan, for logs and tests."""
    return [(p.kind, len(p.tokens)) for p in plan.sequential + plan.concurrent + plan.shapes + plan.batch + plan.split]
