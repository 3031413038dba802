"""End to end on the real node: the operator (a subprocess, as in the other cluster tests) reconciles a CR whose
pods a real kubelet runs: vllm-router (the real router image) and the engine stand-in (the released vllm image's
hpd_runtime with tests/runtime/fake_vllm.py in vLLM's place, realnode.ensure_engine_standin). Requests go to the CR's
endpoint Service's ClusterIP (kube-proxy) from the host, then router -> prefill pod -> decode pod.

A control plane of this module's own with no kwok node (the router's pod has no placement fields in the CR, so a kwok
node would take it), and the real node untainted and advertising `nvidia.com/gpu` (a plain extended resource) for
the engine pods' GPU limits. Traffic: bounded, only to this node's pods and Services.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hpd_devcluster import cluster, lifecycle, realnode
from hpd_devcluster.testing import wait_for

from .conftest import Operator
from .kube import CRD, get_cr, kubectl, patch_spec, seed, wait_ready

CR = "e2e"
CRD_NAME = "hybridpddeployments.hybridpd.io"
READY_S = 600  # a loaded 2-core machine: pods start, warm up and pair-check one after another


@dataclass
class E2E:
    state: cluster.ClusterState
    api: client.ApiClient
    ns: str
    refs: dict[str, str]
    operator: Operator


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    name = f"rn-e2e-{os.getpid()}"
    state = lifecycle.up(name, cluster.NodePool(count=0))
    op: Operator | None = None
    try:
        realnode.start(state, taint=False, gpus=8)
        refs = realnode.load_images(state, ("router",))
        kubectl(state.kubeconfig, "apply", "--server-side", "-f", str(CRD))
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(state.kubeconfig), client_configuration=cfg)
        api = client.ApiClient(cfg)
        ext = client.ApiextensionsV1Api(api)
        # polled, not `kubectl wait` (which fails at once when it runs before the CRD's first status)
        wait_for(lambda: any(c.type == "Established" and c.status == "True"
                             for c in ext.read_custom_resource_definition(CRD_NAME).status.conditions or []),
                 60, what="the CRD Established")  # fmt: skip
        ns = "e2e"
        restricted = {"pod-security.kubernetes.io/enforce": "restricted",
                      "pod-security.kubernetes.io/enforce-version": "latest"}  # fmt: skip
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=restricted))
        )
        log = tmp_path_factory.mktemp("e2e") / "operator.log"
        op = Operator(
            state.kubeconfig, ns, log, extra=("--vllm-image", refs["engine"], "--router-image", refs["router"])
        )
        op.start()
        yield E2E(state, api, ns, refs, op)
    finally:
        if op is not None:
            op.stop()
            print(f"operator log tail:\n{''.join(Path(op.log).read_text(errors='replace').splitlines(True)[-60:])}")
        lifecycle.down(name)


def cr_doc(decode_replicas: int = 1) -> dict[str, Any]:
    doc = seed(CR)
    for role in ("prefill", "decode"):  # the example's 4 CPUs and 32 GiB per pod do not fit this machine
        doc["spec"][role]["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    doc["spec"]["decode"]["replicas"] = decode_replicas
    return doc


def pods(e: E2E, role: str) -> list[client.V1Pod]:
    sel = f"app.kubernetes.io/instance={CR},app.kubernetes.io/component={role}"
    items = client.CoreV1Api(e.api).list_namespaced_pod(e.ns, label_selector=sel).items
    return [p for p in items if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


def recorded(pod: client.V1Pod) -> list[dict[str, Any]]:
    """What the stand-in engine received (fake_vllm's GET /_requests), from the pod's address on the bridge."""
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8000/_requests", timeout=10) as resp:
        return list(json.load(resp))


def endpoint(e: E2E) -> str:
    svc = client.CoreV1Api(e.api).read_namespaced_service(CR, e.ns)
    return f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"


def post_completion(url: str, prompt: str, max_tokens: int = 4, timeout: float = 30) -> dict[str, Any]:
    """One completion of the seed's model to `url` (an endpoint: `http://<ip>:<port>`); urllib's errors raised."""
    body = {"model": seed()["spec"]["model"]["name"], "prompt": prompt, "max_tokens": max_tokens}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return dict(json.load(resp))


def complete(e: E2E, prompt: str, max_tokens: int = 4, timeout: float = 30) -> dict[str, Any]:
    return post_completion(endpoint(e), prompt, max_tokens, timeout)


def unique_prompt() -> str:
    return " ".join(f"t{b}" for b in uuid.uuid4().bytes[:8])


@pytest.fixture(scope="module")
def ready_cr(e2e: E2E) -> dict[str, Any]:
    client.CustomObjectsApi(e2e.api).create_namespaced_custom_object("hybridpd.io", "v1alpha1", e2e.ns,
                                                                     "hybridpddeployments", cr_doc())  # fmt: skip
    return wait_ready(e2e.api, e2e.ns, CR, timeout=READY_S)


def test_ready_only_after_the_warmup_and_the_pair_check_through_the_real_probes(
    e2e: E2E, ready_cr: dict[str, Any]
) -> None:
    """Ready (the CR's, from the pods' Ready, from the kubelet's exec probes `hpd_runtime probe`) comes only once the
    runtime has warmed up the prefill and the decode has decoded from a real prefill pod's KV over the pods' network."""
    (prefill,), (decode,) = pods(e2e, "prefill"), pods(e2e, "decode")
    assert any(c.type == "Ready" and c.status == "True" for c in decode.status.conditions)
    p_reqs, d_reqs = recorded(prefill), recorded(decode)
    assert [r for r in p_reqs if r["path"] == "/v1/completions"], "prefill Ready without any warmup completion"
    handed = [r for r in p_reqs if ((r["body"] or {}).get("kv_transfer_params") or {}).get("do_remote_decode")]
    decoded = [r for r in d_reqs if ((r["body"] or {}).get("kv_transfer_params") or {}).get("do_remote_prefill")]
    assert handed and decoded, "decode Ready without a pair check through a prefill pod"
    probe = decode.spec.containers[0].readiness_probe
    assert probe._exec is not None and "probe" in " ".join(probe._exec.command), probe


def test_a_request_goes_service_router_prefill_decode(e2e: E2E, ready_cr: dict[str, Any]) -> None:
    """One completion to the CR's Service ClusterIP: the router sends it to the prefill pod with do_remote_decode,
    then to the decode pod with the prefill's kv_transfer_params; the answer says which generations made it."""
    prompt = unique_prompt()
    answer = complete(e2e, prompt)
    assert answer["usage"]["completion_tokens"] == 4, answer
    (prefill,), (decode,) = pods(e2e, "prefill"), pods(e2e, "decode")
    at_prefill = [r for r in recorded(prefill) if (r["body"] or {}).get("prompt") == prompt]
    at_decode = [r for r in recorded(decode) if (r["body"] or {}).get("prompt") == prompt]
    print(f"answer: {answer}\nprefill got: {at_prefill}\ndecode got: {at_decode}")
    assert len(at_prefill) == 1 and at_prefill[0]["body"]["kv_transfer_params"]["do_remote_decode"], at_prefill
    assert len(at_decode) == 1 and at_decode[0]["body"]["kv_transfer_params"]["do_remote_prefill"], at_decode
    assert "prefill=none" not in str(answer.get("system_fingerprint")), answer


def test_restricted_namespace_admits_the_pods_and_their_roots_are_read_only(e2e: E2E, ready_cr: dict[str, Any]) -> None:
    """The module's namespace enforces Pod Security `restricted` (the apiserver's admission refused nothing: the
    pods run); the kubelet runs each container with the read-only root the operator renders: writing there fails,
    the cache volume is writable."""
    labels = client.CoreV1Api(e2e.api).read_namespace(e2e.ns).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for role in ("prefill", "decode", "router"):
        (pod, *_) = pods(e2e, role)
        c = pod.spec.containers[0]
        assert c.security_context.read_only_root_filesystem is True, (role, c.security_context)
        wrote = kubectl(e2e.state.kubeconfig, "-n", e2e.ns, "exec", pod.metadata.name, "--", "sh", "-c",
                        "touch /root-write-probe 2>&1 && echo root=writable || echo root=read-only")  # fmt: skip
        assert "root=read-only" in wrote.stdout, (role, wrote.stdout)
    (engine,) = pods(e2e, "prefill")
    cache = kubectl(e2e.state.kubeconfig, "-n", e2e.ns, "exec", engine.metadata.name, "--", "sh", "-c",
                    'echo ok > "$HPD_CACHE_DIR/write-probe" && echo cache=writable')  # fmt: skip
    assert "cache=writable" in cache.stdout, cache.stdout


@dataclass
class Traffic:
    """`workers` loops of one request at a time to the endpoint until stopped: bounded, `workers` in flight at most."""

    e: E2E
    workers: int = 2
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    """Each answer's id: vllm-router's `cmpl-___prefill_addr_<ip:port>___decode_addr_<ip:port>_<uuid>`."""
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def _loop(self) -> None:
        while not self.stop.is_set():
            prompt = unique_prompt()
            answer_id = ""
            try:
                answer_id = str(complete(self.e, prompt, max_tokens=2).get("id"))
                err = None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                body = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
                err = f"{type(exc).__name__}: {exc} {body}"
            with self.lock:
                self.sent += 1
                if err:
                    self.failed.append(err)
                else:
                    self.answers.append(answer_id)
            time.sleep(0.05)

    def __enter__(self) -> Traffic:
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.workers)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def wait_answers(traffic: Traffic, more: int, timeout: float = 120) -> None:
    start = traffic.sent
    wait_for(lambda: traffic.sent >= start + more, timeout, what=f"{more} more requests answered")


def test_a_decode_pod_deleted_under_traffic_with_two_decodes(e2e: E2E, ready_cr: dict[str, Any]) -> None:
    """#38's bar: a lost decode pod fails at most the requests it had in flight (here at most `workers`)."""
    patch_spec(e2e.api, e2e.ns, CR, {"decode": {"replicas": 2}})
    wait_for(lambda: len([p for p in pods(e2e, "decode") if any(c.type == "Ready" and c.status == "True"
                                                               for c in p.status.conditions)]) == 2,
             READY_S, what="2 decode pods Ready")  # fmt: skip
    wait_ready(e2e.api, e2e.ns, CR, timeout=READY_S)
    with Traffic(e2e) as traffic:
        wait_answers(traffic, 10)
        victim = pods(e2e, "decode")[0]
        client.CoreV1Api(e2e.api).delete_namespaced_pod(victim.metadata.name, e2e.ns)
        wait_for(lambda: victim.metadata.name not in [p.metadata.name for p in pods(e2e, "decode")] and
                 len(pods(e2e, "decode")) == 2, READY_S, what="the decode pod replaced")  # fmt: skip
        wait_answers(traffic, 10)
    print(f"decode pod {victim.metadata.name} deleted under traffic: {traffic.sent} requests, "
          f"{len(traffic.failed)} failed: {traffic.failed}")  # fmt: skip
    assert len(traffic.failed) <= traffic.workers, traffic.failed
    wait_ready(e2e.api, e2e.ns, CR, timeout=READY_S)  # the replacement paired: Ready again


def test_scale_down_under_traffic_drains_inside_the_grace_period(e2e: E2E, ready_cr: dict[str, Any]) -> None:
    """Decode 2 -> 1 under traffic: the removed pod's preStop (`hpd_runtime drain`) lets the router stop sending to it
    and its in-flight requests finish before SIGTERM: no request fails."""
    patch_spec(e2e.api, e2e.ns, CR, {"decode": {"replicas": 2}})
    wait_for(lambda: len([p for p in pods(e2e, "decode") if any(c.type == "Ready" and c.status == "True"
                                                               for c in p.status.conditions)]) == 2,
             READY_S, what="2 decode pods Ready")  # fmt: skip
    with Traffic(e2e) as traffic:
        wait_answers(traffic, 10)
        patch_spec(e2e.api, e2e.ns, CR, {"decode": {"replicas": 1}})
        sel = f"app.kubernetes.io/instance={CR},app.kubernetes.io/component=decode"
        core = client.CoreV1Api(e2e.api)
        wait_for(lambda: len(core.list_namespaced_pod(e2e.ns, label_selector=sel).items) == 1, READY_S,
                 what="one decode pod left (the other drained and gone)")  # fmt: skip
        wait_answers(traffic, 10)
    print(f"decode 2 -> 1 under traffic: {traffic.sent} requests, {len(traffic.failed)} failed: {traffic.failed}")
    assert traffic.failed == []


def test_rollout_under_traffic_fails_nothing_and_never_mixes_generations(e2e: E2E, ready_cr: dict[str, Any]) -> None:
    """A pod-template change (a new generation) under traffic: no request fails, and every answer's prefill and
    decode pods (named in vllm-router's answer id) are of one generation."""
    core, gen_label = client.CoreV1Api(e2e.api), "hybridpd.io/generation"
    sel = f"app.kubernetes.io/instance={CR}"
    old = {p.metadata.labels[gen_label] for p in pods(e2e, "decode")}
    generation_of: dict[str, str] = {}
    done = threading.Event()

    def map_ips() -> None:  # pod IP -> generation, for every engine pod seen (host-local does not reuse at once)
        while not done.is_set():
            for p in core.list_namespaced_pod(e2e.ns, label_selector=sel).items:
                if p.status.pod_ip and gen_label in (p.metadata.labels or {}):
                    generation_of[p.status.pod_ip] = p.metadata.labels[gen_label]
            done.wait(0.3)

    mapper = threading.Thread(target=map_ips, daemon=True)
    mapper.start()
    try:
        with Traffic(e2e) as traffic:
            wait_answers(traffic, 10)
            patch_spec(e2e.api, e2e.ns, CR, {"env": [{"name": "E2E_ROLLOUT", "value": "2"}]})

            def rolled() -> bool:
                engines = [
                    p
                    for p in core.list_namespaced_pod(e2e.ns, label_selector=sel).items
                    if (p.metadata.labels or {}).get("app.kubernetes.io/component") in ("prefill", "decode")
                ]
                return bool(engines) and all(p.metadata.labels.get(gen_label) not in old for p in engines)

            wait_for(rolled, READY_S, what="the old generation's engine pods gone")
            wait_ready(e2e.api, e2e.ns, CR, timeout=READY_S)
            wait_answers(traffic, 10)
    finally:
        done.set()
        mapper.join(timeout=10)
    mixed, pairs = [], set()
    for answer_id in traffic.answers:
        m = re.search(r"prefill_addr_([\d.]+):\d+___decode_addr_([\d.]+):\d+", answer_id)
        assert m, answer_id
        p_gen, d_gen = generation_of.get(m[1]), generation_of.get(m[2])
        pairs.add((p_gen, d_gen))
        if p_gen != d_gen or p_gen is None:
            mixed.append(answer_id)
    print(f"rollout under traffic: {traffic.sent} requests, {len(traffic.failed)} failed: {traffic.failed}; "
          f"(prefill, decode) generations answered: {sorted(pairs, key=str)}; mixed: {mixed}")  # fmt: skip
    assert traffic.failed == []
    assert mixed == []
    assert any(p not in old for p, _ in pairs), "no answer from the new generation"


def test_the_decode_kv_report_posted_with_the_projected_token_reaches_status(
    e2e: E2E, ready_cr: dict[str, Any]
) -> None:
    """The decode pod writes its KV path report on `<cr>-kv-reporter` with the kubelet-projected token of that
    ServiceAccount (from inside the pod, through the apiserver's address for pods); the operator copies it into
    status.kvPath."""
    decode = pods(e2e, "decode")[0]
    assert decode.spec.service_account_name == f"{CR}-kv-reporter", decode.spec.service_account_name
    lease = client.CoordinationV1Api(e2e.api).read_namespaced_lease(f"{CR}-kv-reporter", e2e.ns)
    reports = {k: v for k, v in (lease.metadata.annotations or {}).items() if k.startswith("kv.hybridpd.io/")}
    assert f"kv.hybridpd.io/{decode.metadata.uid}" in reports, f"no report of {decode.metadata.name}: {reports}"
    cr = get_cr(e2e.api, e2e.ns, CR)
    kv_path = (cr.get("status") or {}).get("kvPath") or {}
    print(f"reports: {reports}\nstatus.kvPath: {kv_path}")
    assert kv_path.get("message"), cr.get("status")
