"""A rollout under continuous traffic, with real processes on loopback (issue #29, docs/rollouts.md): the real
vllm-router (the binary the router image runs) in front of vLLM stand-ins that tag every answer with the generation of
the prefill that made its KV and of the decode that answered (tests/runtime/fake_vllm.py `--generation`).

What Kubernetes does is played here from the operator's own rendered manifests (`render` of the CR before and after
an image change), nothing re-typed:
- a "pod" is a stand-in process carrying the labels of its generation's rendered pod template;
- the router's discovery: each router process gets the URLs of the Ready "pods" its rendered `--prefill-selector` /
  `--decode-selector` select (vllm-router adds Ready pods that match; it cannot watch a real apiserver here);
- a headless Service's DNS: decode's rendered HPD_PREFILL_SERVICE resolves to the Ready pods its rendered selector
  selects, and decode is Ready only after the runtime's real pair check (hpd_runtime.warmup) passed against them;
- the `<cr>` Service: a loopback TCP proxy (kube-proxy) that sends each new connection to one of its endpoints;
- the router Deployment's rolling update, in the order the cluster test (tests/cluster/test_rollout.py) observes the
  operator and the Deployment controller take: the new router pod starts once the new generation is Ready, joins
  the endpoints when Ready; the old one leaves them, waits its preStop pause, gets SIGTERM and finishes what it
  has in flight; only then the old generation's engines are stopped.
Clients open a connection per request (a long streamed request is in flight across the old router's SIGTERM).
Every request must succeed and every answer must come from one generation."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.builders.router import PRESTOP_SECONDS
from hpd_operator.render import render
from hpd_runtime import contract as c
from hpd_runtime import warmup as w
from hpd_runtime.config import load_config
from hpd_runtime.readiness import RuntimeMetrics, RuntimeState, evaluate_readiness
from hpd_runtime.warmup import Warmup

from .conftest import LOOPBACK, REPO, Fake, free_port, http, wait_until

ROUTER = Path(sys.executable).with_name("vllm-router")
NS = "serving"
TOKEN_DELAY = 0.25
LONG_TOKENS = 40
"""A streamed request of LONG_TOKENS at TOKEN_DELAY (10 s) outlives the old router's preStop pause (5 s)."""


def rendered(image: str | None) -> dict[str, Any]:
    """kind -> name -> manifest the operator applies for the seed CR (in NS) with `image`."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "nemotron-3-nano.yaml").read_text())
    doc["metadata"]["namespace"] = NS
    if image:
        doc["spec"]["image"] = image
    out: dict[str, Any] = {}
    for m in render([doc]):
        out.setdefault(m["kind"], {})[m["metadata"]["name"]] = m
    return out


def selectors(args: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    role: str | None = None
    for a in args:
        if a.startswith("--"):
            role = {"--prefill-selector": "prefill", "--decode-selector": "decode"}.get(a)
            if role:
                out[role] = {}
        elif role:
            k, _, v = a.partition("=")
            out[role][k] = v
    return out


@dataclass
class Pod:
    fake: Fake
    labels: dict[str, str]
    ready: bool = False


@dataclass
class Generation:
    """One rendered generation: its pods (stand-ins), its decode's env, its Services' and router's selectors."""

    hash: str
    manifests: dict[str, Any]
    pods: list[Pod] = field(default_factory=list)

    def deployment(self, role: str) -> dict[str, Any]:
        (d,) = [
            m for m in self.manifests["Deployment"].values() if m["metadata"]["labels"].get(c.LABEL_COMPONENT) == role
        ]
        return d

    def router_selectors(self) -> dict[str, dict[str, str]]:
        r = self.deployment(c.COMPONENT_ROUTER)
        return selectors(r["spec"]["template"]["spec"]["containers"][0]["args"])


