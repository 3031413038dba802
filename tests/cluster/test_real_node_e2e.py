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

from hpd_devcluster import cluster, realnode
from hpd_devcluster.testing import wait_for

from .conftest import Operator
from .kube import CRD, get_cr, kubectl, patch_spec, seed, wait_ready

CR = "e2e"
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
    state = cluster.up(name, cluster.NodePool(count=0))
    op: Operator | None = None
    try:
        realnode.start(state, taint=False, gpus=8)
        refs = realnode.load_images(state, ("router",))
        kubectl(state.kubeconfig, "apply", "--server-side", "-f", str(CRD))
        kubectl(
            state.kubeconfig,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/hybridpddeployments.hybridpd.io",
        )
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(state.kubeconfig), client_configuration=cfg)
        api = client.ApiClient(cfg)
        ns = "e2e"
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
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
        cluster.down(name)


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


def complete(e: E2E, prompt: str, max_tokens: int = 4, timeout: float = 30) -> dict[str, Any]:
    body = {"model": seed()["spec"]["model"]["name"], "prompt": prompt, "max_tokens": max_tokens}
    req = urllib.request.Request(f"{endpoint(e)}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return dict(json.load(resp))


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


@dataclass
class Traffic:
    """`workers` loops of one request at a time to the endpoint until stopped: bounded, `workers` in flight at most."""

    e: E2E
    workers: int = 2
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def _loop(self) -> None:
        while not self.stop.is_set():
            prompt = unique_prompt()
            try:
                complete(self.e, prompt, max_tokens=2)
                err = None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                body = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
                err = f"{type(exc).__name__}: {exc} {body}"
            with self.lock:
                self.sent += 1
                if err:
                    self.failed.append(err)
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
