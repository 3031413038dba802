"""The chart's RBAC is proven, not assumed: the operator runs FROM ITS BUILT IMAGE (buildah, host network; HOW is
the one `operator_argv` in conftest.py) with a token of the chart's ServiceAccount (TokenRequest API, as in its pod)
and exactly the args of the chart's Deployment, against the real local control plane (RBAC on,
OwnerReferencesPermissionEnforcement on). It reconciles the sample CR to Ready, follows an update, and the CR's
deletion, in both RBAC scopes, with no 403 anywhere; and taking one verb away from the chart's rules makes it fail.

A 403 shows either in the operator's log (kopf's watches and the reconcile workers log API errors) or in its
hpd_operator_api_errors_total{code="403"} metric (Events are best effort and only counted)."""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Cluster, OperatorProcess
from .helmkit import CHART, REPO, adopt_crd, sa_kubeconfig, wait_rbac

pytestmark = pytest.mark.cluster
G, V, P = contract.GROUP, contract.VERSION, contract.PLURAL
SAMPLE = REPO / "examples" / "nemotron-3-nano.yaml"
T = 120.0  # a deadline only: success returns at once (the shared CI box can be slow)
R = TypeVar("R")
_LOG_STAMP = re.compile(r"^\[[0-9-]+ [0-9:]+,[0-9]+\] ")
"""kopf's `[2026-11-29 19:24:10,403] ` prefix: its milliseconds can read as a 403."""
_FORBIDDEN_LOG = re.compile(r"\b403\b|Forbidden|forbidden|Not enough permissions")


class Forbidden(AssertionError):
    """The operator hit a 403."""


def forbidden(op: OperatorProcess) -> str | None:
    """The first sign of a 403: a log line, or a 403 counted in the operator's metrics."""
    for line in op.log_text().splitlines():
        if _FORBIDDEN_LOG.search(_LOG_STAMP.sub("", line)):
            return line
    try:
        metrics = op.metrics()
    except OSError:
        return None  # not serving yet
    for line in metrics.splitlines():
        if line.startswith("hpd_operator_api_errors_total{") and 'code="403"' in line and not line.endswith(" 0.0"):
            return line
    return None


def wait(op: OperatorProcess, check: Callable[[], R | None], what: str, timeout: float = T) -> R:
    """Poll `check` until truthy; raise Forbidden as soon as the operator hits a 403, AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        hit = forbidden(op)
        if hit:
            raise Forbidden(f"403 while waiting for {what}: {hit}")
        if op.proc.poll() is not None:
            raise AssertionError(f"operator exited ({op.proc.returncode}) while waiting for {what}")
        try:
            value = check()
            if value:
                return value
            last = value
        except client.ApiException as e:
            last = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(0.25)


def install(k8s: Cluster, release: str, ns: str, *, scope: str, watch: list[str]) -> None:
    helm, kubeconfig = k8s.helm, k8s.kubeconfig
    adopt_crd(helm, kubeconfig, release, ns)
    sets = ["--set", f"rbac.scope={scope}", "--set", "operator.resyncSeconds=2"]  # faster status in tests
    for i, w in enumerate(watch):
        sets += ["--set", f"watchNamespaces[{i}]={w}"]
    # No --wait: the proof needs the ServiceAccount and RBAC (created synchronously), not the (kwok) operator pod.
    helm.run("install", release, str(CHART), "-n", ns, *sets, kubeconfig=kubeconfig)
    # rbac.fence is on by default: the operator writes only where a namespace admin opted in (test_rbac_fence.py)
    for w in watch:
        opt_in(k8s.api, w)


FENCE_LABEL = ("hybridpd.io/operator-writes", "allowed")
"""The chart's default rbac.fence label (values.yaml)."""


def opt_in(api: client.ApiClient, ns: str) -> None:
    """Label `ns` so the default install's fence lets the operator write there (what a namespace admin does)."""
    client.CoreV1Api(api).patch_namespace(ns, {"metadata": {"labels": dict([FENCE_LABEL])}})


