"""A prefill or decode that dies under traffic leaves the router's choice through the health-check flags the operator
renders (hpd_operator.builders.router.failover_args): the real vllm-router 0.1.17 binary in P/D mode in front of
vLLM stand-ins (loopback only), one engine of a role of two SIGKILLed while clients keep sending.

What vllm-router 0.1.17 does in P/D mode bounds what can be asserted: it retries no request on another engine and its
circuit breaker does not take the dead engine out (hpd_operator.builders.router.HEALTH_CHECK_INTERVAL_SECONDS), so
the requests it sends to the dead engine between the crash and its health checker's verdict fail. Asserted: the
router's own view marks the dead engine unhealthy (which, with the parser's defaults of 60 s x 3, it would not do
within the wait), and from then on every request succeeds; the failed requests are counted and printed."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpd_operator.builders.router import failover_args
from hpd_runtime.config import load_config
from hpd_runtime.readiness import RuntimeMetrics, RuntimeState, evaluate_readiness

from .conftest import LOOPBACK, Fake, free_port, get_json, http, wait_until

ROUTER = Path(sys.executable).with_name("vllm-router")
CLIENTS = 4
MAX_REQUESTS = 2000
"""Bounds the traffic in count (each client stops at its share or when told, whichever comes first)."""
AFTER_VERDICT = 40
"""Requests sent once the router marked the dead engine unhealthy: every one must succeed."""
BODY = {"model": "fake-model", "prompt": list(range(3, 20)), "max_tokens": 4}


@dataclass
class Traffic:
    """Clients looping on the router; each result is (phase at send, status)."""

    url: str
    phase: list[str] = field(default_factory=lambda: ["before"])
    results: list[tuple[str, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> None:
        for _ in range(MAX_REQUESTS // CLIENTS):
            if self.stop.is_set():
                return
            phase = self.phase[0]
            status, _ = http("POST", self.url + "/v1/completions", BODY, timeout=30)
            with self.lock:
                self.results.append((phase, status))

    def count(self, phase: str, ok: bool | None = None) -> int:
        with self.lock:
            return sum(1 for p, s in self.results if p == phase and (ok is None or (s == 200) == ok))


def _start_router(prefills: list[Fake], decodes: list[Fake]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [str(ROUTER), "--vllm-pd-disaggregation", "--host", LOOPBACK, "--port", str(port), "--policy", "round_robin",
            "--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port()), "--health-check-endpoint", "/health"]  # fmt: skip
    for p in prefills:
        argv += ["--prefill", p.url]
    for d in decodes:
        argv += ["--decode", d.url]
    argv += failover_args()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{LOOPBACK}:{port}"
    wait_until(lambda: http("GET", url + "/health")[0] == 200, timeout=60, what="router /health")
    return proc, url


def _healthy(url: str, role: str) -> int:
    status, _ = http("GET", url + "/readiness")
    return int(get_json(url + "/readiness")[role]["healthy"]) if status == 200 else 0


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_dead_engine_of_two_leaves_the_routers_choice_and_new_requests_succeed(
    role: str, start_fake: Callable[..., Fake]
) -> None:
    assert ROUTER.exists(), f"vllm-router is not installed next to {sys.executable} (pip install vllm-router)"
    slow = ("--completion-delay", "0.05")  # requests are in flight on the engine when it dies
    prefills = [start_fake(*slow) for _ in range(2 if role == "prefill" else 1)]
    decodes = [start_fake(*slow) for _ in range(2 if role == "decode" else 1)]
    victim = (prefills if role == "prefill" else decodes)[0]
    proc, url = _start_router(prefills, decodes)
    traffic = Traffic(url)
    clients = [threading.Thread(target=traffic._client) for _ in range(CLIENTS)]
    try:
        wait_until(lambda: _healthy(url, role) == 2, timeout=30, what=f"router sees 2 healthy {role}s")
        for c in clients:
            c.start()
        wait_until(lambda: traffic.count("before", ok=True) >= 40, timeout=60, what="traffic flowing")
        traffic.phase[0] = "window"
        victim.proc.kill()
        victim.proc.wait(10)
        # the router's verdict: its health checker marked the dead engine unhealthy (the parser's default flags
        # would take 120-180 s; this wait gives up long before)
        wait_until(lambda: _healthy(url, role) == 1, timeout=15, interval=0.1, what=f"router drops the dead {role}")
        traffic.phase[0] = "after"
        wait_until(lambda: traffic.count("after") >= AFTER_VERDICT, timeout=60, what="traffic after the verdict")
    finally:
        traffic.stop.set()
        for c in clients:
            if c.is_alive():
                c.join(60)
        proc.terminate()
        proc.wait(10)
    counts = {p: (traffic.count(p), traffic.count(p, ok=False)) for p in ("before", "window", "after")}
    print(f"\n{role} killed, (requests, failed) by phase: {counts}")
    # sent before the kill and failed: at most the requests in flight on it (each client has one at a time)
    assert counts["before"][1] <= CLIENTS, counts
    assert counts["after"][0] >= AFTER_VERDICT and counts["after"][1] == 0, counts


def test_readiness_fails_as_soon_as_the_supervised_vllm_exits(start_fake: Callable[..., Fake]) -> None:
    """Not Ready the moment the launcher's child is gone, even while something still answers on vLLM's port (here
    the stand-in, alive: the verdict comes from the process, not from a health request that could hang)."""
    vllm = start_fake()
    alive = [True]
    state = RuntimeState(RuntimeMetrics(), child_alive=lambda: alive[0])
    state.mark_warm()
    cfg = load_config({"HPD_VLLM_HOST": LOOPBACK, "HPD_VLLM_PORT": str(vllm.port)})
    assert evaluate_readiness(state, cfg) == (True, "ok")
    alive[0] = False
    assert evaluate_readiness(state, cfg) == (False, "vLLM process exited")
    assert state.metrics.registry.get_sample_value("hpd_runtime_ready") == 0
