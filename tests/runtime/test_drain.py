"""Scale-down that drains (#28): engine pods leave as the kubelet makes them leave, behind the real vllm-router, with
requests in flight, and none fails.

Each engine is our launcher running the vLLM stand-in (fake_vllm.py, which follows vLLM 0.20's shutdown: on SIGTERM
`--shutdown-timeout 0` aborts every in-flight request, N > 0 serves no new request and finishes the running ones).
What the operator renders is taken from its builders, not re-typed: the preStop command, the drain env and vLLM's
`--shutdown-timeout`. A pod leaves as the kubelet does it: the preStop to its end, then SIGTERM to the container. The
router drops the pod when its watch sees the deletion (vllm-router's Kubernetes discovery removes a pod on the event
that sets its deletionTimestamp: src/service_discovery.rs, `handle_pod_deletion`); here the router runs with static
workers, so the test calls the router's own `/remove_worker` a watch latency after the "deletion" instead.

- decode under continuous traffic: fails without the preStop (SIGTERM at once: requests the router still sends in
  the watch latency meet a vLLM that is shutting down);
- prefill holding KV that decode has not pulled yet: fails without the preStop's KV wait (vLLM's own drain counts
  only scheduled requests: the prefill would exit and decode's KV read fail);
- SIGTERM with requests in flight: fails without `--shutdown-timeout` (vLLM 0.20 aborts them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_devcluster.testing import kill_with_children
from hpd_operator.render import render
from hpd_runtime import contract as c

from .conftest import FAKE_VLLM, LOOPBACK, free_port, http, wait_until

ROUTER = Path(sys.executable).with_name("vllm-router")
WATCH_LATENCY = 1.0
"""Seconds between a pod's deletion and the router dropping it (its watch event); the test's preStop propagation
wait is 2 s (the rendered 5 s in production)."""
PROPAGATION = "2"
CR = {
    "apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment", "metadata": {"name": "drain", "namespace": "d"},
    "spec": {"model": {"name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"}, "drainTimeoutSeconds": 30},
}  # fmt: skip


def rendered_engine(role: str) -> dict[str, Any]:
    """The operator's engine container and pod spec for `role`, as `render` prints them."""
    for obj in render([CR]):
        labels = obj["metadata"]["labels"]
        if obj["kind"] == "Deployment" and labels.get(c.LABEL_COMPONENT) == role:  # drain-<role>-<hash>
            pod = obj["spec"]["template"]["spec"]
            return {"pod": pod, "container": pod["containers"][0]}
    raise AssertionError(role)


def _rendered_flag(container: dict[str, Any], flag: str) -> list[str]:
    args = container["args"]
    return [flag, args[args.index(flag) + 1]] if flag in args else []


class Engine:
    """One engine pod: our launcher running the stand-in, with the operator's drain settings."""

    def __init__(self, role: str, tmp: Path, *fake_args: str) -> None:
        self.role = role
        self.rendered = rendered_engine(role)
        ct = self.rendered["container"]
        self.vllm_port, runtime_port = free_port(), free_port()
        self.url = f"http://{LOOPBACK}:{self.vllm_port}"
        drain_env = {e["name"]: e["value"] for e in ct["env"] if e["name"].startswith("HPD_DRAIN_")}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("HPD_")},
            **drain_env,
            c.ENV_DRAIN_PROPAGATION_SECONDS: PROPAGATION,
            c.ENV_ROLE: role, c.ENV_MODEL: "fake-model", c.ENV_VLLM_VERSION: "0.20.0", c.ENV_GPU_PRODUCT: "x",
            c.ENV_VLLM_PORT: str(self.vllm_port), c.ENV_VLLM_HOST: LOOPBACK, c.ENV_RUNTIME_PORT: str(runtime_port),
            c.ENV_RUNTIME_HOST: LOOPBACK, c.ENV_CACHE_DIR: str(tmp / "cache"), c.ENV_WARMUP_ENABLED: "false",
            c.ENV_VLLM_COMMAND: f"{sys.executable} {FAKE_VLLM}",
        }  # fmt: skip
        kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else
                         "kv_consumer"})  # fmt: skip
        args = ["fake-model", "--port", str(self.vllm_port), "--kv-transfer-config", kv,
                *_rendered_flag(ct, "--shutdown-timeout"), *fake_args]  # fmt: skip
        self.log = tmp / f"{role}-{self.vllm_port}.log"
        with self.log.open("wb") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "hpd_runtime", "launch", "--", *args], env=self.env,
                                         stdout=f, stderr=f)  # fmt: skip
        wait_until(lambda: http("GET", self.url + "/health", timeout=1)[0] == 200, 30, what=f"{role} up")

    def leave(self, after_deletion: Callable[[], None]) -> float:
        """Leave as the kubelet makes a deleted pod leave: the rendered preStop to its end, then SIGTERM; the
        router drops the pod `WATCH_LATENCY` after the deletion. Returns the seconds until the container exited."""
        t0 = time.monotonic()
        threading.Timer(WATCH_LATENCY, after_deletion).start()
        grace = self.rendered["pod"]["terminationGracePeriodSeconds"]
        pre_stop = ((self.rendered["container"].get("lifecycle") or {}).get("preStop") or {}).get("exec")
        if pre_stop is not None:
            argv = [sys.executable if a == "python3" else a for a in pre_stop["command"]]  # the image's python3
            subprocess.run(argv, env=self.env, timeout=grace, check=False, capture_output=True)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=max(grace - (time.monotonic() - t0), 1))
        return time.monotonic() - t0

    def stop(self) -> None:
        """SIGKILL the launcher and the vLLM it runs in a session of its own (launcher.py)."""
        if self.proc.poll() is None:
            kill_with_children(self.proc)


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    started: list[Engine] = []

    def start(role: str, *fake_args: str) -> Engine:
        e = Engine(role, tmp_path, *fake_args)
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