def chart_args(api: client.ApiClient, release: str, ns: str) -> list[str]:
    """The operator's args exactly as the installed chart's Deployment has them."""
    dep = client.AppsV1Api(api).read_namespaced_deployment(f"{release}-hybrid-pd-operator", ns)
    return list(dep.spec.template.spec.containers[0].args)


def sample(name: str) -> dict[str, Any]:
    """The seed example with every optional child on: 2 decode replicas (a PodDisruptionBudget) and PodMonitors."""
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"] = {"name": name}
    doc["spec"].pop("image", None)  # the operator's default image: the chart's images.vllm
    doc["spec"]["decode"]["replicas"] = 2
    doc["spec"]["monitoring"] = {"podMonitor": True}
    return doc


PODMONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {
            "kind": "PodMonitor",
            "listKind": "PodMonitorList",
            "plural": "podmonitors",
            "singular": "podmonitor",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


def _stand_in(group: str, kind: str, plural: str) -> dict[str, Any]:
    """A schema-less CRD serving `kind`: the operator's calls on it are proven without its controller."""
    crd = copy.deepcopy(PODMONITOR_CRD)
    crd["metadata"]["name"] = f"{plural}.{group}"
    crd["spec"].update(group=group, names={"kind": kind, "listKind": f"{kind}List", "plural": plural,
                                           "singular": kind.lower()})  # fmt: skip
    return crd


LWS_CRD = _stand_in("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "leaderworkersets")
LWS_CRD["spec"]["versions"][0]["subresources"] = {"status": {}}


@pytest.fixture(scope="module", autouse=True)
def podmonitor_crd(api_client: client.ApiClient) -> Iterator[None]:
    """The Prometheus Operator's PodMonitor kind (a schema-less stand-in when absent), so the proof covers the
    operator's PodMonitor calls too; removed afterwards only if this module created it (tests/chart/test_rbac_fence.py
    uses it as well)."""
    yield from _served(api_client, PODMONITOR_CRD)


@pytest.fixture(scope="module", autouse=True)
def leaderworkerset_crd(api_client: client.ApiClient) -> Iterator[None]:
    """LeaderWorkerSet's kind (a stand-in when absent: the proof needs the operator's calls, not LWS's controller),
    so the proof covers a role whose replicas span nodes; removed afterwards only if this module created it."""
    yield from _served(api_client, LWS_CRD)


def _served(api_client: client.ApiClient, crd: dict[str, Any]) -> Iterator[None]:
    ext = client.ApiextensionsV1Api(api_client)
    name = crd["metadata"]["name"]
    try:
        ext.read_custom_resource_definition(name)
        created = False
    except client.ApiException as e:
        if e.status != 404:
            raise
        ext.create_custom_resource_definition(crd)
        created = True

    def established() -> bool:
        got = ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in got.status.conditions or [])

    wait_for(established, 30, what=f"{name} established")
    yield
    if created:
        ext.delete_custom_resource_definition(name)

        def gone() -> bool:  # deletion is asynchronous: the next module must not find a CRD about to vanish
            try:
                ext.read_custom_resource_definition(name)
            except client.ApiException as e:
                return e.status == 404
            return False

        wait_for(gone, 60, what=f"{name} deleted")


def optional_children(api: client.ApiClient, ns: str, name: str) -> tuple[list[str], list[str]]:
    """(PodDisruptionBudgets, PodMonitors) of the CR."""
    sel = f"app.kubernetes.io/instance={name}"
    pdbs = client.PolicyV1Api(api).list_namespaced_pod_disruption_budget(ns, label_selector=sel).items
    pms = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "monitoring.coreos.com", "v1", ns, "podmonitors", label_selector=sel
    )["items"]
    return sorted(p.metadata.name for p in pdbs), sorted(p["metadata"]["name"] for p in pms)


