"""Replicas larger than a node (#30) against the REAL local control plane with the REAL LeaderWorkerSet controller
(sigs.k8s.io/lws built from its Go module, its webhooks served on https://127.0.0.1: hack/hpd_devcluster/lws.py) and
kwok 8-GPU nodes. Every wait has a deadline; nothing connects to a pod or node IP.

A multi-node role is one LeaderWorkerSet per generation (`<cr>-decode-<hash>`, docs/rollouts.md): a scale stays in
place, an engine change or a shape change starts a new generation beside the serving one, the router moves to it
only once its groups are Ready, and the old generation's children are pruned after.

Runs in file order: the first test needs LWS absent (it installs it itself), the rest share it (module fixture)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster import cluster, lws, versions
from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import T, arg, children, cond, create, get_cr, hold, operator_metrics, patch_spec, serving, wait_cr

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


def group_names(api: client.ApiClient, ns: str) -> list[str]:
    return sorted(g["metadata"]["name"] for g in leaderworkersets(api, ns))


def engine_deployments(api: client.ApiClient, ns: str, name: str, role: str) -> list[str]:
    return [d for d in children(api, ns, name)["Deployment"] if d.startswith(f"{name}-{role}-")]


def pods(api: client.ApiClient, ns: str, name: str, role: str, gen: str | None = None) -> list[client.V1Pod]:
    sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}={role}"
    if gen is not None:
        sel += f",{contract.LABEL_GENERATION}={gen}"
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
        # the rechecks (every second here) give the generation no new number: its rollout status stays as it was
        # (it used to tick status.rollout.latestGeneration up on every recheck) and says it is Blocked
        ro = get_cr(api_client, ns, name)["status"]["rollout"]
        assert ro == got["status"]["rollout"] and ro["state"] == "Blocked", (ro, got["status"]["rollout"])
        assert "cannot be created: LeaderWorkerSet is not installed" in ro["message"], ro["message"]
        assert op.proc is not None and op.proc.poll() is None  # still running, still looking

        lws.start(devcluster)  # CRDs + controller + webhooks: the operator notices and restarts itself
        assert op.proc.wait(timeout=T) == 3, "the operator exits 3 to be restarted watching LeaderWorkerSets"
        assert "LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) is served now" in op.log.read_text()
        op.start()  # as the kubelet would
        wait_cr(api_client, ns, name, ready_at_generation, "Ready once LWS is installed", timeout=90)
        assert group_names(api_client, ns) == [f"{name}-decode-{serving(api_client, ns, name)}"]
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
    gen = serving(api_client, ns, name)
    [group] = leaderworkersets(api_client, ns)
    lws_name = f"{name}-decode-{gen}"
    assert group["metadata"]["name"] == lws_name
    assert group["metadata"]["labels"][contract.LABEL_GENERATION] == gen
    assert (group["spec"]["replicas"], group["spec"]["leaderWorkerTemplate"]["size"]) == (1, 2)
    assert not engine_deployments(api_client, ns, name, "decode")  # no decode Deployment
    assert got["status"]["rollout"]["servingHash"] == gen and got["status"]["rollout"]["state"] == "Complete"

    decode = sorted(pods(api_client, ns, name, "decode"), key=lambda p: p.metadata.name)
    assert [p.metadata.name for p in decode] == [f"{lws_name}-0", f"{lws_name}-0-1"]
    assert all(p.metadata.labels[contract.LABEL_GENERATION] == gen for p in decode)
    leader_address = f"{lws_name}-0.{lws_name}-0.{ns}"  # LWS's per-group headless Service (UniquePerReplica)
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

    # only the leader serves: the generation's headless Service (decode's pair check, DNS) lists it alone
    def endpoints() -> set[str] | None:
        sel = f"kubernetes.io/service-name={name}-decode-{gen}"
        slices = client.DiscoveryV1Api(api_client).list_namespaced_endpoint_slice(ns, label_selector=sel).items
        names = {e.target_ref.name for s in slices for e in (s.endpoints or []) if e.target_ref}
        return names or None

    assert wait_for(endpoints, T, what="the decode Service's endpoints") == {f"{lws_name}-0"}

    # settled: no re-apply loop against LWS's webhook defaults or its controller's writes (several resyncs long)
    [group] = leaderworkersets(api_client, ns)
    before = lws_applies(operator)
    hold(lambda: lws_applies(operator) == before, 5, "no LeaderWorkerSet applied again")
    [again] = leaderworkersets(api_client, ns)
    assert again["metadata"]["generation"] == group["metadata"]["generation"]


def lws_applies(op: Operator) -> float:
    """LeaderWorkerSet applies the operator counted (hpd_operator_objects_applied_total, every action)."""
    return operator_metrics(op.metrics_port, kind="LeaderWorkerSet").get("hpd_operator_objects_applied_total", 0.0)


def decode_state(c: dict[str, Any], want: int) -> bool:
    st = (c.get("status") or {}).get("decode") or {}
    return ready_at_generation(c) and st.get("replicas") == want and st.get("readyReplicas") == want


def settled_on(c: dict[str, Any], gen: str) -> bool:
    """Ready, every replica of generation `gen` serving, nothing else left (status.rollout Complete)."""
    ro = (c.get("status") or {}).get("rollout") or {}
    return ready_at_generation(c) and ro.get("servingHash") == gen and ro.get("state") == "Complete"


def test_scale_shape_change_and_delete_of_a_role_that_spans_nodes(
    lws_running: lws.Controller, more_gpus: None, operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "tp16s"
    create(api_client, ns, cr(name, {"tensorParallelSize": 16}))
    wait_cr(api_client, ns, name, ready_at_generation, "Ready", timeout=90)
    first = serving(api_client, ns, name)

    patch_spec(api_client, ns, name, {"decode": {"replicas": 2}})  # scale: a second group of 2 pods, in place
    got = wait_cr(api_client, ns, name, lambda c: decode_state(c, 2), "decode 2/2 groups", timeout=90)
    assert got["status"]["decode"]["summary"] == "2/2"
    assert len([p for p in pods(api_client, ns, name, "decode") if ready(p)]) == 4
    [group] = leaderworkersets(api_client, ns)
    assert (group["metadata"]["name"], group["spec"]["replicas"]) == (f"{name}-decode-{first}", 2)  # no new generation
    assert got["status"]["rollout"]["latestGeneration"] == 1

    patch_spec(api_client, ns, name, {"decode": {"replicas": 1}})
    wait_cr(api_client, ns, name, lambda c: decode_state(c, 1), "decode back to 1 group", timeout=90)
    wait_for(lambda: len(pods(api_client, ns, name, "decode")) == 2, T, what="the second group's pods gone")

    # a replica that fits one node again: a new generation whose decode is a Deployment; the router moves to it
    # once it is Ready, then the old generation's LeaderWorkerSet (and its prefill Deployment) are pruned
    patch_spec(api_client, ns, name, {"decode": {"tensorParallelSize": 8}})
    got = wait_cr(api_client, ns, name, lambda c: ready_at_generation(c) and serving(api_client, ns, name) != first
                  and settled_on(c, serving(api_client, ns, name)), "decode as a Deployment, serving", timeout=90)  # fmt: skip
    second = serving(api_client, ns, name)
    wait_for(lambda: not leaderworkersets(api_client, ns), T, what="the old generation's LeaderWorkerSet pruned")
    assert engine_deployments(api_client, ns, name, "decode") == [f"{name}-decode-{second}"]
    assert engine_deployments(api_client, ns, name, "prefill") == [f"{name}-prefill-{second}"]
    assert got["status"]["rollout"]["latestGeneration"] == 2

    # and back: a LeaderWorkerSet again, the same templates as the first generation (so its hash), number 3
    patch_spec(api_client, ns, name, {"decode": {"tensorParallelSize": 16}})
    got = wait_cr(api_client, ns, name, lambda c: settled_on(c, first) and c["status"]["rollout"]["servingGeneration"] == 3,
                  "decode as a LeaderWorkerSet again", timeout=90)  # fmt: skip
    assert got["status"]["rollout"]["latestGeneration"] == 3  # numbers never repeat, even for the same templates
    assert group_names(api_client, ns) == [f"{name}-decode-{first}"]
    wait_for(lambda: not engine_deployments(api_client, ns, name, "decode"), T, what="the decode Deployment pruned")

    # delete: the garbage collector takes the LeaderWorkerSet, and LWS its StatefulSets and pods
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        contract.GROUP, contract.VERSION, ns, contract.PLURAL, name
    )
    wait_for(lambda: not leaderworkersets(api_client, ns) and not pods(api_client, ns, name, "decode"), 90,
             what="the group and its pods gone")  # fmt: skip
    with pytest.raises(client.ApiException):
        get_cr(api_client, ns, name)


@pytest.fixture()
def pool(devcluster: cluster.ClusterState) -> Iterator[tuple[str, Callable[[int], None]]]:
    """A node pool of this test's own (label hybridpd-test/pool=<id>): (id, add(n)) adds n 8-GPU nodes to it."""
    pool_id, names = f"p{uuid.uuid4().hex[:6]}", []

    def add(n: int) -> None:
        for _ in range(n):
            names.append(f"gpu-{pool_id}-{len(names)}")
            cluster.add_node(devcluster, names[-1], labels={"hybridpd-test/pool": pool_id})

    yield pool_id, add
    for n in names:
        cluster.delete_node(devcluster, n)


