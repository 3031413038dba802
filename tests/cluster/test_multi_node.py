"""Replicas larger than a node (#30) against the REAL local control plane with the REAL LeaderWorkerSet controller
(sigs.k8s.io/lws built from its Go module, its webhooks served on https://127.0.0.1: hack/hpd_devcluster/lws.py) and
kwok 8-GPU nodes. Every wait has a deadline; nothing connects to a pod or node IP.

Runs in file order: the first test needs LWS absent (it installs it itself), the rest share it (module fixture)."""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from hpd_devcluster import cluster, lws, versions
from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import T, arg, children, cond, create, get_cr, hold, patch_spec, wait_cr

pytestmark = pytest.mark.cluster
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
MODEL = {"name": "x/y", "hybrid": "none"}


def cr(name: str, decode: dict[str, Any]) -> dict[str, Any]:
    """Prefill TP 8 (one node, a Deployment); decode as given. Warmup settings do not matter on kwok."""
    return {
        "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {"model": MODEL, "prefill": {"tensorParallelSize": 8}, "decode": decode},
    }


def leaderworkersets(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.CustomObjectsApi(api).list_namespaced_custom_object(
        LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL
    )["items"]
    return items


def pods(api: client.ApiClient, ns: str, name: str, role: str) -> list[client.V1Pod]:
    sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}={role}"
    return [
        p
        for p in client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=sel).items
        if not p.metadata.deletion_timestamp
    ]


def ready(p: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))


def ready_at_generation(c: dict[str, Any]) -> bool:
    st = c.get("status") or {}
    return cond(c, "Ready").get("status") == "True" and st.get("observedGeneration") == c["metadata"]["generation"]


def env_of(p: client.V1Pod) -> dict[str, Any]:
    return {e.name: e.value for e in p.spec.containers[0].env}


@pytest.fixture(scope="module")
def lws_running(devcluster: cluster.ClusterState) -> Iterator[lws.Controller]:
    """The LWS controller for this module's tests; afterwards its CRDs go too, so later modules see the cluster as
    it was (no LeaderWorkerSet kind served)."""
    yield lws.start(devcluster)
    lws.stop(devcluster)
    lws.uninstall_crds(devcluster)