def get_cr(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(G, V, ns, P, name)
    return out


def ready(cr: dict[str, Any]) -> bool:
    st = cr.get("status") or {}
    conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
    return conds.get("Ready") == "True" and st.get("observedGeneration") == cr["metadata"]["generation"]


def engine(api: client.ApiClient, ns: str, name: str, role: str) -> list[client.V1Deployment]:
    """The CR's `role` Deployments (one per generation that runs)."""
    sel = f"app.kubernetes.io/instance={name},app.kubernetes.io/component={role}"
    return list(client.AppsV1Api(api).list_namespaced_deployment(ns, label_selector=sel).items)


def children(api: client.ApiClient, ns: str, name: str) -> list[str]:
    apps = client.AppsV1Api(api)
    return sorted(
        d.metadata.name
        for d in apps.list_namespaced_deployment(ns, label_selector=f"app.kubernetes.io/instance={name}").items
    )


def prove(
    api: client.ApiClient, op: OperatorProcess, ns: str, name: str = "sample", *, images: tuple[str, str]
) -> None:
    """Create -> Ready, update -> Ready at the new generation, delete -> children gone; no 403 at any point."""
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(G, V, ns, P, sample(name))
    cr = wait(op, lambda: (c := get_cr(api, ns, name)) and ready(c) and c, f"{name} Ready")
    assert cr["status"]["endpoint"] == f"http://{name}.{ns}.svc:8000"
    apps = client.AppsV1Api(api)
    (decode,) = engine(api, ns, name, "decode")
    router = apps.read_namespaced_deployment(f"{name}-router", ns).spec.template.spec.containers[0]
    assert (decode.spec.template.spec.containers[0].image, router.image) == images  # the chart's images.* arrived
    core = client.CoreV1Api(api)

    def created_event() -> bool:  # the Event is posted after the status write: wait for it (STYLE item 13)
        events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        return "Created" in {e.reason for e in events}

    wait(op, created_event, "the Created Event on the CR")

    pdbs, pms = optional_children(api, ns, name)
    assert pdbs == [decode.metadata.name] and len(pms) == 2

    # Update: scale decode to 1 and turn PodMonitors off -> the PDB and both PodMonitors are pruned; a new engine env
    # -> a new generation takes over and the old one's Deployments and Services are deleted (docs/rollouts.md); prefill
    # starts to autoscale -> an HPA on the serving generation's prefill while the new one starts, then the new one's
    # (its replicas handed off) and the old HPA deleted (no metrics adapter here: the HPAs only wait).
    spec = {"decode": {"replicas": 1}, "monitoring": {"podMonitor": False}, "env": [{"name": "RBAC", "value": "1"}],
            "prefill": {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}}  # fmt: skip
    co.patch_namespaced_custom_object(G, V, ns, P, name, {"spec": spec})
    hpas = client.AutoscalingV2Api(api)

    def updated() -> bool:
        ds, ps = engine(api, ns, name, "decode"), engine(api, ns, name, "prefill")
        sel = f"app.kubernetes.io/instance={name}"
        scalers = [
            h.metadata.name for h in hpas.list_namespaced_horizontal_pod_autoscaler(ns, label_selector=sel).items
        ]
        return (
            len(ds) == 1
            and len(ps) == 1
            and ds[0].metadata.uid != decode.metadata.uid
            and ds[0].spec.replicas == 1
            and optional_children(api, ns, name) == ([ps[0].metadata.name], [])  # prefill may reach 2 replicas
            and scalers == [ps[0].metadata.name]
            and not [s for s in client.CoreV1Api(api).list_namespaced_service(ns).items
                     if s.metadata.name.endswith(decode.metadata.labels["hybridpd.io/generation"])]
            and ready(get_cr(api, ns, name))
        )  # fmt: skip

    what = f"{name} on a new generation, decode at 1, PDB, PodMonitors, old generation and its HPA pruned, Ready"
    wait(op, updated, what)

    co.delete_namespaced_custom_object(G, V, ns, P, name)
    wait(op, lambda: not children(api, ns, name), f"{name}'s children garbage-collected")
    prove_multi_node(api, op, ns, f"{name}-mn")
    hit = forbidden(op)
    assert hit is None, hit


def leaderworkersets(api: client.ApiClient, ns: str, name: str) -> dict[str, int]:
    """The CR's LeaderWorkerSets: name -> spec.replicas."""
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "leaderworkerset.x-k8s.io", "v1", ns, "leaderworkersets", label_selector=f"app.kubernetes.io/instance={name}"
    )["items"]
    return {i["metadata"]["name"]: i["spec"]["replicas"] for i in items}


