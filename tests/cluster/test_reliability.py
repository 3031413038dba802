"""Fault drills on the real control plane (issue 15, item 3): the operator SIGKILLed 20 times during a burst of 50
CRs created, updated and deleted; kube-apiserver restarted under a running operator; a kwok node with decode pods
deleted; a prefill pod replaced. Each drill ends in exact claims about children and status, waited for with
deadlines (no wall-clock asserts); the times they took are printed as `DRILL name key=value ...` lines (and appended
as JSON lines to $HPD_DRILL_RESULTS when it is set). Every process and node a drill starts is stopped or deleted
by its fixtures."""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from hpd_devcluster import cluster
from hpd_devcluster.testing import wait_for
from hpd_operator.render import render
from hpd_runtime import contract

from .conftest import Operator
from .kube import (
    EXPECTED,
    G,
    P,
    T,
    V,
    child_listers,
    children,
    cond,
    create,
    deployment,
    engine_deployment,
    expected,
    generation,
    get_cr,
    hold,
    patch_spec,
    seed,
    wait_cr,
)

pytestmark = pytest.mark.cluster

QUIET_RESYNC = "3600"
"""No safety resync during a drill: everything it checks must come from watch events (the default is 300 s)."""
POOL_LABEL = "hybridpd.test/pool"
TAINT = {"key": "hybridpd.test/drill", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": "hybridpd.test/drill", "operator": "Exists", "effect": "NoSchedule"}
CHILD_KINDS = tuple(EXPECTED)


def record(drill: str, **figures: float | int | str) -> None:
    """One result line per drill: printed (pytest -s / -rA shows it) and appended to $HPD_DRILL_RESULTS."""
    shown = " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    print(f"DRILL {drill} {shown}", flush=True)
    out = os.environ.get("HPD_DRILL_RESULTS")
    if out:
        with Path(out).open("a") as f:
            f.write(json.dumps({"drill": drill, **figures}) + "\n")


# --- fixtures ------------------------------------------------------------------------------------------------
class Nodes:
    """kwok GPU nodes made for one test, tainted so that only pods with `TOLERATION` (the roles a drill places
    there) run on them; deleted at the test's end, whatever is left."""

    def __init__(self, state: cluster.ClusterState) -> None:
        self.state = state
        self.names: list[str] = []

    def add(self, labels: dict[str, str], pool: cluster.NodePool | None = None) -> str:
        name = f"drill-{uuid.uuid4().hex[:8]}"
        cluster.add_node(self.state, name, pool, labels, [TAINT])
        self.names.append(name)
        return name

    def delete(self, name: str) -> None:
        cluster.delete_node(self.state, name)


def scheduler_sees_cordon(core: client.CoreV1Api, ns: str, pool: str) -> None:
    """The scheduler reads a cordon from its informer: a pod created right after the patch can still land on the
    node (it did once in CI, and kwok then made the "held" replacement Ready at once). A sentinel pod for the same
    pool reported Unschedulable proves the scheduler's cache has the cordon; one scheduled before that is retried."""

    def unschedulable_sentinel() -> bool:
        name = f"sentinel-{uuid.uuid4().hex[:6]}"
        spec = {"nodeSelector": {POOL_LABEL: pool}, "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "sentinel"}]}  # fmt: skip
        core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
        try:

            def decided() -> str:
                pod = core.read_namespaced_pod(name, ns)
                if pod.spec.node_name:
                    return "scheduled"
                conds = pod.status.conditions or []
                return (
                    "unschedulable"
                    if any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds)
                    else ""
                )

            return bool(wait_for(decided, T, what=f"the scheduler's verdict on {name}") == "unschedulable")
        finally:
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)

    wait_for(unschedulable_sentinel, 3 * T, interval=0.2, what=f"the scheduler to see the cordon of pool {pool}")


def place(spec: dict[str, Any], role: str, pool: str) -> None:
    """Put `role`'s pods on the drill nodes labelled `pool` (and only there)."""
    spec[role]["nodeSelector"] = {POOL_LABEL: pool}
    spec[role]["tolerations"] = [TOLERATION]


@pytest.fixture()
def nodes(devcluster: cluster.ClusterState, api_client: client.ApiClient) -> Iterator[Nodes]:
    """Listed first by the tests, so it ends after their namespace was deleted: the pods still bound to its nodes
    are deleted at once (kwok stops finishing them once their node is gone), then the nodes."""
    made = Nodes(devcluster)
    yield made
    core = client.CoreV1Api(api_client)
    for name in made.names:
        for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
            try:
                core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
            except client.ApiException as e:
                if e.status != 404:
                    raise
        cluster.delete_node(devcluster, name)


