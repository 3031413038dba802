"""`drain`: the engine container's preStop hook, so that a pod leaving (scale-down, rollout, eviction) finishes
its work instead of failing it. The kubelet runs it before SIGTERM and counts it against the pod's
terminationGracePeriodSeconds (the builder sizes that: propagation + 2 x drain timeout + a margin).

1. `POST /drain` to this pod's runtime: /readyz answers 503 "draining" from now on, so the pod leaves the headless
   Services (decode stops pair-checking a leaving prefill) and stays out of rotation.
2. Wait HPD_DRAIN_PROPAGATION_SECONDS: vllm-router's pod watch drops a pod on the event that sets its
   deletionTimestamp (while the pod still reads Ready, so the router's own bookkeeping finds it; router#279 is
   about pods that turn NotReady *without* being deleted), and a request it routed just before still arrives.
3. Wait, at most HPD_DRAIN_TIMEOUT_SECONDS, until vLLM's /metrics show no running and no waiting request, and on
   prefill also no KV cache in use: vLLM 0.20's own shutdown counts only scheduled requests, not the KV blocks a
   finished prefill keeps for decode's NIXL read, so a prefill that exits at once breaks a decode that has not
   pulled its KV yet (the request fails, or is recomputed with loadFailurePolicy recompute).
Then it returns and SIGTERM reaches vLLM, which the operator runs with `--shutdown-timeout` (vLLM 0.20 aborts every
in-flight request on SIGTERM without it): anything still running gets that long again.

Pure part: `busy` (what in vLLM's exposition still counts as work).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from hpd_runtime import contract as c
from hpd_runtime.http_client import RequestError, base_url, request
from hpd_runtime.log import log_event

WORK_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
HELD_KV_SERIES = "vllm:kv_cache_usage_perc"
POLL_SECONDS = 0.5


def _samples(text: str, name: str) -> list[float]:
    out = []
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            try:
                out.append(float(line.rsplit(" ", 1)[1]))
            except (IndexError, ValueError):
                continue
    return out


def busy(metrics_text: str, role: str) -> str | None:
    """What vLLM still works on (None: idle), from its /metrics text: running or waiting requests; on prefill also
    KV cache in use (blocks held for decode's pull)."""
    work = {name: sum(_samples(metrics_text, name)) for name in WORK_SERIES}
    parts = [f"{name.split(':')[1]}={value:g}" for name, value in work.items() if value > 0]
    if role == "prefill":
        held = sum(_samples(metrics_text, HELD_KV_SERIES))
        if held > 0:
            parts.append(f"kv_cache_usage={held:.3g} (KV not yet pulled by decode)")
    return ", ".join(parts) or None


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name, "").strip() or default)
    except ValueError:
        return default


def _vllm_metrics(host: str, port: int) -> str | None:
    try:
        resp = request("GET", base_url(host, port) + c.PATH_METRICS, timeout=2.0)
    except RequestError:
        return None
    return resp.body if resp.status == 200 and isinstance(resp.body, str) else None


def _runtime_host(env: Mapping[str, str]) -> str:
    """Where the runtime listens, seen from inside the pod: its own address when it binds one (HPD_RUNTIME_HOST),
    else loopback. The runtime accepts the drain only from a loopback address (readiness.from_inside_the_pod)."""
    host = env.get(c.ENV_RUNTIME_HOST, "").strip()
    return host if host and host not in ("0.0.0.0", "::") else "127.0.0.1"


def drain(env: Mapping[str, str], sleep: Callable[[float], None] = time.sleep) -> int:
    """The preStop (see the module doc). Always exits 0: a failed hook would not stop the kubelet's SIGTERM."""
    runtime_port = int(_number(env, c.ENV_RUNTIME_PORT, c.RUNTIME_PORT))
    vllm_host = env.get(c.ENV_VLLM_HOST, "").strip() or "127.0.0.1"
    vllm_port = int(_number(env, c.ENV_VLLM_PORT, c.VLLM_PORT))
    role = env.get(c.ENV_ROLE, "").strip() or "decode"
    timeout = _number(env, c.ENV_DRAIN_TIMEOUT_SECONDS, c.DRAIN_TIMEOUT_SECONDS_DEFAULT)
    propagation = _number(env, c.ENV_DRAIN_PROPAGATION_SECONDS, c.DRAIN_PROPAGATION_SECONDS_DEFAULT)
    t0 = time.monotonic()
    try:
        request("POST", base_url(_runtime_host(env), runtime_port) + c.PATH_DRAIN, {}, timeout=2.0)
    except RequestError as e:
        log_event("drain_mark_failed", level="warning", error=str(e))
    log_event("drain_started", role=role, propagation_seconds=propagation, timeout_seconds=timeout)
    sleep(propagation)
    deadline = time.monotonic() + timeout
    last: str | None = "unknown"
    while time.monotonic() < deadline:
        text = _vllm_metrics(vllm_host, vllm_port)
        if text is None:  # vLLM is gone or not answering: nothing left to wait for here
            last = None
            break
        last = busy(text, role)
        if last is None:
            break
        sleep(POLL_SECONDS)
    seconds = round(time.monotonic() - t0, 3)
    if last is None:
        log_event("drain_done", role=role, seconds=seconds)
    else:
        log_event("drain_timeout", level="warning", role=role, seconds=seconds, still=last)
    return 0