def prove_multi_node(api: client.ApiClient, op: OperatorProcess, ns: str, name: str) -> None:
    """A decode replica over two nodes: its generation's LeaderWorkerSet created, scaled (patch, in place) and pruned
    when the replica fits one node again (a new generation with a decode Deployment replaces it: no LWS controller
    runs here, so the group never became Ready and never served; delete); nothing needs to become Ready."""
    co = client.CustomObjectsApi(api)
    doc = sample(name)
    doc["spec"]["decode"] = {"replicas": 1, "tensorParallelSize": 16}
    doc["spec"]["model"] = {"name": "x/y", "hybrid": "none"}
    doc["spec"]["prefill"] = {"tensorParallelSize": 2}
    co.create_namespaced_custom_object(G, V, ns, P, doc)

    def one_group(replicas: int) -> str | None:
        got = leaderworkersets(api, ns, name)
        if len(got) != 1:
            return None
        [(group, n)] = got.items()
        return group if n == replicas and group.startswith(f"{name}-decode-") else None

    group = wait(op, lambda: one_group(1), f"{name}'s LeaderWorkerSet created")
    co.patch_namespaced_custom_object(G, V, ns, P, name, {"spec": {"decode": {"replicas": 2}}})
    wait(op, lambda: one_group(2) == group, f"{name}'s LeaderWorkerSet scaled in place")
    co.patch_namespaced_custom_object(G, V, ns, P, name, {"spec": {"decode": {"tensorParallelSize": 2}}})
    wait(op, lambda: not leaderworkersets(api, ns, name)
         and any(d.startswith(f"{name}-decode-") for d in children(api, ns, name)),
         f"{name}'s LeaderWorkerSet pruned, a Deployment instead")  # fmt: skip
    co.delete_namespaced_custom_object(G, V, ns, P, name)
    wait(op, lambda: not children(api, ns, name), f"{name}'s children garbage-collected")


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_operator_as_the_chart_service_account_reconciles_updates_and_deletes(scope: str, k8s: Cluster) -> None:
    rel, work = k8s.make_namespace("hpd-system"), k8s.make_namespace("models")
    release = "hpd"
    # cluster: every namespace (no --namespace); namespace: a Role in `work` only, the operator in `rel`.
    install(k8s, release, rel, scope=scope, watch=[] if scope == "cluster" else [work])
    opt_in(k8s.api, work)
    args = chart_args(k8s.api, release, rel)
    assert ("--namespace=" + work in args) == (scope == "namespace")
    wait_rbac(k8s.api, rel, f"{release}-hybrid-pd-operator", work, dict.fromkeys(REMOVED, True))
    sa_kc = sa_kubeconfig(k8s.kubeconfig, rel, f"{release}-hybrid-pd-operator", k8s.tmp / "sa.kubeconfig")
    try:
        op = k8s.start_operator(sa_kc, args)
        prove(k8s.api, op, work, images=(chart_default("vllm"), chart_default("router")))
    finally:  # cluster-scoped RBAC of a failed test must not block the next install of the same release name
        k8s.helm.run("uninstall", release, "-n", rel, kubeconfig=k8s.kubeconfig)