@pytest.fixture
def router() -> Iterator[Callable[..., str]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(prefills: list[Engine], decodes: list[Engine]) -> str:
        assert ROUTER.exists(), f"vllm-router is not installed next to {sys.executable}"
        port = free_port()
        argv = [
            str(ROUTER),
            "--vllm-pd-disaggregation",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--prometheus-host",
            LOOPBACK,
            "--prometheus-port",
            str(free_port()),
            "--policy",
            "round_robin",
        ]
        for p in prefills:
            argv += ["--prefill", p.url]
        for d in decodes:
            argv += ["--decode", d.url]  # fmt: skip
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        url = f"http://{LOOPBACK}:{port}"
        wait_until(lambda: http("GET", url + "/health")[0] == 200, timeout=60, what="router /health")
        return url

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def remove_worker(router_url: str, engine: Engine) -> Callable[[], None]:
    def call() -> None:
        status, text = http("POST", f"{router_url}/remove_worker?url={urllib.parse.quote(engine.url, safe='')}")
        assert status == 200, (status, text)

    return call


class Traffic:
    """Streaming completions through the router from `workers` threads until stopped; every outcome recorded."""

    def __init__(self, url: str, workers: int, max_tokens: int) -> None:
        self.url, self.max_tokens = url, max_tokens
        self.ok, self.errors = 0, []  # type: ignore[var-annotated]
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]
        for t in self.threads:
            t.start()

    def one(self) -> None:
        body = {"model": "fake-model", "prompt": list(range(3, 40)), "max_tokens": self.max_tokens, "stream": True}
        status, text = http("POST", self.url + "/v1/completions", body, timeout=60)
        complete = status == 200 and text.rstrip().endswith("data: [DONE]") and '"error"' not in text
        with self.lock:
            if complete:
                self.ok += 1
            else:
                self.errors.append((status, text[-300:]))

    def _run(self) -> None:
        while not self.done.is_set():
            self.one()

    def stop(self) -> tuple[int, list[tuple[int, str]]]:
        self.done.set()
        for t in self.threads:
            t.join(timeout=60)
        return self.ok, self.errors