@pytest.fixture()
def make_operator(
    crd: None, kubeconfig: Path, namespace: str, tmp_path: Path, operator_logs: list[Path]
) -> Iterator[Callable[[str], Operator]]:
    """Start operators with a chosen resync interval; all stopped at the end, their logs printed if the test failed."""
    started: list[Operator] = []

    def start(resync: str) -> Operator:
        op = Operator(kubeconfig, namespace, tmp_path / f"operator-{len(started)}.log", resync=resync)
        operator_logs.append(op.log)
        op.start()
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()


def wait_ready_node(api: client.ApiClient, name: str) -> None:
    def ready() -> bool:
        conds = client.CoreV1Api(api).read_node(name).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conds)

    wait_for(ready, T, what=f"node {name} Ready")


def pods_of(api: client.ApiClient, ns: str, name: str, component: str) -> list[client.V1Pod]:
    sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}={component}"
    return [
        p
        for p in client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=sel).items
        if p.metadata.deletion_timestamp is None
    ]


def pod_ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def brief(cr: dict[str, Any]) -> dict[str, Any]:
    """The parts of a CR's status a failure message needs (the whole status repeats the profile)."""
    st = cr.get("status") or {}
    conds = {c["type"]: f"{c['status']} {c.get('reason')}: {c.get('message')}" for c in st.get("conditions") or []}
    roles = {r: (st.get(r) or {}).get("summary") for r in (*contract.ROLES, contract.COMPONENT_ROUTER)}
    return {"generation": cr["metadata"].get("generation"), "observedGeneration": st.get("observedGeneration"),
            "phase": st.get("phase"), **roles, "conditions": conds}  # fmt: skip


def is_ready(cr: dict[str, Any]) -> bool:
    return cond(cr, "Ready").get("status") == "True" and cr["status"].get("observedGeneration") == cr["metadata"].get(
        "generation"
    )


# --- 1. SIGKILL storm ----------------------------------------------------------------------------------------
CRS, KILLS = 50, 20
UPDATES, DELETES, RECREATES = 30, 12, 4
KILL_GAP = (1.0, 3.0)  # seconds between two kills


@dataclass
class Op:
    verb: str  # create | update | delete
    name: str
    spec: dict[str, Any] = field(default_factory=dict)  # create: the whole spec; update: the merge patch


@dataclass
class Model:
    """What the test asked for: the spec of every CR that should exist."""

    pool: str
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def doc(self, name: str, ns: str) -> dict[str, Any]:
        return {
            "apiVersion": f"{G}/{V}",
            "kind": contract.KIND,
            "metadata": {"name": name, "namespace": ns},
            "spec": self.specs[name],
        }


def drill_spec(pool: str) -> dict[str, Any]:
    """The seed at TP 1 (50 CRs fit the drill's nodes), engines on the drill's nodes only."""
    spec: dict[str, Any] = seed()["spec"]
    for role in contract.ROLES:
        spec[role]["tensorParallelSize"] = 1
        place(spec, role, pool)
    return spec


def plan(rng: random.Random, pool: str) -> tuple[list[Op], Model]:
    """A random interleaving of 50 creates, 30 spec changes that change children (decode replicas 1 <-> 2: a PDB
    comes and goes; an extra env var: both engine Deployments roll), 12 deletes and 4 re-creates of a deleted name
    (its new children must belong to the new CR, not to the old one the garbage collector is still deleting)."""
    model = Model(pool)
    pending = [f"drill-{i:02d}" for i in range(CRS)]
    rng.shuffle(pending)
    deleted: list[str] = []
    left = {"create": CRS, "update": UPDATES, "delete": DELETES, "recreate": RECREATES}
    ops: list[Op] = []
    revision = 0
    while any(left.values()):
        live = sorted(model.specs)
        can = {
            "create": left["create"] > 0,
            "update": left["update"] > 0 and bool(live),
            "delete": left["delete"] > 0 and len(live) > 1,
            "recreate": left["recreate"] > 0 and bool(deleted),
        }
        verbs = [v for v, ok in can.items() if ok]
        verb = rng.choices(verbs, weights=[left[v] for v in verbs])[0]
        left[verb] -= 1
        if verb in ("create", "recreate"):
            name = pending.pop() if verb == "create" else deleted.pop(rng.randrange(len(deleted)))
            model.specs[name] = drill_spec(pool)
            ops.append(Op("create", name, json.loads(json.dumps(model.specs[name]))))
        elif verb == "update":
            name = rng.choice(live)
            spec = model.specs[name]
            if rng.random() < 0.5:
                patch: dict[str, Any] = {"decode": {"replicas": 3 - spec["decode"]["replicas"]}}
                spec["decode"]["replicas"] = patch["decode"]["replicas"]
            else:
                revision += 1
                patch = {"env": [{"name": "DRILL_REVISION", "value": str(revision)}]}
                spec["env"] = patch["env"]
            ops.append(Op("update", name, patch))
        else:
            name = rng.choice(live)
            del model.specs[name]
            deleted.append(name)
            ops.append(Op("delete", name))
    return ops, model


