"""Containment and safe defaults against the REAL local control plane: one broken CR never hurts another, whatever
the apiserver accepts ends in children or a condition naming the field, nothing is taken over, Events are
aggregated, status tells the truth about scheduling and lost nodes, and the pods pass Pod Security `restricted`.

kwok runs no network plugin, so NetworkPolicies are applied and checked for content here, not enforced."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import (
    RESYNC,
    T,
    children,
    cond,
    container_of,
    cr_warnings,
    create,
    deployment,
    engine_deployment,
    expected,
    generation,
    get_cr,
    hold,
    patch_spec,
    seed,
    serving,
    wait_cr,
    wait_ready,
)

pytestmark = pytest.mark.cluster
ROUNDS = 4 * float(RESYNC)
"""How long a negative claim is held: several resync rounds."""


def warnings(api: client.ApiClient, ns: str, name: str) -> list[client.CoreV1Event]:
    return cr_warnings(api, ns, name)


def test_a_broken_cr_is_its_own_problem_and_the_others_are_still_served(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns = namespace
    # the first of these the CRD accepts: a builder raises on the first, the apiserver refuses the others' Deployments
    bad_env = [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s"}}}]
    for field, value in (
        ("decode.podTemplate", {"metadata": {"labels": "oops"}}),
        ("decode.affinity", {"nodeAffinity": "oops"}),
        ("env", bad_env),
    ):
        broken = seed("broken")
        parent, _, key = ("spec." + field).rpartition(".")
        node = broken
        for part in parent.split("."):
            node = node[part]
        node[key] = value
        try:
            create(api_client, ns, broken)
            break
        except client.ApiException as e:
            assert e.status == 422, e
    else:
        pytest.fail("the CRD rejects every malformed input this test knows: give it one the schema still accepts")
    create(api_client, ns, seed("healthy"))
    wait_ready(api_client, ns, "healthy")
    cr = wait_cr(api_client, ns, "broken", lambda c: cond(c, "Ready").get("reason") is not None, "broken status")
    ready = cond(cr, "Ready")
    assert ready["status"] == "False" and ready["reason"] in ("ReconcileError", "ApplyFailed"), ready
    assert f"spec.{field}" in ready["message"] or "Deployment broken-" in ready["message"], ready
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    assert cr["status"]["phase"] == "Failed"

    # drift on the healthy CR is corrected as usual while the broken one fails every round
    apps = client.AppsV1Api(api_client)
    healthy = f"healthy-decode-{serving(api_client, ns, 'healthy')}"
    dep = deployment(api_client, ns, healthy)
    body = copy.deepcopy(dep)
    body.spec.replicas = 4
    apps.replace_namespaced_deployment(healthy, ns, body)
    t0 = time.monotonic()
    wait_for(lambda: deployment(api_client, ns, healthy).spec.replicas == 1, T, what="drift corrected")
    print(f"drift corrected beside a broken CR in {time.monotonic() - t0:.1f} s (resync {RESYNC} s)")
    wait_ready(api_client, ns, "healthy")

    # one Warning Event for the broken CR, however many rounds fail the same way
    wait_for(lambda: len(warnings(api_client, ns, "broken")) == 1, T, what="one Warning Event")

    def quiet() -> bool:
        ws = warnings(api_client, ns, "broken")
        return len(ws) == 1 and (ws[0].count or 1) == 1

    hold(quiet, ROUNDS, "exactly one Warning Event on the broken CR, count 1")
    # nothing the failure is about exists: a builder crash applies nothing; an apiserver refusal (the env case, which
    # only the engines carry) leaves out the refused engine Deployments while the rest are applied
    made = children(api_client, ns, "broken")["Deployment"]
    assert not [d for d in made if d.startswith(("broken-prefill-", "broken-decode-"))], made
    assert not warnings(api_client, ns, "healthy")


def test_a_child_the_apiserver_refuses_becomes_a_condition_naming_it_and_the_field(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "refused"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    g1 = serving(api_client, ns, name)
    # the refusal's Events are the ones posted after the patch (a role's passing problem while generation 1 came up
    # on a loaded machine, a RolloutFailed or NotScheduled, is an Event of its own and not this test's subject)
    before = {e.metadata.name for e in warnings(api_client, ns, name)}

    def refusal_events() -> list[client.CoreV1Event]:
        return [e for e in warnings(api_client, ns, name) if e.metadata.name not in before]

    # accepted by the CRD (valueFrom is a free-form EnvVarSource), refused by the apiserver for the Deployments
    patch_spec(api_client, ns, name, {"env": [{"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s"}}}]})

    def refused(c: dict[str, Any]) -> bool:
        st = c.get("status") or {}
        return st.get("observedGeneration") == c["metadata"]["generation"] and cond(c, "Ready").get("reason") == (
            "ApplyFailed"
        )

    cr = wait_cr(api_client, ns, name, refused, "ApplyFailed at the new generation", timeout=15)
    msg = cond(cr, "Ready")["message"]
    assert f"Deployment {name}-prefill-" in msg and "secretKeyRef.key" in msg, msg
    assert cond(cr, "Ready")["status"] == "False" and cond(cr, "Degraded")["reason"] == "ApplyFailed"
    assert cr["status"]["phase"] == "Failed"
    wait_for(lambda: [e.reason for e in refusal_events()] == ["ApplyFailed"], T, what="one Event")
    hold(lambda: len(refusal_events()) == 1, ROUNDS, "no Event storm")
    # nothing was pruned on the failed round (generation 1 serves on; the new generation's Services, which the
    # apiserver took, stay until a round converges), and a fix converges again
    now = children(api_client, ns, name)
    assert all(set(v) <= set(now[k]) for k, v in expected(name, g1).items()), now
    assert [d for d in now["Deployment"] if not d.endswith(("-router", g1))] == [], now
    assert serving(api_client, ns, name) == g1
    fixed = {"env": [{"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    patch_spec(api_client, ns, name, fixed)
    doc = seed(name)
    doc["spec"].update(fixed)
    g3 = generation(doc, ns)
    wait_for(lambda: children(api_client, ns, name) == expected(name, g3), T, what="only the fixed generation")
    wait_ready(api_client, ns, name)


def test_secret_env_and_non_bmp_text_deploy_as_written(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "envs"
    doc = seed(name)
    doc["spec"]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token", "optional": True}}},
        {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k", "optional": True}}},
        {
            "name": "MEM",
            "valueFrom": {"resourceFieldRef": {"containerName": "vllm", "resource": "requests.cpu"}},
        },
        {"name": "GREETING", "value": "h\u00e9llo \U0001f680 \U0001d518"},
    ]
    create(api_client, ns, doc)
    wait_ready(api_client, ns, name)
    for role in contract.ROLES:
        env = {e.name: e for e in container_of(engine_deployment(api_client, ns, name, role)).env}
        assert env["TOKEN"].value_from.secret_key_ref.name == "creds" and env["TOKEN"].value_from.field_ref is None
        assert env["CFG"].value_from.config_map_key_ref.key == "k"
        assert env["MEM"].value_from.resource_field_ref.resource == "requests.cpu"
        assert env["GREETING"].value == "h\u00e9llo \U0001f680 \U0001d518"
    assert not warnings(api_client, ns, name)


def test_a_name_held_by_an_object_we_do_not_own_is_reported_not_taken_over(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "own"
    core = client.CoreV1Api(api_client)
    held = f"{name}-prefill-{generation(seed(name), ns)}"  # generation 1's prefill Service
    mine = client.V1Service(
        metadata=client.V1ObjectMeta(name=held, labels={"team": "someone-else"}),
        spec=client.V1ServiceSpec(selector={"app": "theirs"}, ports=[client.V1ServicePort(port=1234)]),
    )
    core.create_namespaced_service(ns, mine)
    create(api_client, ns, seed(name))
    cr = wait_cr(
        api_client, ns, name, lambda c: cond(c, "Ready").get("reason") == "OwnershipConflict", "OwnershipConflict"
    )
    assert f"Service {held} exists and is not owned by any object" in cond(cr, "Ready")["message"]

    def untouched() -> bool:
        svc = core.read_namespaced_service(held, ns)
        return (
            not svc.metadata.owner_references
            and svc.spec.selector == {"app": "theirs"}
            and [p.port for p in svc.spec.ports] == [1234]
            and contract.LABEL_INSTANCE not in (svc.metadata.labels or {})
        )

    hold(untouched, ROUNDS, "the foreign Service is left as it was")
    wait_for(lambda: [e.reason for e in warnings(api_client, ns, name)] == ["OwnershipConflict"], T, what="Event")
    # the other children are there; once the foreign object is gone, the CR converges
    decode = deployment(api_client, ns, held.replace("-prefill-", "-decode-"))
    assert decode.metadata.owner_references[0].uid == cr["metadata"]["uid"]
    core.delete_namespaced_service(held, ns)
    wait_ready(api_client, ns, name)
    assert children(api_client, ns, name) == expected(name, generation(seed(name), ns))


def test_two_crs_whose_children_collide_never_take_turns(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns = namespace
    create(api_client, ns, seed("a"))
    first = wait_ready(api_client, ns, "a")
    try:
        create(api_client, ns, seed("a-prefill"))  # its endpoint Service `a-prefill` is a's prefill Service
    except client.ApiException as e:  # a CRD rule on metadata.name may reject it up front: also no takeover
        assert e.status == 422, e
        return
    cr = wait_cr(
        api_client, ns, "a-prefill", lambda c: cond(c, "Ready").get("reason") == "OwnershipConflict", "conflict"
    )
    assert "Service a-prefill exists and is owned by HybridPDDeployment a" in cond(cr, "Ready")["message"]
    core = client.CoreV1Api(api_client)

    def still_a() -> bool:
        svc = core.read_namespaced_service("a-prefill", ns)
        return [r.uid for r in svc.metadata.owner_references] == [first["metadata"]["uid"]] and (
            svc.spec.cluster_ip == "None"
        )

    hold(still_a, ROUNDS, "Service a-prefill stays a's")
    assert cond(get_cr(api_client, ns, "a"), "Ready")["status"] == "True"


@pytest.fixture()
def spare_node(api_client: client.ApiClient, devcluster: Any) -> Iterator[str]:
    """One extra kwok GPU node only this test schedules onto (label hybridpd.test/node=<name>)."""
    from hpd_devcluster import cluster

    name = f"spare-{uuid.uuid4().hex[:8]}"
    node = cluster._node_manifest(name, cluster.NodePool())
    node["metadata"]["labels"]["hybridpd.test/node"] = name
    cluster.api(devcluster, "POST", "/api/v1/nodes", node)
    core = client.CoreV1Api(api_client)
    yield name
    try:
        core.delete_node(name)
    except client.ApiException as e:
        if e.status != 404:
            raise


def test_a_lost_node_drops_ready_promptly_with_the_reason(
    operator: Operator, api_client: client.ApiClient, namespace: str, spare_node: str
) -> None:
    ns, name = namespace, "lost"
    doc = seed(name)
    doc["spec"]["decode"]["nodeSelector"] = {"hybridpd.test/node": spare_node}
    create(api_client, ns, doc)
    wait_ready(api_client, ns, name, timeout=60)
    client.CoreV1Api(api_client).delete_node(spare_node)
    t0 = time.monotonic()
    cr = wait_cr(api_client, ns, name, lambda c: cond(c, "Ready").get("status") == "False", "Ready=False", timeout=20)
    print(f"Ready dropped {time.monotonic() - t0:.1f} s after the node was deleted (resync {RESYNC} s)")
    assert cond(cr, "Degraded")["status"] == "True"
    # the decode pods' node is gone, prefill is Ready: degraded mode serves on prefill and says why
    assert cond(cr, "Degraded")["reason"] in ("NodeLost", "Unschedulable", "DecodeUnavailable"), cond(cr, "Degraded")
    # the replacement pod cannot go anywhere (its nodeSelector names the lost node): the scheduler says so
    cr = wait_cr(
        api_client, ns, name, lambda c: cond(c, "DecodeReady").get("reason") == "Unschedulable", "unsched", timeout=90
    )
    assert "node affinity/selector" in cond(cr, "DecodeReady")["message"]
    assert cond(cr, "WarmedUp")["status"] == "False" and cr["status"]["phase"] == "Degraded"


@pytest.fixture()
def restricted_namespace(api_client: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api_client)
    name = f"r-{uuid.uuid4().hex[:10]}"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    # pods are refused until the ServiceAccount controller made `default` (tests/conftest.py's namespace waits too)
    wait_for(lambda: core.read_namespaced_service_account("default", name), 60, what="default ServiceAccount")
    yield name
    core.delete_namespace(name)


def test_sample_cr_is_admitted_in_a_pod_security_restricted_namespace(
    crd: None, kubeconfig: Path, api_client: client.ApiClient, restricted_namespace: str, tmp_path: Path
) -> None:
    ns = restricted_namespace
    core = client.CoreV1Api(api_client)
    # the admission plugin is live: a privileged pod is refused here
    bad = client.V1Pod(
        metadata=client.V1ObjectMeta(name="privileged"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(name="c", image="x", security_context=client.V1SecurityContext(privileged=True))
            ]
        ),
    )
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod(ns, bad)
    assert refused.value.status == 403 and "restricted" in str(refused.value.body)

    op = Operator(kubeconfig, ns, tmp_path / "operator.log")
    op.start()
    try:
        name = "nemotron-3-nano"
        create(api_client, ns, seed(name))
        wait_ready(api_client, ns, name, timeout=60)
        pods = core.list_namespaced_pod(ns, label_selector=f"{contract.LABEL_INSTANCE}={name}").items
        assert sorted(p.metadata.labels[contract.LABEL_COMPONENT] for p in pods) == ["decode", "prefill", "router"]
        rs = client.AppsV1Api(api_client).list_namespaced_replica_set(ns).items
        for r in rs:
            assert not [c for c in (r.status.conditions or []) if c.type == "ReplicaFailure"], r.status.conditions
        for p in pods:  # a token only where the pod calls the API: the router's discovery, decode's KV path Event
            comp = p.metadata.labels[contract.LABEL_COMPONENT]
            assert p.spec.automount_service_account_token is (comp in ("router", "decode")), comp
            if comp == "decode":
                assert p.spec.service_account_name == f"{name}-kv-reporter"
    except BaseException:
        print(f"--- operator log ---\n{op.log.read_text(errors='replace')[-20000:]}")
        raise
    finally:
        op.stop()


def test_network_policies_are_applied_with_their_rules(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    """kwok has no network plugin: this checks what the apiserver stores, not enforcement."""
    ns, name = namespace, "np"
    doc = seed(name)
    doc["spec"]["networkPolicy"] = {"restrictEgress": True}
    create(api_client, ns, doc)
    wait_ready(api_client, ns, name)
    net = client.NetworkingV1Api(api_client)
    eng = net.read_namespaced_network_policy(f"{name}-engines", ns)
    assert eng.metadata.owner_references[0].name == name
    assert eng.spec.policy_types == ["Ingress", "Egress"]
    router_rule, peers, prom = eng.spec.ingress
    assert router_rule._from[0].pod_selector.match_labels == {
        contract.LABEL_INSTANCE: name,
        contract.LABEL_COMPONENT: contract.COMPONENT_ROUTER,
    }
    assert [p.port for p in router_rule.ports] == ["http"] and peers.ports is None
    assert [p.port for p in prom.ports] == ["runtime"]
    assert {(p.protocol, p.port) for p in eng.spec.egress[0].ports} == {("UDP", 53), ("TCP", 53)}
    rt = net.read_namespaced_network_policy(f"{name}-router", ns)
    assert rt.spec.policy_types == ["Ingress"] and [p.port for p in rt.spec.ingress[1].ports] == ["metrics"]
    # turning it off prunes both
    patch_spec(api_client, ns, name, {"networkPolicy": {"enabled": False}})
    wait_for(lambda: children(api_client, ns, name)["NetworkPolicy"] == [], T, what="NetworkPolicies pruned")
