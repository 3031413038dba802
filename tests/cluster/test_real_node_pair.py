"""Pair pods on the real node (spec.kvTransfer.processNamespace Pair): the operator (a subprocess, as in the other
cluster tests) reconciles a Pair CR whose pod a real kubelet runs: the engine stand-in (the released vllm image's
hpd_runtime with tests/runtime/fake_vllm.py in vLLM's place) as the prefill and the decode container, and the real
vllm-router image as the in-pod router and as the CR's router. What only a kubelet shows: the pod is admitted by Pod
Security `restricted`, it turns Ready only through each container's own probes (decode's pair check asks the prefill
beside it on 127.0.0.1), a request to the CR's Service goes CR router -> in-pod router -> prefill -> decode inside one
pod, and decode's container sees prefill's process (one PID namespace, shareProcessNamespace).

A control plane of this module's own with no kwok node and the real node untainted, advertising `nvidia.com/gpu` (a
plain extended resource) for the engine containers' GPU limits, as tests/cluster/test_real_node_e2e.py. Run it under
the real node's lock: `flock /tmp/hpd-realnode.lock nice -n 10 .venv/bin/python -m pytest -q
tests/cluster/test_real_node_pair.py`. Traffic: a few requests, only to this node's pods and Services.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hpd_devcluster import cluster, lifecycle, realnode
from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import CRD, get_cr, kubectl, seed, wait_ready

CR = "pairnode"
CRD_NAME = "hybridpddeployments.hybridpd.io"
READY_S = 600  # a loaded 2-core machine: both engines start, warm up, and decode pair-checks prefill


@dataclass
class Node:
    state: cluster.ClusterState
    api: client.ApiClient
    ns: str


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    name = f"rn-pair-{os.getpid()}"
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
        wait_for(lambda: any(c.type == "Established" and c.status == "True"
                             for c in ext.read_custom_resource_definition(CRD_NAME).status.conditions or []),
                 60, what="the CRD Established")  # fmt: skip
        ns = "pair"
        restricted = {"pod-security.kubernetes.io/enforce": "restricted",
                      "pod-security.kubernetes.io/enforce-version": "latest"}  # fmt: skip
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=restricted))
        )
        log = tmp_path_factory.mktemp("pair") / "operator.log"
        op = Operator(
            state.kubeconfig, ns, log, extra=("--vllm-image", refs["engine"], "--router-image", refs["router"])
        )
        op.start()
        yield Node(state, api, ns)
    finally:
        if op is not None:
            op.stop()
            print(f"operator log tail:\n{''.join(Path(op.log).read_text(errors='replace').splitlines(True)[-60:])}")
        lifecycle.down(name)


def cr_doc() -> dict[str, Any]:
    doc = seed(CR)
    doc["spec"].setdefault("kvTransfer", {})["processNamespace"] = "Pair"
    for role in ("prefill", "decode"):  # the example's 4 CPUs and 32 GiB per engine do not fit this machine
        doc["spec"][role]["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
        doc["spec"][role]["replicas"] = 1
    return doc


@pytest.fixture(scope="module")
def ready_cr(node: Node) -> dict[str, Any]:
    client.CustomObjectsApi(node.api).create_namespaced_custom_object(
        contract.GROUP, contract.VERSION, node.ns, contract.PLURAL, cr_doc()
    )
    return wait_ready(node.api, node.ns, CR, timeout=READY_S)


def pair_pod(n: Node) -> client.V1Pod:
    sel = f"{contract.LABEL_INSTANCE}={CR},{contract.LABEL_COMPONENT}={contract.COMPONENT_PAIR}"
    items = client.CoreV1Api(n.api).list_namespaced_pod(n.ns, label_selector=sel).items
    (pod,) = [p for p in items if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    return pod


def recorded(pod: client.V1Pod, port: int) -> list[dict[str, Any]]:
    """What a stand-in engine of the pair pod received (fake_vllm's GET /_requests), from the pod's address."""
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:{port}/_requests", timeout=10) as resp:
        return list(json.load(resp))


def complete(n: Node, prompt: str) -> dict[str, Any]:
    svc = client.CoreV1Api(n.api).read_namespaced_service(CR, n.ns)
    body = {"model": seed()["spec"]["model"]["name"], "prompt": prompt, "max_tokens": 4}
    req = urllib.request.Request(f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}/v1/completions",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.load(resp))


def with_kv(reqs: list[dict[str, Any]], key: str, prompt: str | None = None) -> list[dict[str, Any]]:
    """The completions that carried kv_transfer_params[key] (of `prompt` when given)."""
    return [
        r for r in reqs
        if ((r["body"] or {}).get("kv_transfer_params") or {}).get(key)
        and (prompt is None or (r["body"] or {}).get("prompt") == prompt)
    ]  # fmt: skip


def test_the_pair_pod_runs_in_a_restricted_namespace_ready_through_each_containers_probes(
    node: Node, ready_cr: dict[str, Any]
) -> None:
    """One pod, three containers, all Ready; decode turned Ready only after its pair check with the prefill beside
    it (a P->D round trip recorded at both); the CR counts one Ready prefill and one Ready decode."""
    pod = pair_pod(node)
    assert client.CoreV1Api(node.api).read_namespace(node.ns).metadata.labels["pod-security.kubernetes.io/enforce"] == (
        "restricted"
    )
    assert pod.spec.share_process_namespace is True and not pod.spec.host_pid
    statuses = {c.name: c.ready for c in pod.status.container_statuses}
    assert statuses == {"prefill": True, "decode": True, "router": True}, statuses
    assert with_kv(recorded(pod, contract.VLLM_PORT), "do_remote_decode"), "decode Ready without a P->D round trip"
    assert with_kv(recorded(pod, contract.PAIR_DECODE_VLLM_PORT), "do_remote_prefill")
    status = ready_cr["status"]
    assert (status["prefill"]["readyReplicas"], status["decode"]["readyReplicas"]) == (1, 1), status


def test_a_request_through_the_service_goes_prefill_to_decode_inside_the_pod(
    node: Node, ready_cr: dict[str, Any]
) -> None:
    """The CR's Service -> the CR's router (regular mode) -> the pod's in-pod router -> its prefill (do_remote_decode)
    -> its decode (do_remote_prefill with the prefill's kv_transfer_params)."""
    prompt = " ".join(f"t{b}" for b in uuid.uuid4().bytes[:8])
    answer = complete(node, prompt)
    assert answer["usage"]["completion_tokens"] == 4, answer
    # vllm-router names the pair it chose in the id: the in-pod router's, the pod's own engines on loopback
    pair = f"prefill_addr_127.0.0.1:{contract.VLLM_PORT}___decode_addr_127.0.0.1:{contract.PAIR_DECODE_VLLM_PORT}"
    assert pair in answer["id"], answer["id"]
    pod = pair_pod(node)
    at_prefill = with_kv(recorded(pod, contract.VLLM_PORT), "do_remote_decode", prompt)
    at_decode = with_kv(recorded(pod, contract.PAIR_DECODE_VLLM_PORT), "do_remote_prefill", prompt)
    print(f"answer: {answer}\nprefill got: {at_prefill}\ndecode got: {at_decode}")
    assert len(at_prefill) == 1 and len(at_decode) == 1, (at_prefill, at_decode)


def test_decode_sees_prefills_process_one_pid_namespace(node: Node, ready_cr: dict[str, Any]) -> None:
    """From inside the decode container, prefill's vLLM (the stand-in started with kv_producer) is a visible process,
    and the other way round: the pod's containers share one PID namespace (the pod's own, not the node's: the
    kubelet's own processes are not in it)."""

    def cmdlines(container: str) -> str:
        script = 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f"; echo; done'
        out = kubectl(node.state.kubeconfig, "-n", node.ns, "exec", pair_pod(node).metadata.name, "-c", container,
                      "--", "sh", "-c", script)  # fmt: skip
        return out.stdout

    seen_by_decode, seen_by_prefill = cmdlines("decode"), cmdlines("prefill")
    print(f"decode sees:\n{seen_by_decode}")
    assert "kv_producer" in seen_by_decode and "kv_consumer" in seen_by_decode, seen_by_decode
    assert "kv_consumer" in seen_by_prefill
    assert "vllm::router" in seen_by_decode  # the in-pod router (vllm-router names its process so)
    assert "kubelet" not in seen_by_decode
    cr = get_cr(node.api, node.ns, CR)
    assert "inside each pair pod" in str(cr["status"]["conditions"]), cr["status"]["conditions"]