def execute(api: client.ApiClient, ns: str, op: Op) -> None:
    if op.verb == "create":
        create(
            api, ns, {"apiVersion": f"{G}/{V}", "kind": contract.KIND, "metadata": {"name": op.name}, "spec": op.spec}
        )
    elif op.verb == "update":
        patch_spec(api, ns, op.name, op.spec)
    else:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(G, V, ns, P, op.name)


def mismatches(api: client.ApiClient, ns: str, model: Model) -> list[str]:
    """Every way the namespace differs from `model` once converged: CRs, their status, every child of every kind
    (exact names, owner = the live CR's uid, the spec's replicas and env), ReplicaSets and pods (one active
    ReplicaSet per Deployment, exactly the desired pods), and anything whose owner is gone."""
    crs = {c["metadata"]["name"]: c for c in client.CustomObjectsApi(api).list_namespaced_custom_object(G, V, ns, P)["items"]}  # fmt: skip
    out = [f"CRs {sorted(crs)} != {sorted(model.specs)}"] if set(crs) != set(model.specs) else []
    uids = {n: c["metadata"]["uid"] for n, c in crs.items()}
    for name, cr in sorted(crs.items()):
        out += status_mismatches(name, cr, model.specs.get(name))
    live = children_in(api, ns)
    for (kind, instance), objs in sorted(live.items()):
        for o in objs:
            owner = [r["uid"] for r in o["metadata"].get("ownerReferences") or [] if r.get("controller")]
            if instance not in model.specs or owner != [uids.get(instance)]:
                out.append(
                    f"orphan {kind} {o['metadata']['name']}: owner {owner}, CR {instance} uid {uids.get(instance)}"
                )
    for name in sorted(model.specs):
        want = want_children(model.doc(name, ns))
        got = {k: sorted(o["metadata"]["name"] for o in live.get((k, name), [])) for k in CHILD_KINDS}
        if got != want:
            out.append(f"{name} children {got} != {want}")
        out += deployment_mismatches(name, live, model.specs[name])
    out += workload_mismatches(api, ns, model, live)
    return out


def status_mismatches(name: str, cr: dict[str, Any], spec: dict[str, Any] | None) -> list[str]:
    if spec is None:
        return []
    st, gen = cr.get("status") or {}, cr["metadata"]["generation"]
    out = []
    if st.get("observedGeneration") != gen:
        out.append(f"{name} observedGeneration {st.get('observedGeneration')} != generation {gen}")
    if cond(cr, "Ready").get("status") != "True" or st.get("phase") != "Ready":
        out.append(f"{name} not Ready: {brief(cr)}")
    stale = [c["type"] for c in st.get("conditions") or [] if c.get("observedGeneration") != gen]
    if stale:
        out.append(f"{name} conditions of an older generation: {stale}")
    for role in contract.ROLES:
        r = spec[role]["replicas"]
        if (st.get(role) or {}).get("summary") != f"{r}/{r}":
            out.append(f"{name} status.{role}.summary {(st.get(role) or {}).get('summary')} != {r}/{r}")
    return out