def _running(engine: Engine) -> float:
    status, text = http("GET", engine.url + "/metrics")
    vals = [float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:num_requests_running{")]
    return sum(vals) if status == 200 else 0.0


def test_a_decode_leaving_under_traffic_fails_no_request(engines: Callable[..., Engine], router: Any) -> None:
    prefill = engines("prefill")
    d1, d2 = engines("decode", "--token-delay", "0.05"), engines("decode", "--token-delay", "0.05")
    url = router([prefill], [d1, d2])
    traffic = Traffic(url, workers=4, max_tokens=20)
    wait_until(lambda: _running(d2) > 0, 30, what="requests in flight on the leaving decode")
    took = d2.leave(remove_worker(url, d2))
    time.sleep(1.0)  # traffic goes on to the remaining decode
    ok, errors = traffic.stop()
    print(f"\ndecode drain: {ok} requests completed, {len(errors)} failed; the pod left in {took:.1f} s")
    assert not errors, errors[:3]
    assert ok >= 10 and d2.proc.returncode == 0


def test_a_prefill_leaving_keeps_the_kv_decode_has_not_pulled(engines: Callable[..., Engine], router: Any) -> None:
    p1, p2 = engines("prefill", "--hold-kv"), engines("prefill", "--hold-kv")
    decode = engines("decode", "--pull-kv-delay", "3")
    url = router([p1, p2], [decode])
    results: list[tuple[int, str]] = []

    def one() -> None:
        body = {"model": "fake-model", "prompt": list(range(3, 40)), "max_tokens": 4}
        results.append(http("POST", url + "/v1/completions", body, timeout=60))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: "vllm:kv_cache_usage_perc" in http("GET", p2.url + "/metrics")[1]
               and _kv_held(p2) > 0, 30, what="the leaving prefill holds KV decode has not pulled")  # fmt: skip
    took = p2.leave(remove_worker(url, p2))
    for t in threads:
        t.join(timeout=60)
    bad = [r for r in results if r[0] != 200]
    print(f"\nprefill drain: {len(results) - len(bad)}/{len(results)} requests completed; the pod left in {took:.1f} s")
    assert len(results) == 6 and not bad, bad[:3]


def _kv_held(engine: Engine) -> float:
    text = http("GET", engine.url + "/metrics")[1]
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:kv_cache_usage_perc{"))


def test_sigterm_finishes_the_requests_in_flight(engines: Callable[..., Engine]) -> None:
    """Without the preStop (its budget spent, or a request that came after it): vLLM's own --shutdown-timeout."""
    decode = engines("decode", "--token-delay", "0.1")
    traffic = Traffic(decode.url, workers=3, max_tokens=20)  # straight to the pod
    wait_until(lambda: _running(decode) >= 3, 30, what="three requests in flight")
    traffic.done.set()
    decode.proc.send_signal(signal.SIGTERM)
    ok, errors = traffic.stop()
    assert decode.proc.wait(timeout=60) == 0
    assert ok >= 3 and not errors, errors[:3]


def test_the_grace_period_covers_the_drain_and_the_shutdown_timeout() -> None:
    for role in c.ROLES:
        r = rendered_engine(role)
        env = {e["name"]: e.get("value") for e in r["container"]["env"]}
        budget = int(env[c.ENV_DRAIN_PROPAGATION_SECONDS]) + int(env[c.ENV_DRAIN_TIMEOUT_SECONDS])
        budget += int(_rendered_flag(r["container"], "--shutdown-timeout")[1])
        assert r["pod"]["terminationGracePeriodSeconds"] > budget
        assert r["container"]["lifecycle"]["preStop"]["exec"]["command"] == list(c.DRAIN_COMMAND)
    assert yaml.safe_dump(CR)


def test_busy_counts_running_waiting_and_on_prefill_the_kv_held_for_decode() -> None:
    from hpd_runtime.drain import busy

    text = (
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    )
    assert busy(text, "decode") is None  # decode's KV is its running requests' (none running)
    assert busy(text, "prefill") == "kv_cache_usage=0.25 (KV not yet pulled by decode)"
    assert busy(text.replace("running{engine=\"0\",model_name=\"m\"} 0.0", 'running{engine="0",model_name="m"} 2'),
                "decode") == "num_requests_running=2"  # fmt: skip


def test_only_the_pod_itself_may_mark_it_draining() -> None:
    """The runtime port is open to Prometheus' peer (a label any tenant can wear): a drain from another address would
    take the pod out of service, so only loopback (the preStop, inside the pod) may ask for it."""
    from hpd_runtime.readiness import RuntimeMetrics, RuntimeState, from_inside_the_pod, mark_draining

    assert all(from_inside_the_pod(a) for a in ("127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"))
    assert not any(from_inside_the_pod(a) for a in ("10.244.1.7", "192.168.0.3", "fd00::5", "::ffff:10.0.0.1", ""))
    state = RuntimeState(RuntimeMetrics())
    assert mark_draining(state, "10.244.1.7")[0] == 403 and not state.draining.is_set()
    assert mark_draining(state, "127.0.0.1")[0] == 200 and state.draining.is_set()
