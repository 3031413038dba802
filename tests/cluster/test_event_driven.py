"""The reconcile is driven by events, not by a timer, and an idle operator writes nothing (issue #15, item 1).

Every operator here runs with its timers out of the picture (`--resync-seconds` and `--recheck-seconds` an
hour) unless the test is about the safety resync: a pod turning Ready, a Deployment's status, a child deleted or
edited by hand, and a spec change must all reach the CR's status or be repaired from watch events alone.

Write requests are counted twice. The apiserver's own `apiserver_request_total` (from its /metrics) has no label
for the client, so it is taken on the resources the operator writes (the CR and its status, its children's
kinds) once no namespace of an earlier test is being torn down: the controllers, the scheduler and kwok write
none of them for Ready pods that stay Ready. The operator's own `hpd_operator_api_requests_total` counts every
request of its reconcile client (all but kopf's watch streams): it must not move at all. That
the count would see the operator's writes is checked in the same test (a deleted child comes back: an APPLY).
Events (which other components write cluster-wide) are compared in the test namespace: none new, no count raised."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import (
    T,
    children,
    cond,
    container_of,
    create,
    deployment,
    engine_deployment,
    expected,
    get_cr,
    kubectl,
    operator_metrics,
    patch_spec,
    seed,
    serving,
    wait_cr,
    wait_ready,
)

pytestmark = pytest.mark.cluster
NO_TIMER = ("--recheck-seconds", "3600")
HOUR = "3600"
WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE"})
OPERATOR_WRITES = frozenset(
    {
        "hybridpddeployments",
        "deployments",
        "services",
        "serviceaccounts",
        "roles",
        "rolebindings",
        "networkpolicies",
        "poddisruptionbudgets",
        "podmonitors",
    }
)
"""The resources the operator writes (children, the CR's status), but Events: other components post Events about
nodes and namespaces of other tests at any time, so the operator's Events are checked in the test's namespace."""


@pytest.fixture()
def quiet_operator(
    crd: None, kubeconfig: Path, namespace: str, tmp_path: Path, operator_logs: list[Path]
) -> Iterator[Operator]:
    """An operator whose safety resync and probe re-check are an hour away: only events move it."""
    op = Operator(kubeconfig, namespace, tmp_path / "operator.log", resync=HOUR, extra=NO_TIMER)
    operator_logs.append(op.log)
    op.start()
    yield op
    op.stop()


def requests(kubeconfig: Path) -> dict[tuple[str, str, str], float]:
    """apiserver_request_total summed by (verb, resource, subresource)."""
    text = kubectl(kubeconfig, "get", "--raw", "/metrics").stdout
    out: dict[tuple[str, str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "apiserver_request":
            continue
        for s in fam.samples:
            if not s.name.endswith("_total"):
                continue
            k = (s.labels.get("verb", ""), s.labels.get("resource", ""), s.labels.get("subresource", ""))
            out[k] = out.get(k, 0.0) + s.value
    return out


def writes(before: dict[tuple[str, str, str], float], after: dict[tuple[str, str, str], float]) -> dict[str, float]:
    """Write requests on the operator's resources between two snapshots, by `VERB resource[/subresource]`."""
    out: dict[str, float] = {}
    for (verb, res, sub), v in after.items():
        delta = v - before.get((verb, res, sub), 0.0)
        if verb in WRITES and res in OPERATOR_WRITES and delta > 0:
            out[f"{verb} {res}{'/' + sub if sub else ''}"] = delta
    return out


def add_node(devcluster: Any, label: str) -> str:
    """One extra kwok GPU node labelled hybridpd.test/node=<label>."""
    from hpd_devcluster import cluster

    name = f"late-{uuid.uuid4().hex[:8]}"
    node = cluster._node_manifest(name, cluster.NodePool())
    node["metadata"]["labels"]["hybridpd.test/node"] = label
    cluster.api(devcluster, "POST", "/api/v1/nodes", node)
    return name


def test_a_pod_turning_ready_reaches_the_status_without_a_timer(
    quiet_operator: Operator, api_client: client.ApiClient, namespace: str, devcluster: Any
) -> None:
    ns, name = namespace, "late"
    label = f"n-{uuid.uuid4().hex[:8]}"
    doc = seed(name)
    doc["spec"]["decode"]["nodeSelector"] = {"hybridpd.test/node": label}  # no such node yet
    create(api_client, ns, doc)
    # the decode pod is reported Unschedulable as soon as the scheduler says so, the prefill pod Ready once kwok
    # runs it: either may come first
    cr = wait_cr(
        api_client,
        ns,
        name,
        lambda c: (
            cond(c, "DecodeReady").get("reason") == "Unschedulable" and cond(c, "PrefillReady").get("status") == "True"
        ),
        "decode Unschedulable, prefill Ready",
    )
    assert cond(cr, "Ready")["status"] == "False"
    node = add_node(devcluster, label)
    try:
        # the scheduler binds the decode pod, kwok runs it and marks it Ready; the pod and Deployment status events
        # are the only triggers (no resync, no re-check within the hour)
        cr = wait_ready(api_client, ns, name)
        assert cr["status"]["decode"]["summary"] == "1/1" and cond(cr, "DecodeReady")["reason"] == "AllReplicasReady"
    finally:
        client.CoreV1Api(api_client).delete_node(node)
    # the node is gone: the pod bound to it no longer counts (node watch), still without a timer
    cr = wait_cr(api_client, ns, name, lambda c: cond(c, "Ready").get("status") == "False", "Ready=False")
    # (DecodeUnavailable: degraded mode serves on the Ready prefill, the node's loss in its message)
    assert cond(cr, "Degraded")["reason"] in ("NodeLost", "Unschedulable", "DecodeUnavailable"), cond(cr, "Degraded")


def test_children_deleted_or_edited_by_hand_are_repaired_without_a_timer(
    quiet_operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "hand"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    g = serving(api_client, ns, name)
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    dep = deployment(api_client, ns, f"{name}-decode-{g}")
    svc = core.read_namespaced_service(name, ns)
    # a Deployment (has a generation), a Service (has none), a deleted NetworkPolicy
    apps.patch_namespaced_deployment(
        f"{name}-decode-{g}",
        ns,
        {"spec": {"replicas": 4, "template": {"spec": {"containers": [{"name": "vllm", "args": ["x"]}]}}}},
    )
    core.patch_namespaced_service(name, ns, {"spec": {"selector": {contract.LABEL_COMPONENT: "decode"}}})
    client.NetworkingV1Api(api_client).delete_namespaced_network_policy(f"{name}-router", ns)

    def repaired() -> bool:
        d = deployment(api_client, ns, f"{name}-decode-{g}")
        s = core.read_namespaced_service(name, ns)
        return (
            d.spec.replicas == 1
            and "--kv-transfer-config" in container_of(d).args
            and s.spec.selector == svc.spec.selector
            and children(api_client, ns, name) == expected(name, g)
        )

    wait_for(repaired, T, what="children repaired")
    assert deployment(api_client, ns, f"{name}-decode-{g}").metadata.uid == dep.metadata.uid
    wait_ready(api_client, ns, name)


def test_a_spec_change_updates_and_prunes_without_a_timer(
    quiet_operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "respec"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    g = serving(api_client, ns, name)
    patch_spec(api_client, ns, name, {"decode": {"replicas": 2}})  # not in the engines' templates: in place
    wait_for(
        lambda: children(api_client, ns, name) == expected(name, g, PodDisruptionBudget=["{n}-decode-{g}"]),
        T,
        what="PDB",
    )
    cr = wait_cr(api_client, ns, name, lambda c: c["status"]["decode"]["summary"] == "2/2", "decode 2/2")
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    patch_spec(api_client, ns, name, {"decode": {"replicas": 1}})
    wait_for(lambda: children(api_client, ns, name) == expected(name, g), T, what="PDB pruned")
    wait_cr(api_client, ns, name, lambda c: c["status"]["decode"]["summary"] == "1/1", "decode 1/1")


def test_an_idle_operator_writes_nothing_over_two_safety_resyncs(
    crd: None, kubeconfig: Path, namespace: str, tmp_path: Path, api_client: client.ApiClient
) -> None:
    ns, resync = namespace, 2.0
    op = Operator(kubeconfig, ns, tmp_path / "operator.log", resync=str(resync), extra=NO_TIMER)
    op.start()
    try:
        names = [f"idle-{i}" for i in range(3)]
        for n in names:
            create(api_client, ns, seed(n))
        for n in names:
            wait_ready(api_client, ns, n)
        # settled: every CR's status is for its generation and Ready, and the operator's queue is empty
        for n in names:
            wait_cr(
                api_client, ns, n, lambda c: c["status"].get("observedGeneration") == c["metadata"]["generation"], n
            )

        def settled() -> bool:
            m = op_metrics(op)
            return m.get("workqueue_depth") == 0.0 and m.get("controller_runtime_active_workers") == 0.0

        wait_for(settled, T, what="the work queue drained")
        # earlier tests' namespaces are torn down in the background (the namespace controller and the garbage
        # collector delete their objects): the apiserver's count is cluster-wide, so wait for that to end
        try:
            wait_for(lambda: not terminating(api_client), 300, what="no namespace Terminating")
        except Exception as e:  # say which namespace and why (its conditions name what blocks its deletion)
            raise AssertionError(f"{e}: {stuck_namespaces(api_client)}") from e
        own_before = op_metrics(op)
        resyncs_before = own_before["workqueue_adds_total"]
        events_before = ns_events(api_client, ns)
        before = requests(kubeconfig)
        hold_until = time.monotonic() + 2.5 * resync  # spans at least two safety resyncs
        while time.monotonic() < hold_until:
            assert op.proc is not None and op.proc.poll() is None, "operator exited"
            time.sleep(0.25)
        after = requests(kubeconfig)
        adds = op_metrics(op)["workqueue_adds_total"] - resyncs_before
        assert adds >= 2 * len(names), f"only {adds} queue adds: the safety resync did not run twice"
        own = {"all": op_metrics(op)["hpd_operator_api_requests_total"]}
        assert writes(before, after) == {}, writes(before, after)
        assert ns_events(api_client, ns) == events_before
        # and by the operator's own count: no request at all from its reconcile client (kopf's watches aside)
        assert own["all"] == own_before["hpd_operator_api_requests_total"], (own, own_before)

        # the count sees the operator's writes: a deleted child is re-applied (one APPLY on services)
        g = serving(api_client, ns, names[0])
        client.CoreV1Api(api_client).delete_namespaced_service(f"{names[0]}-prefill-{g}", ns)
        wait_for(lambda: children(api_client, ns, names[0]) == expected(names[0], g), T, what="Service back")
        assert writes(after, requests(kubeconfig)).get("APPLY services", 0) >= 1
        assert cond(get_cr(api_client, ns, names[0]), "Ready")["status"] == "True"
    finally:
        op.stop()


def terminating(api: client.ApiClient) -> list[str]:
    return [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items if n.status.phase == "Terminating"]


def stuck_namespaces(api: client.ApiClient) -> dict[str, list[str]]:
    """Terminating namespace -> its True conditions (what blocks its deletion) and what is left in it."""
    out: dict[str, list[str]] = {}
    for n in client.CoreV1Api(api).list_namespace().items:
        if n.status.phase != "Terminating":
            continue
        conds = [f"{c.type}: {c.message}" for c in (n.status.conditions or []) if c.status == "True"]
        pods = client.CoreV1Api(api).list_namespaced_pod(n.metadata.name).items
        out[n.metadata.name] = conds + [f"pod {p.metadata.name} on {p.spec.node_name}" for p in pods]
    return out


def ns_events(api: client.ApiClient, ns: str) -> dict[str, tuple[int, str]]:
    """Event name -> (count, last timestamp) in `ns`."""
    evs = client.CoreV1Api(api).list_namespaced_event(ns).items
    return {e.metadata.name: (e.count or 0, str(e.last_timestamp or e.event_time)) for e in evs}


def op_metrics(op: Operator) -> dict[str, float]:
    """The operator's own /metrics, summed by sample name (label values dropped)."""
    return operator_metrics(op.metrics_port)


def test_no_finalizer_and_no_annotation_on_the_cr(
    quiet_operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    """Event handlers write nothing on the CR but its status; children carry the desired-hash annotation."""
    ns, name = namespace, "plain"
    create(api_client, ns, seed(name))
    cr = wait_ready(api_client, ns, name)
    assert not cr["metadata"].get("finalizers")
    assert not [k for k in cr["metadata"].get("annotations") or {} if k.startswith(contract.GROUP)]
    dep = engine_deployment(api_client, ns, name, "decode")
    assert len(dep.metadata.annotations[contract.ANNOTATION_DESIRED_HASH]) == 32


def test_security_settings_added_to_a_child_by_hand_are_taken_back_once(
    quiet_operator: Operator, kubeconfig: Path, api_client: client.ApiClient, namespace: str
) -> None:
    """Issue #32 item 3: `hostNetwork`, `hostPID`, `privileged`, an added capability, root or an unconfined seccomp
    profile written into a child by hand is drift like any other (the operator owns those fields: it writes them out, builders/common.py), and the
    repair does not loop (the apiserver stores the false booleans as absent or false, which drift.mismatch reads as
    equal): once the pods have rolled, the operator applies no child again."""
    ns, name = namespace, "sec"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    decode = f"{name}-decode-{serving(api_client, ns, name)}"
    escalate = {
        "spec": {
            "template": {
                "spec": {
                    "hostNetwork": True,
                    "hostPID": True,
                    "hostIPC": True,
                    "containers": [
                        {
                            "name": "vllm",
                            "env": [{"name": "HAND_ADDED", "value": "1"}],  # #37: an env entry added by hand goes too
                            "securityContext": {
                                "privileged": True,
                                "allowPrivilegeEscalation": True,
                                "capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]},
                                "runAsNonRoot": False,
                                "runAsUser": 0,
                                "seccompProfile": {"type": "Unconfined"},
                            },
                        }
                    ],
                }
            }
        }
    }
    out = kubectl(kubeconfig, "-n", ns, "patch", "deployment", decode, "-p", json.dumps(escalate), "-o", "json")
    patched = json.loads(out.stdout)["spec"]["template"]["spec"]  # what the patch stored (the operator reacts at once)
    assert patched["hostNetwork"] and patched["containers"][0]["securityContext"]["privileged"]
    assert {"name": "HAND_ADDED", "value": "1"} in patched["containers"][0]["env"]
    router_patch = {"spec": {"template": {"spec": {"hostNetwork": True, "containers": [{"name": "router",
                    "securityContext": {"privileged": True, "allowPrivilegeEscalation": True}}]}}}}  # fmt: skip
    kubectl(kubeconfig, "-n", ns, "patch", "deployment", f"{name}-router", "-p", json.dumps(router_patch))

    def contained(dep: str) -> bool:
        pod = deployment(api_client, ns, dep).spec.template.spec
        sc = pod.containers[0].security_context
        return (
            not [e for e in pod.containers[0].env or [] if e.name == "HAND_ADDED"]
            and not pod.host_network
            and not pod.host_pid
            and not pod.host_ipc
            and sc.privileged is False
            and sc.allow_privilege_escalation is False
            and not (sc.capabilities.add or [])
            and sc.capabilities.drop == ["ALL"]
            and sc.run_as_non_root is True
            and sc.run_as_user == contract.IMAGE_UID
            and sc.seccomp_profile.type == "RuntimeDefault"
        )

    wait_for(lambda: contained(decode) and contained(f"{name}-router"), T, what="the hand edits reverted")

    def rolled_out(dep: str) -> bool:  # the edit and its revert each rolled the pods: let that finish first
        d = deployment(api_client, ns, dep)
        st = d.status
        return bool(
            st.observed_generation == d.metadata.generation
            and st.updated_replicas == st.replicas == st.ready_replicas == d.spec.replicas
        )

    wait_for(lambda: rolled_out(decode) and rolled_out(f"{name}-router"), 90, what="the rollouts done")
    wait_ready(api_client, ns, name)

    def applied() -> float:
        return op_metrics(quiet_operator)["hpd_operator_objects_applied_total"]

    def settled() -> bool:
        m = op_metrics(quiet_operator)
        return m.get("workqueue_depth") == 0.0 and m.get("controller_runtime_active_workers") == 0.0

    wait_for(settled, T, what="the work queue drained")
    before = applied()
    hold_until = time.monotonic() + 5
    while time.monotonic() < hold_until:  # pod and status events keep coming in; no child is applied again
        assert applied() == before, "the repair repeats"
        time.sleep(0.5)