def children_in(api: client.ApiClient, ns: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every object of the child kinds labelled managed-by us, by (kind, instance label)."""
    sel = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for kind, lister in child_listers(api).items():
        for o in lister(ns, label_selector=sel).items:
            d = api.sanitize_for_serialization(o)
            out[(kind, d["metadata"]["labels"].get(contract.LABEL_INSTANCE, ""))].append(d)
    return out


def want_children(doc: dict[str, Any]) -> dict[str, list[str]]:
    """The children the operator's own builders make for this spec (PodMonitors are skipped: not served here)."""
    got: dict[str, list[str]] = {k: [] for k in CHILD_KINDS}
    for m in render([doc]):
        if m["kind"] in got:
            got[m["kind"]].append(m["metadata"]["name"])
    return {k: sorted(v) for k, v in got.items()}


def deployment_mismatches(
    name: str, live: dict[tuple[str, str], list[dict[str, Any]]], spec: dict[str, Any]
) -> list[str]:
    out = []
    deps = live.get(("Deployment", name), [])
    want_env = {e["name"]: e["value"] for e in spec.get("env", [])}
    for role in contract.ROLES:
        # `<name>-<role>-<generation>`: one generation of each role once converged (more, or a wrong one, is
        # reported with the children: want_children names the spec's generation)
        found = [d for d in deps if d["metadata"]["name"].startswith(f"{name}-{role}-")]
        if len(found) != 1:
            continue
        (dep,) = found
        if dep["spec"]["replicas"] != spec[role]["replicas"]:
            out.append(f"{name}-{role} replicas {dep['spec']['replicas']} != {spec[role]['replicas']}")
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        if env.get("DRILL_REVISION") != want_env.get("DRILL_REVISION"):
            out.append(f"{name}-{role} DRILL_REVISION {env.get('DRILL_REVISION')} != {want_env.get('DRILL_REVISION')}")
    return out


def workload_mismatches(
    api: client.ApiClient, ns: str, model: Model, live: dict[tuple[str, str], list[dict[str, Any]]]
) -> list[str]:
    """No duplicate or orphaned ReplicaSets/pods: per Deployment one ReplicaSet with replicas > 0, every ReplicaSet
    owned by a live Deployment, and exactly the desired number of (not terminating) pods per role."""
    dep_uids = {
        d["metadata"]["uid"]: d["metadata"]["name"] for (k, _), ds in live.items() if k == "Deployment" for d in ds
    }
    out = []
    active: Counter[str] = Counter()
    rs_uids = set()
    for rs in client.AppsV1Api(api).list_namespaced_replica_set(ns).items:
        owner = [r.uid for r in rs.metadata.owner_references or []]
        if not owner or owner[0] not in dep_uids:
            out.append(f"orphan ReplicaSet {rs.metadata.name} (owner {owner})")
            continue
        rs_uids.add(rs.metadata.uid)
        if (rs.spec.replicas or 0) > 0:
            active[dep_uids[owner[0]]] += 1
    out += [f"{d}: {n} active ReplicaSets" for d, n in sorted(active.items()) if n != 1]
    pods: Counter[tuple[str, str]] = Counter()
    for pod in client.CoreV1Api(api).list_namespaced_pod(ns).items:
        owner = [r.uid for r in pod.metadata.owner_references or []]
        if not owner or owner[0] not in rs_uids:
            out.append(f"orphan pod {pod.metadata.name} (owner {owner})")
        elif pod.metadata.deletion_timestamp is None:
            labels = pod.metadata.labels or {}
            pods[(labels.get(contract.LABEL_INSTANCE, ""), labels.get(contract.LABEL_COMPONENT, ""))] += 1
    comps = (*contract.ROLES, contract.COMPONENT_ROUTER)
    want = Counter({(n, c): s[c]["replicas"] for n, s in model.specs.items() for c in comps})
    off = sorted((k, pods[k], want[k]) for k in set(pods) | set(want) if pods[k] != want[k])
    return out + ([f"pods per (CR, component): (key, have, want) {off}"] if off else [])


def test_operator_sigkilled_20_times_during_a_burst_of_50_crs_converges_exactly(
    nodes: Nodes, make_operator: Callable[[str], Operator], api_client: client.ApiClient, namespace: str
) -> None:
    seed_value = int(os.environ.get("HPD_DRILL_SEED") or random.SystemRandom().randrange(2**32))
    print(f"DRILL sigkill seed={seed_value} (rerun with HPD_DRILL_SEED={seed_value})", flush=True)
    rng = random.Random(seed_value)
    ns, pool = namespace, f"drill-{uuid.uuid4().hex[:6]}"
    # room for the most the plan can ask for, 50 CRs x (1 prefill + 2 decode) pods of 1 GPU, 4 CPUs, 32 GiB each
    big = cluster.NodePool(gpus_per_node=64, cpu="512", memory="8Ti")
    for _ in range(3):
        wait_ready_node(api_client, nodes.add({POOL_LABEL: pool}, big))
    ops, model = plan(rng, pool)
    operator = make_operator(QUIET_RESYNC)
    kill_at = list(_cumulative(rng, KILLS))
    op_at = sorted(rng.uniform(0, kill_at[-1] - 0.5) for _ in ops)
    timeline = sorted([(t, "op", i) for i, t in enumerate(op_at)] + [(t, "kill", i) for i, t in enumerate(kill_at)])

    t0 = time.monotonic()
    for at, what, i in timeline:
        time.sleep(max(0.0, t0 + at - time.monotonic()))  # the seeded pace of the burst, not a wait for a result
        if what == "op":
            execute(api_client, ns, ops[i])
        else:
            operator.stop(signal.SIGKILL)
            operator.start()
    storm = time.monotonic() - t0
    assert operator.proc is not None

    last: list[list[str]] = [[]]

    def converged() -> bool:
        last[0] = mismatches(api_client, ns, model)
        return not last[0]

    try:
        wait_for(converged, 240, interval=1.0, what="every CR converged after the last restart")
    except AssertionError as e:
        shown = "\n".join(last[0][:30])
        raise AssertionError(
            f"seed {seed_value}: {len(last[0])} mismatches, first 30:\n{shown}\n{workloads(api_client, ns, last[0])}"
        ) from e
    converge_s = time.monotonic() - t0 - storm
    assert operator.proc.poll() is None, "the operator exited after its last restart"
    counts = Counter(o.verb for o in ops)
    record(
        "sigkill", seed=seed_value, kills=KILLS, creates=counts["create"], updates=counts["update"],
        deletes=counts["delete"], crs=len(model.specs), storm_s=storm, converge_after_last_kill_s=converge_s,
    )  # fmt: skip


def workloads(api: client.ApiClient, ns: str, problems: list[str]) -> str:
    """The Deployments' status and the pods of the CRs named first in `problems` (for a failure message)."""
    names = sorted({p.split()[0] for p in problems if p.startswith("drill-")})[:5]
    lines = []
    for name in names:
        sel = f"{contract.LABEL_INSTANCE}={name}"
        for d in client.AppsV1Api(api).list_namespaced_deployment(ns, label_selector=sel).items:
            st = d.status
            lines.append(f"{d.metadata.name}: replicas {st.replicas} ready {st.ready_replicas} updated "
                         f"{st.updated_replicas} observedGeneration {st.observed_generation}")  # fmt: skip
        for role in (*contract.ROLES, contract.COMPONENT_ROUTER):
            lines += [
                f"  pod {p.metadata.name} node {p.spec.node_name} ready {pod_ready(p)} phase {p.status.phase}"
                for p in pods_of(api, ns, name, role)
            ]
    return "\n".join(lines)


def _cumulative(rng: random.Random, n: int) -> Iterator[float]:
    t = 0.0
    for _ in range(n):
        t += rng.uniform(*KILL_GAP)
        yield t


# --- 2. kube-apiserver restart -------------------------------------------------------------------------------


def test_apiserver_restart_watches_resume_and_a_new_cr_is_reconciled(
    make_operator: Callable[[str], Operator],
    api_client: client.ApiClient,
    namespace: str,
    devcluster: cluster.ClusterState,
) -> None:
    ns = namespace
    op = make_operator(QUIET_RESYNC)
    create(api_client, ns, seed("before"))
    gb = generation(seed("before"), ns)
    wait_for(lambda: children(api_client, ns, "before") == expected("before", gb), T, what="children of `before`")

    cluster.restart(devcluster, "kube-apiserver")
    back = time.monotonic()
    create(api_client, ns, seed("after"))
    ga = generation(seed("after"), ns)
    wait_for(lambda: children(api_client, ns, "after") == expected("after", ga), 120, what="children of `after`")
    children_s = time.monotonic() - back
    # its pods' and Deployments' events reach its status (the child and pod watches resumed as well)
    cr = wait_cr(api_client, ns, "after", is_ready, "`after` Ready", timeout=120)
    ready_s = time.monotonic() - back
    assert cr["status"]["endpoint"] == f"http://after.{ns}.svc:8000"

    # the watch on existing CRs resumed too: a spec change after the restart reaches the children
    patch_spec(api_client, ns, "before", {"decode": {"replicas": 2}})
    wait_for(lambda: deployment(api_client, ns, f"before-decode-{gb}").spec.replicas == 2, T, what="`before` updated")
    t_patch = time.monotonic()
    wait_for(
        lambda: children(api_client, ns, "before") == expected("before", gb, PodDisruptionBudget=["{n}-decode-{g}"]),
        T,
        what="the PDB of `before`",
    )
    update_s = time.monotonic() - t_patch
    assert op.proc is not None and op.proc.poll() is None, "the operator exited while the apiserver restarted"
    record(
        "apiserver-restart", children_after_apiserver_back_s=children_s, ready_after_apiserver_back_s=ready_s,
        spec_change_to_children_s=update_s,
    )  # fmt: skip


# --- 3. a node with decode pods is deleted -------------------------------------------------------------------
def test_deleting_a_node_with_decode_pods_leaves_ready_until_they_run_on_another_node(
    nodes: Nodes, make_operator: Callable[[str], Operator], api_client: client.ApiClient, namespace: str
) -> None:
    ns, name, pool = namespace, "lost", f"lost-{uuid.uuid4().hex[:6]}"
    make_operator(QUIET_RESYNC)
    doomed = nodes.add({POOL_LABEL: pool})
    wait_ready_node(api_client, doomed)
    doc = seed(name)
    doc["spec"]["decode"]["replicas"] = 2
    place(doc["spec"], "decode", pool)
    create(api_client, ns, doc)
    wait_cr(api_client, ns, name, is_ready, "Ready", timeout=60)
    before = pods_of(api_client, ns, name, "decode")
    assert len(before) == 2 and {p.spec.node_name for p in before} == {doomed}
    spare = nodes.add({POOL_LABEL: pool})  # the only place the replacements can go
    wait_ready_node(api_client, spare)

    nodes.delete(doomed)
    t0 = time.monotonic()
    cr = wait_cr(api_client, ns, name, lambda c: cond(c, "Ready").get("status") == "False", "Ready=False", timeout=T)
    left_s = time.monotonic() - t0
    assert cond(cr, "DecodeReady")["status"] == "False"
    # no decode left, prefill Ready: degraded mode serves on prefill (the default); the node's loss is in the message
    degraded = cond(cr, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] in ("NodeLost", "DecodeUnavailable"), degraded
    assert f"node {doomed}, which no longer exists" in degraded["message"], degraded
    assert doomed in cond(cr, "DecodeReady")["message"]
    assert cond(cr, "PrefillReady")["status"] == "True"

    # Back to Ready once the pods run elsewhere: the controller-manager's pod GC deletes pods of a vanished node
    # after a 40 s quarantine, the ReplicaSet replaces them, the scheduler puts them on the spare node. Ready must
    # not come back before both replacements are Ready. Every status write is seen (a watch from the Ready=False
    # version on); at the first Ready=True the pods are read: from here on a decode pod only leaves the deleted node
    # and a replacement only turns Ready, so fewer than 2 Ready replacements then means fewer at the write too.
    cr = next((c for c in versions(api_client, ns, name, cr["metadata"]["resourceVersion"], 180) if is_ready(c)), {})
    assert cr, "not Ready again within 180 s of the node deletion"
    back_s = time.monotonic() - t0
    pods = pods_of(api_client, ns, name, "decode")
    replaced = [p.metadata.name for p in pods if p.spec.node_name != doomed and pod_ready(p)]
    assert len(replaced) == 2, (
        f"Ready=True ({cr['status']['decode']['summary']}) while only {replaced} run Ready off the deleted node "
        f"{doomed}: {[(p.metadata.name, p.spec.node_name, pod_ready(p)) for p in pods]}"
    )
    # and it stays Ready: a later Ready=False would mean the first Ready=True came before the replacements were
    for later in versions(api_client, ns, name, cr["metadata"]["resourceVersion"], 5):
        assert is_ready(later), f"Ready came back too early, it dropped again: {brief(later)}"
    back_s = time.monotonic() - t0
    after = pods_of(api_client, ns, name, "decode")
    assert len(after) == 2 and all(pod_ready(p) for p in after)
    assert {p.spec.node_name for p in after} == {spare}
    assert not {p.metadata.uid for p in after} & {p.metadata.uid for p in before}
    cr = get_cr(api_client, ns, name)
    assert cond(cr, "Degraded")["status"] == "False" and cr["status"]["decode"]["summary"] == "2/2"
    record("node-lost", ready_false_after_s=left_s, ready_again_after_s=back_s)


def versions(api: client.ApiClient, ns: str, name: str, since: str, seconds: float) -> Iterator[dict[str, Any]]:
    """Every version of the CR written after resourceVersion `since`, for `seconds`, from a watch: a state the
    operator writes for a moment and overwrites is seen too (polling can miss it)."""
    custom, end = client.CustomObjectsApi(api), time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0.5:
        stream = watch.Watch().stream(
            custom.list_namespaced_custom_object, G, V, ns, P, field_selector=f"metadata.name={name}",
            resource_version=since, timeout_seconds=max(1, round(left)),
        )  # fmt: skip
        for event in stream:
            obj: dict[str, Any] = event["object"]
            since = obj["metadata"]["resourceVersion"]
            if event["type"] in ("ADDED", "MODIFIED"):
                yield obj


# --- 4. a prefill pod is replaced ----------------------------------------------------------------------------
def test_a_replaced_prefill_pod_moves_status_and_leaves_decode_pods_alone(
    nodes: Nodes, make_operator: Callable[[str], Operator], api_client: client.ApiClient, namespace: str
) -> None:
    """The operator's side of "decode follows prefill": the runtime in each decode pod re-checks its pair itself
    (hpd_runtime.pairing: polls the prefill Service, drops Ready, exits 75 if the pair stays broken), so the
    operator does not restart or touch decode pods; its status follows the prefill role instead."""
    ns, name, pool = namespace, "pair", f"pair-{uuid.uuid4().hex[:6]}"
    make_operator(QUIET_RESYNC)
    host = nodes.add({POOL_LABEL: pool})
    wait_ready_node(api_client, host)
    doc = seed(name)
    place(doc["spec"], "prefill", pool)
    doc["spec"]["decode"]["replicas"] = 2
    create(api_client, ns, doc)
    wait_cr(api_client, ns, name, is_ready, "Ready", timeout=60)
    decode_uids = {p.metadata.uid for p in pods_of(api_client, ns, name, "decode")}
    decode_gen = engine_deployment(api_client, ns, name, "decode").metadata.generation
    (old,) = pods_of(api_client, ns, name, "prefill")

    # kwok makes a scheduled pod Ready at once; cordoning the prefill node holds the replacement not Ready (the
    # gap a real new prefill pod spends loading and warming up) until the test lets it schedule
    core = client.CoreV1Api(api_client)
    core.patch_node(host, {"spec": {"unschedulable": True}})
    scheduler_sees_cordon(core, ns, pool)
    core.delete_namespaced_pod(old.metadata.name, ns)
    cr = wait_cr(api_client, ns, name, lambda c: cond(c, "PrefillReady").get("status") == "False", "PrefillReady=False")
    ready = cond(cr, "Ready")
    assert ready["status"] == "False" and "prefill" in ready["message"].lower(), ready
    assert "prefill" in cond(cr, "PrefillReady")["message"]

    def decode_untouched() -> bool:
        cr = get_cr(api_client, ns, name)
        assert cond(cr, "PrefillReady")["status"] == "False" and cond(cr, "Ready")["status"] == "False"
        assert cond(cr, "DecodeReady")["status"] == "True", cond(cr, "DecodeReady")
        assert {p.metadata.uid for p in pods_of(api_client, ns, name, "decode")} == decode_uids
        return bool(engine_deployment(api_client, ns, name, "decode").metadata.generation == decode_gen)

    hold(decode_untouched, 3.0, "during the gap: decode pods and Deployment untouched, status names prefill")

    core.patch_node(host, {"spec": {"unschedulable": False}})
    wait_cr(api_client, ns, name, is_ready, "Ready again with the new prefill pod", timeout=60)
    (new,) = pods_of(api_client, ns, name, "prefill")
    assert new.metadata.uid != old.metadata.uid and pod_ready(new)
    assert cond(get_cr(api_client, ns, name), "PrefillReady")["status"] == "True"
    assert {p.metadata.uid for p in pods_of(api_client, ns, name, "decode")} == decode_uids
    assert engine_deployment(api_client, ns, name, "decode").metadata.generation == decode_gen