class Cluster:
    """The pods of every generation, the Services' DNS, the routers' discovery (see the module doc)."""

    def __init__(self, start_fake: Callable[..., Fake]) -> None:
        self.start_fake = start_fake
        self.gens: list[Generation] = []

    def start(self, gen: Generation, *extra: str) -> None:
        for role in c.ROLES:
            labels = dict(gen.deployment(role)["spec"]["template"]["metadata"]["labels"])
            args = ["--generation", gen.hash, *extra]
            if role == "decode":
                args += ["--enable-prompt-tokens-details", "--token-delay", str(TOKEN_DELAY)]
            gen.pods.append(Pod(self.start_fake(*args), labels, ready=role == "prefill"))
        self.gens.append(gen)

    def pods(self) -> list[Pod]:
        return [p for g in self.gens for p in g.pods]

    def select(self, sel: dict[str, str]) -> list[Pod]:
        """What a selector picks among the Ready pods (headless Service DNS, router discovery)."""
        return [p for p in self.pods() if p.ready and all(p.labels.get(k) == v for k, v in sel.items())]

    def resolve(self, service: str, port: int) -> list[tuple[str, int]]:
        """DNS of a rendered headless Service `<name>.<ns>.svc`: its selector's Ready pods."""
        name = service.split(".", maxsplit=1)[0]
        for g in self.gens:
            svc = g.manifests["Service"].get(name)
            if svc is not None:
                return [(LOOPBACK, p.fake.port) for p in self.select(svc["spec"]["selector"])]
        raise AssertionError(f"no rendered Service {name}")

    def pair_check(self, gen: Generation, service: str | None = None) -> tuple[bool, str]:
        """The decode runtime's warmup with its pair check against `service` (default: its rendered one)."""
        env = {
            e["name"]: e.get("value", "")
            for e in gen.deployment("decode")["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        (decode,) = [p for p in gen.pods if p.labels[c.LABEL_COMPONENT] == "decode"]
        cfg = load_config({
            c.ENV_ROLE: env[c.ENV_ROLE], c.ENV_WARMUP_PAIR_CHECK: env[c.ENV_WARMUP_PAIR_CHECK],
            c.ENV_PREFILL_SERVICE: service or env[c.ENV_PREFILL_SERVICE],
            c.ENV_VLLM_HOST: LOOPBACK, c.ENV_VLLM_PORT: str(decode.fake.port), c.ENV_MODEL: "fake-model",
            c.ENV_MAX_MODEL_LEN: "600", c.ENV_WARMUP_CONCURRENCY: "1", c.ENV_WARMUP_TIMEOUT_SECONDS: "60",
        })  # fmt: skip
        state = RuntimeState(RuntimeMetrics())
        Warmup(cfg, state, threading.Event(), self.resolve, identity=lambda h, p: "boot-1").run()
        ok, why = evaluate_readiness(state, cfg)
        if service is None:
            decode.ready = ok
        return ok, why


class Service:
    """The `<cr>` Service as kube-proxy makes it: each new connection goes to one current endpoint; connections
    already open stay where they are when an endpoint leaves."""

    def __init__(self) -> None:
        self.sock = socket.create_server((LOOPBACK, 0))
        self.port = self.sock.getsockname()[1]
        self.endpoints: list[int] = []
        self.lock = threading.Lock()
        self.turn = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, *ports: int) -> None:
        with self.lock:
            self.endpoints = list(ports)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.turn += 1
                port = self.endpoints[self.turn % len(self.endpoints)] if self.endpoints else None
            if port is None:
                conn.close()
                continue
            up = socket.create_connection((LOOPBACK, port))
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class Router:
    """A vllm-router process given the URLs its rendered selectors discover."""

    def __init__(self, cluster: Cluster, gen: Generation) -> None:
        sel = gen.router_selectors()
        urls = {role: [p.fake.url for p in cluster.select(sel[role])] for role in c.ROLES}
        assert all(urls.values()), urls
        self.port = free_port()
        argv = [str(ROUTER), "--vllm-pd-disaggregation", "--host", LOOPBACK, "--port", str(self.port),
                "--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port())]  # fmt: skip
        for u in urls["prefill"]:
            argv += ["--prefill", u]
        for u in urls["decode"]:
            argv += ["--decode", u]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://{LOOPBACK}:{self.port}/readiness"
        wait_until(lambda: http("GET", url)[0] == 200, timeout=60, what="router /readiness")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)


@dataclass
class Traffic:
    """Clients through the Service: every answer's status and the generations that made it."""

    url: str
    answers: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(time, kind of request, prefill generation, decode generation)."""
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, clients: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        return threads

    def _loop(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            self.one({"prompt": [rng.randint(3, 900) for _ in range(rng.randint(8, 200))], "max_tokens": 2})

    def one(self, body: dict[str, Any], kind: str = "short") -> None:
        body = {"model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8", **body}
        req = urllib.request.Request(self.url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=60) as r:
                raw = r.read().decode()
        except Exception as e:  # a refused or cut connection, an HTTP error: a failed request
            self.failures.append(f"{time.monotonic():.2f}: {e!r}")
            return
        docs = (
            [json.loads(x[6:]) for x in raw.split("\n") if x.startswith("data: {")]
            if body.get("stream")
            else [json.loads(raw)]
        )
        tags = {d.get("system_fingerprint") for d in docs}
        for tag in tags:
            parts = dict(kv.split("=") for kv in str(tag).split())
            self.answers.append((time.monotonic(), kind, parts.get("prefill", "?"), parts.get("decode", "?")))
        if not docs or len(tags) != 1:
            self.failures.append(f"answer without one generation tag: {raw[:200]}")

    def from_gen(self, gen: str, after: float = 0.0) -> int:
        return sum(1 for t, _, p, d in self.answers if p == d == gen and t >= after)


@pytest.fixture
def service() -> Iterator[Service]:
    s = Service()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(w, "RETRY_BACKOFF_SECONDS", (0.05,))
    monkeypatch.setattr(w, "HEALTH_POLL_SECONDS", 0.05)


def test_a_rollout_under_traffic_loses_no_request_and_never_mixes_generations(
    start_fake: Callable[..., Fake], service: Service
) -> None:
    assert ROUTER.exists(), f"vllm-router is not installed next to {sys.executable} (pip install vllm-router)"
    old_m, new_m = rendered(None), rendered("ghcr.io/hybridpd/vllm-runtime:0.20.0-patched")
    hashes = [next(iter(m["Deployment"].values()))["metadata"]["labels"][c.LABEL_GENERATION] for m in (old_m, new_m)]
    old, new = Generation(hashes[0], old_m), Generation(hashes[1], new_m)
    assert old.hash != new.hash
    cluster = Cluster(start_fake)
    cluster.start(old)
    assert cluster.pair_check(old) == (True, "ok")
    r_old = Router(cluster, old)
    service.set(r_old.port)
    traffic = Traffic(f"http://{LOOPBACK}:{service.port}")
    clients = traffic.run(4)
    wait_until(lambda: traffic.from_gen(old.hash) >= 20, timeout=60, what="answers from the old generation")

    # the new generation comes up beside it; its decode is Ready only after its pair check against its own prefill
    cluster.start(new)
    # (had decode been pointed at another generation's prefill Service, its pair check would have refused the pair:
    # the stand-in answers a transfer from another generation's prefill as a KV layout mismatch would)
    other = f"{old.deployment('prefill')['metadata']['name']}.{NS}.svc"
    ok, why = cluster.pair_check(new, service=other)
    assert not ok and "differs" in why, why
    assert cluster.pair_check(new) == (True, "ok")

    # the router Deployment rolls: a new router pod (new selectors) joins the endpoints once Ready...
    r_new = Router(cluster, new)
    service.set(r_old.port, r_new.port)
    long = threading.Thread(target=traffic.one, args=({"prompt": list(range(3, 300)), "max_tokens": LONG_TOKENS,
                                                        "stream": True}, "long"))  # fmt: skip
    service.set(r_old.port)  # the long request lands on the old router...
    long.start()
    (old_decode,) = [p.fake for p in old.pods if p.labels[c.LABEL_COMPONENT] == "decode"]
    wait_until(lambda: any(r["body"].get("stream") for r in old_decode.requests()), timeout=30, what="long request")
    service.set(r_new.port)  # ...which then leaves the endpoints, pauses (preStop), gets SIGTERM and drains
    time.sleep(PRESTOP_SECONDS)
    sigterm = time.monotonic()
    r_old.terminate()
    # the kubelet kills what is still running when the grace period (preStop included) is over
    grace = old.deployment(c.COMPONENT_ROUTER)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    try:
        r_old.proc.wait(timeout=grace - PRESTOP_SECONDS)
    except subprocess.TimeoutExpired:
        r_old.proc.kill()
    gone = time.monotonic()
    long.join(30)
    for p in old.pods:  # only now: the old generation's engines are removed
        p.fake.proc.terminate()
    wait_until(lambda: traffic.from_gen(new.hash, after=gone) >= 20, timeout=60, what="answers from the new generation")
    traffic.stop.set()
    for t in clients:
        t.join(30)
    r_new.terminate()

    assert traffic.failures == [], traffic.failures[:10]
    mixed = [(p, d) for _, _, p, d in traffic.answers if p != d]
    assert mixed == [], mixed[:10]
    assert {(p, d) for _, _, p, d in traffic.answers} == {(old.hash, old.hash), (new.hash, new.hash)}
    assert all(p == new.hash for t, kind, p, _ in traffic.answers if t > gone and kind == "short")
    ((done, _, p, _),) = [a for a in traffic.answers if a[1] == "long"]
    assert p == old.hash and done > sigterm, "the long request ran on the old router across its SIGTERM"
