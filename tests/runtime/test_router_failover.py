"""A prefill or decode that dies under traffic costs at most the requests in flight on it: the real vllm-router 0.1.17
binary in P/D mode in front of vLLM stand-ins (loopback only), behind the router pod's retry proxy as the operator
renders it (HAProxy with images/router/retry.cfg and spec.router.retries' default), one engine of a role of two
SIGKILLed while clients keep sending.

vllm-router 0.1.17 retries nothing in P/D mode and keeps the dead engine in its choice until its health checker's
verdict (the flags of hpd_operator.builders.router.failover_args), so a request it sends there in that window is
answered 500 at once; the proxy sends it to the router again, which picks again. As many clients again go to a
second router over the same engines with no proxy in front, over the same kill: their failures show the window was
there (else the proxy's count proves nothing); the proxy's clients may lose only what was in flight at the kill,
and every request after the verdict succeeds either way. Each router has its own process (its own round-robin
counter and health checker), so the two sets of clients do not change each other's picks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from hpd_operator.api import constants
from hpd_operator.builders.router import failover_args
from hpd_runtime import contract
from hpd_runtime.config import load_config
from hpd_runtime.readiness import RuntimeMetrics, RuntimeState, evaluate_readiness

from .conftest import LOOPBACK, Fake, free_port, get_json, http, wait_until

ROUTER = Path(sys.executable).with_name("vllm-router")
RETRY_CONFIG = Path(__file__).resolve().parents[2] / "images/router/retry.cfg"
CLIENTS = 4
"""Through the retry proxy; as many again go to the router directly."""
MAX_REQUESTS = 2000
"""Bounds each set of clients' traffic in count (each client stops at its share or when told)."""
AFTER_VERDICT = 40
"""Requests sent once the router marked the dead engine unhealthy: every one must succeed."""
BODY = {"model": "fake-model", "prompt": list(range(3, 20)), "max_tokens": 4}


@dataclass
class Traffic:
    """Clients looping on one URL; each result is (phase at send, status)."""

    url: str
    phase: list[str]
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

    def count(self, phase: str | None = None, ok: bool | None = None) -> int:
        with self.lock:
            return sum(1 for p, s in self.results if phase in (None, p) and (ok is None or (s == 200) == ok))

    def by_phase(self) -> dict[str, tuple[int, int]]:
        return {p: (self.count(p), self.count(p, ok=False)) for p in ("before", "window", "after")}


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


@pytest.fixture()
def retry_proxy(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """start(router_url) -> the proxy's URL: Debian's haproxy with the router image's retry.cfg and the environment
    the operator renders (builders.router._retry_container), the router on loopback behind it."""
    exe = shutil.which("haproxy")
    assert exe, "haproxy is not installed (hack/real-node-tools.sh: apt-get install haproxy)"
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []

    def start(router_url: str) -> str:
        port = free_port()
        env = {**os.environ, contract.ENV_RETRY_PORT: str(port), contract.ENV_RETRY_ROUTER_PORT:
               router_url.rsplit(":", 1)[1], contract.ENV_RETRY_HOLD_PORT: str(free_port()),
               contract.ENV_RETRIES: str(constants.DEFAULT_ROUTER_RETRIES)}  # fmt: skip
        log = (tmp_path / f"haproxy-{len(procs)}.log").open("wb")  # one per proxy: a second would truncate the first's
        logs.append(log)
        procs.append(subprocess.Popen([exe, "-db", "-f", str(RETRY_CONFIG)], env=env, stdout=log, stderr=log))
        url = f"http://{LOOPBACK}:{port}"
        wait_until(lambda: http("GET", url + contract.PATH_RETRY_HEALTH)[0] == 200, timeout=30, what="retry proxy")
        return url

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)
    for f in logs:
        f.close()


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_dead_engine_of_two_costs_at_most_its_requests_in_flight_behind_the_retry_proxy(
    role: str, start_fake: Callable[..., Fake], retry_proxy: Callable[[str], str]
) -> None:
    assert ROUTER.exists(), f"vllm-router is not installed next to {sys.executable} (pip install vllm-router)"
    slow = ("--completion-delay", "0.05")  # requests are in flight on the engine when it dies
    prefills = [start_fake(*slow) for _ in range(2 if role == "prefill" else 1)]
    decodes = [start_fake(*slow) for _ in range(2 if role == "decode" else 1)]
    victim = (prefills if role == "prefill" else decodes)[0]
    routers = [_start_router(prefills, decodes) for _ in range(2)]
    urls = [url for _, url in routers]
    phase = ["before"]
    proxied, direct = Traffic(retry_proxy(urls[0]), phase), Traffic(urls[1], phase)
    clients = [threading.Thread(target=t._client) for t in (proxied, direct) for _ in range(CLIENTS)]
    try:
        wait_until(lambda: all(_healthy(u, role) == 2 for u in urls), timeout=30, what=f"routers see 2 healthy {role}s")
        for c in clients:
            c.start()
        wait_until(lambda: proxied.count("before", ok=True) >= 40, timeout=60, what="traffic flowing")
        phase[0] = "window"
        victim.proc.kill()
        victim.proc.wait(10)
        # the routers' verdict: their health checkers marked the dead engine unhealthy (the parser's default flags
        # would take 120-180 s; this wait gives up long before)
        wait_until(lambda: all(_healthy(u, role) == 1 for u in urls), timeout=15, interval=0.1,
                   what=f"routers drop the dead {role}")  # fmt: skip
        phase[0] = "after"
        wait_until(lambda: proxied.count("after") >= AFTER_VERDICT, timeout=60, what="traffic after the verdict")
    finally:
        for t in (proxied, direct):
            t.stop.set()
        for c in clients:
            if c.is_alive():
                c.join(60)
        for proc, _ in routers:
            proc.terminate()
            proc.wait(10)
    counts = {"through the retry proxy": proxied.by_phase(), "to the router directly": direct.by_phase()}
    print(f"\n{role} killed, (requests, failed) by phase: {counts}")
    # the window was real: requests sent straight to the router in it failed
    assert direct.count("window", ok=False) > 0, counts
    # through the proxy: at most the requests in flight on the dead engine at the kill (one per client at a time)
    assert proxied.count(ok=False) <= CLIENTS, counts
    for t in (proxied, direct):
        assert t.count("after") >= 1 and t.count("after", ok=False) == 0, counts


def _healthy(url: str, role: str) -> int:
    status, _ = http("GET", url + "/readiness")
    return int(get_json(url + "/readiness")[role]["healthy"]) if status == 200 else 0


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