def test_a_new_generation_of_a_multi_node_role_takes_traffic_only_once_its_groups_are_ready(
    lws_running: lws.Controller,
    pool: tuple[str, Callable[[int], None]],
    operator: Operator,
    api_client: client.ApiClient,
    namespace: str,
) -> None:
    """An engine change (a vLLM flag) of a TP 16 decode on a pool with no room beside it: the new generation's
    group cannot be scheduled, so the router keeps the old generation and nothing of it is pruned (Blocked); once
    nodes are added, the new group comes up, traffic moves, and the old LeaderWorkerSet is pruned."""
    ns, name = namespace, "gated"
    pool_id, add = pool
    add(3)  # exactly one generation: prefill on one node, the decode group on two
    on_pool = {"nodeSelector": {"hybridpd-test/pool": pool_id}}
    doc = cr(name, {"tensorParallelSize": 16, **on_pool})
    doc["spec"]["prefill"].update(on_pool)
    create(api_client, ns, doc)
    wait_cr(api_client, ns, name, ready_at_generation, "Ready", timeout=90)
    old = serving(api_client, ns, name)

    patch_spec(api_client, ns, name, {"decode": {"extraArgs": ["--max-num-seqs", "64"]}})

    def blocked(c: dict[str, Any]) -> bool:
        ro = (c.get("status") or {}).get("rollout") or {}
        return ro.get("state") == "Blocked" and ro.get("servingHash") == old and ro.get("targetHash") != old

    got = wait_cr(api_client, ns, name, blocked, "the new generation Blocked, the old one serving", timeout=90)
    new = got["status"]["rollout"]["targetHash"]
    assert cond(got, "Ready")["status"] == "True"  # the old generation still serves
    wait_for(lambda: group_names(api_client, ns) == sorted([f"{name}-decode-{old}", f"{name}-decode-{new}"]), T,
             what="both generations' LeaderWorkerSets")  # fmt: skip

    def still_old() -> bool:
        c = get_cr(api_client, ns, name)
        return (
            serving(api_client, ns, name) == old
            and f"{name}-decode-{old}" in group_names(api_client, ns)
            and not any(ready(p) for p in pods(api_client, ns, name, "decode", new))
            and cond(c, "Ready")["status"] == "True"
        )

    hold(still_old, 5, "the router keeps the old generation while the new group is not Ready")

    add(3)  # room for the new generation beside the old one
    got = wait_cr(api_client, ns, name, lambda c: settled_on(c, new), "traffic on the new generation", timeout=120)
    wait_for(lambda: group_names(api_client, ns) == [f"{name}-decode-{new}"], T, what="the old LeaderWorkerSet pruned")
    # its pods go after it (the garbage collector, then their grace period: the preStop drain's)
    wait_for(lambda: len(pods(api_client, ns, name, "decode")) == 2, T, what="the old group's pods gone")
    decode = pods(api_client, ns, name, "decode")
    assert len(decode) == 2 and all(p.metadata.labels[contract.LABEL_GENERATION] == new for p in decode)
    assert all(arg(list(p.spec.containers[0].args), "--max-num-seqs") == "64" for p in decode)
    router = client.AppsV1Api(api_client).read_namespaced_deployment(f"{name}-router", ns)
    selector = list(router.spec.template.spec.containers[0].args)
    assert f"{contract.LABEL_GENERATION}={new}" in selector and f"{contract.LABEL_GROUP_ROLE}=leader" in selector

    def switched_event() -> bool:  # posted after the status write: waited for (STYLE item 13)
        events = client.CoreV1Api(api_client).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        return "TrafficSwitched" in {e.reason for e in events.items}

    wait_for(switched_event, T, what="the TrafficSwitched Event")