def chart_default(which: str) -> str:
    """The chart's default image, as the sample (spec.vllmVersion 0.20.0, no spec.image) must get it."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return str(values["images"][which]).replace("{version}", "0.20.0")


# (apiGroup, resource, verb) taken away from the chart's Role -> the proof must fail with a 403.
REMOVED = [
    ("apps", "deployments", "patch"),  # server-side apply of the role Deployments
    ("apps", "deployments", "watch"),  # the watch that feeds the reconcile's cache
    ("hybridpd.io", "hybridpddeployments/status", "patch"),  # status writes
    ("hybridpd.io", "hybridpddeployments/finalizers", "update"),  # blockOwnerDeletion on every child
    ("", "pods", "watch"),  # the router's Role cannot be granted without holding it
    ("", "events", "create"),  # Events on the CR
    ("monitoring.coreos.com", "podmonitors", "create"),  # PodMonitors (when the Prometheus Operator is there)
    ("leaderworkerset.x-k8s.io", "leaderworkersets", "create"),  # a role whose replicas span nodes (when LWS is there)
]


@pytest.mark.parametrize("removed", REMOVED, ids=lambda r: f"{r[1]}-{r[2]}")
def test_removing_one_verb_from_the_chart_rules_makes_the_proof_fail(
    removed: tuple[str, str, str], k8s: Cluster
) -> None:
    rel, work = k8s.make_namespace("hpd-system"), k8s.make_namespace("models")
    release = "hpd"
    install(k8s, release, rel, scope="namespace", watch=[work])
    rbac = client.RbacAuthorizationV1Api(k8s.api)
    role = rbac.read_namespaced_role(f"{release}-hybrid-pd-operator", work)
    group, resource, verb = removed
    rules = [r.to_dict() for r in role.rules]
    hits = [r for r in rules if group in r["api_groups"] and resource in r["resources"] and verb in r["verbs"]]
    assert len(hits) == 1, f"the chart grants {removed} in exactly one rule"
    for r in rules:
        if r is hits[0]:
            rest = [x for x in r["resources"] if x != resource]
            if rest:  # split the rule so only this resource loses the verb
                rules.append({**copy.deepcopy(r), "resources": rest})
            r["resources"], r["verbs"] = [resource], [v for v in r["verbs"] if v != verb]
    kept = [r for r in rules if r["verbs"]]  # a rule left without verbs goes entirely
    body = {"rules": [{"apiGroups": r["api_groups"], "resources": r["resources"], "verbs": r["verbs"]} for r in kept]}
    rbac.patch_namespaced_role(role.metadata.name, work, body)
    wait_rbac(k8s.api, rel, f"{release}-hybrid-pd-operator", work, {r: r != removed for r in REMOVED})
    sa_kc = sa_kubeconfig(k8s.kubeconfig, rel, f"{release}-hybrid-pd-operator", k8s.tmp / "sa.kubeconfig")
    try:
        op = k8s.start_operator(sa_kc, chart_args(k8s.api, release, rel))
        with pytest.raises(Forbidden, match="403"):
            prove(k8s.api, op, work, images=(chart_default("vllm"), chart_default("router")))
    finally:  # cluster-scoped RBAC of a failed test must not block the next install of the same release name
        k8s.helm.run("uninstall", release, "-n", rel, kubeconfig=k8s.kubeconfig)


def test_proof_notices_a_403_in_the_metrics_only(tmp_path: Path) -> None:
    """The detector itself: a 403 counted in the metrics (not logged) is found; a zero counter is not."""

    class Fake(OperatorProcess):
        def __init__(self, log: Path, text: str) -> None:
            self.log, self.text = log, text

        def metrics(self) -> str:
            return self.text

    log = tmp_path / "op.log"
    log.write_text("INFO reconciled\n")
    ok = 'hpd_operator_api_errors_total{operation="event",code="403"} 0.0\n'
    bad = 'hpd_operator_api_errors_total{operation="event",code="403"} 1.0\n'
    assert forbidden(Fake(log, ok)) is None
    assert forbidden(Fake(log, bad)) == bad.strip()
    log.write_text("kopf: APIForbiddenError: ('hybridpddeployments is forbidden', {\"code\": 403})\n")
    assert forbidden(Fake(log, ok))