@pytest.fixture()
def more_gpus(devcluster: cluster.ClusterState) -> Iterator[None]:
    """Two more 8-GPU kwok nodes (the session's four hold one prefill and two decode groups only)."""
    names = [f"gpu-extra-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for n in names:
        cluster.add_node(devcluster, n)
    yield
    for n in names:
        cluster.delete_node(devcluster, n)


# --- tests ---------------------------------------------------------------------------------------------------
def test_without_leaderworkerset_a_multi_node_cr_says_what_to_install_builds_nothing_and_installing_lws_works(
    crd: None, devcluster: cluster.ClusterState, api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    ns, name = namespace, "needs-lws"
    lws.stop(devcluster)
    lws.uninstall_crds(devcluster)  # a reused cluster may have it
    op = Operator(devcluster.kubeconfig, ns, tmp_path / "operator.log", extra=("--recheck-seconds", "1"))
    op.start()
    try:
        create(api_client, ns, cr(name, {"tensorParallelSize": 16}))
        got = wait_cr(api_client, ns, name, lambda c: cond(c, "Ready").get("reason") == "LeaderWorkerSetMissing",
                      "Ready=False LeaderWorkerSetMissing")  # fmt: skip
        msg = cond(got, "Ready")["message"]
        assert cond(got, "Ready")["status"] == "False" and got["status"]["phase"] == "Failed"
        assert msg.startswith(f"LeaderWorkerSet is not installed; install lws v{versions.LWS}"), msg
        # nothing half-built: not the one-pod prefill, not the router, not a Service (several rechecks long)
        hold(lambda: not any(children(api_client, ns, name).values()), 4, "no child of a CR that needs LWS")
        assert op.proc is not None and op.proc.poll() is None  # still running, still looking

        lws.start(devcluster)  # CRDs + controller + webhooks: the operator notices and restarts itself
        assert op.proc.wait(timeout=T) == 3, "the operator exits 3 to be restarted watching LeaderWorkerSets"
        assert "LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) is served now" in op.log.read_text()
        op.start()  # as the kubelet would
        wait_cr(api_client, ns, name, ready_at_generation, "Ready once LWS is installed", timeout=90)
        assert [g["metadata"]["name"] for g in leaderworkersets(api_client, ns)] == [f"{name}-decode"]
    except BaseException:
        print(f"--- operator log ---\n{op.log.read_text(errors='replace')[-20000:]}")
        raise
    finally:
        op.stop()


def test_a_decode_of_16_gpus_on_8_gpu_nodes_is_one_group_of_2_pods_per_replica_with_ranks_leader_and_gpus(
    lws_running: lws.Controller, operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "tp16"
    create(api_client, ns, cr(name, {"tensorParallelSize": 16}))
    got = wait_cr(api_client, ns, name, ready_at_generation, "Ready", timeout=90)
    [group] = leaderworkersets(api_client, ns)
    assert group["metadata"]["name"] == f"{name}-decode"
    assert (group["spec"]["replicas"], group["spec"]["leaderWorkerTemplate"]["size"]) == (1, 2)
    assert f"{name}-decode" not in children(api_client, ns, name)["Deployment"]  # no decode Deployment

    decode = sorted(pods(api_client, ns, name, "decode"), key=lambda p: p.metadata.name)
    assert [p.metadata.name for p in decode] == [f"{name}-decode-0", f"{name}-decode-0-1"]
    leader_address = f"{name}-decode-0.{name}-decode-0.{ns}"  # LWS's per-group headless Service (UniquePerReplica)
    for rank, p in enumerate(decode):
        env = env_of(p)
        assert env["LWS_WORKER_INDEX"] == str(rank) and env["LWS_GROUP_SIZE"] == "2"
        assert env["LWS_LEADER_ADDRESS"] == leader_address
        assert env[contract.ENV_GROUP_ROLE] == ("leader" if rank == 0 else "worker")
        args = list(p.spec.containers[0].args)
        assert (
            arg(args, "--node-rank") == "$(LWS_WORKER_INDEX)" and arg(args, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        )
        assert arg(args, "--nnodes") == "2" and arg(args, "--tensor-parallel-size") == "16"
        assert ("--headless" in args) is (rank == 1)
        assert p.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
    assert decode[0].spec.node_name != decode[1].spec.node_name  # 16 GPUs need two 8-GPU nodes

    st = got["status"]["decode"]
    assert (st["replicas"], st["readyReplicas"], st["summary"]) == (1, 1, "1/1")  # groups, not pods (2 Ready)
    assert "1/1 decode replicas (groups of 2 pods) ready" in cond(got, "DecodeReady")["message"]

    # only the leader serves: the role's headless Service (decode's pair check, DNS) lists it alone
    def endpoints() -> set[str] | None:
        sel = f"kubernetes.io/service-name={name}-decode"
        slices = client.DiscoveryV1Api(api_client).list_namespaced_endpoint_slice(ns, label_selector=sel).items
        names = {e.target_ref.name for s in slices for e in (s.endpoints or []) if e.target_ref}
        return names or None

    assert wait_for(endpoints, T, what="the decode Service's endpoints") == {f"{name}-decode-0"}

    # settled: no re-apply loop against LWS's webhook defaults or its controller's writes (several resyncs long)
    [group] = leaderworkersets(api_client, ns)
    before = lws_applies(operator)
    hold(lambda: lws_applies(operator) == before, 5, "no LeaderWorkerSet applied again")
    [again] = leaderworkersets(api_client, ns)
    assert again["metadata"]["generation"] == group["metadata"]["generation"]


def lws_applies(op: Operator) -> float:
    """LeaderWorkerSet applies the operator counted (hpd_operator_objects_applied_total, every action)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).read().decode()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "hpd_operator_objects_applied_total" and s.labels.get("kind") == "LeaderWorkerSet"
    )


def test_scale_update_and_delete_of_a_role_that_spans_nodes(
    lws_running: lws.Controller, more_gpus: None, operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "tp16s"
    create(api_client, ns, cr(name, {"tensorParallelSize": 16}))
    wait_cr(api_client, ns, name, ready_at_generation, "Ready", timeout=90)

    def decode_state(c: dict[str, Any], want: int) -> bool:
        st = (c.get("status") or {}).get("decode") or {}
        return ready_at_generation(c) and st.get("replicas") == want and st.get("readyReplicas") == want

    patch_spec(api_client, ns, name, {"decode": {"replicas": 2}})  # scale: a second group of 2 pods
    got = wait_cr(api_client, ns, name, lambda c: decode_state(c, 2), "decode 2/2 groups", timeout=90)
    assert got["status"]["decode"]["summary"] == "2/2"
    assert len([p for p in pods(api_client, ns, name, "decode") if ready(p)]) == 4
    assert leaderworkersets(api_client, ns)[0]["spec"]["replicas"] == 2

    patch_spec(api_client, ns, name, {"decode": {"replicas": 1}})
    wait_cr(api_client, ns, name, lambda c: decode_state(c, 1), "decode back to 1 group", timeout=90)
    wait_for(lambda: len(pods(api_client, ns, name, "decode")) == 2, T, what="the second group's pods gone")

    # update: a new vLLM flag reaches every pod of the group (LWS replaces the group), the leader still serves
    patch_spec(api_client, ns, name, {"decode": {"replicas": 1, "extraArgs": ["--max-num-seqs", "64"]}})

    def rolled() -> bool:
        ps = pods(api_client, ns, name, "decode")
        return len(ps) == 2 and all(
            ready(p) and arg(list(p.spec.containers[0].args), "--max-num-seqs") == "64" for p in ps
        )

    wait_for(rolled, 90, what="the decode group rolled to the new args")
    wait_cr(api_client, ns, name, lambda c: decode_state(c, 1), "Ready after the update", timeout=90)

    # a replica that fits one node again: the LeaderWorkerSet is pruned, a Deployment takes over
    patch_spec(api_client, ns, name, {"decode": {"tensorParallelSize": 8, "extraArgs": []}})
    wait_cr(api_client, ns, name, lambda c: decode_state(c, 1), "decode as a Deployment", timeout=90)
    wait_for(lambda: not leaderworkersets(api_client, ns), T, what="the LeaderWorkerSet pruned")
    assert f"{name}-decode" in children(api_client, ns, name)["Deployment"]

    patch_spec(api_client, ns, name, {"decode": {"tensorParallelSize": 16}})  # and back: LWS again
    wait_cr(api_client, ns, name, lambda c: decode_state(c, 1) and bool(leaderworkersets(api_client, ns)),
            "decode as a LeaderWorkerSet again", timeout=90)  # fmt: skip
    wait_for(lambda: f"{name}-decode" not in children(api_client, ns, name)["Deployment"], T, what="Deployment pruned")

    # delete: the garbage collector takes the LeaderWorkerSet, and LWS its StatefulSets and pods
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        contract.GROUP, contract.VERSION, ns, contract.PLURAL, name
    )
    wait_for(lambda: not leaderworkersets(api_client, ns) and not pods(api_client, ns, name, "decode"), 90,
             what="the group and its pods gone")  # fmt: skip
    with pytest.raises(client.ApiException):
        get_cr(api_client, ns, name)
