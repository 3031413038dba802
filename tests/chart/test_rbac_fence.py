"""rbac.fence (issue #32 item 6, on by default since issue #39): with the default cluster scope the operator's
ClusterRole reaches every namespace, kube-system included; the chart's ValidatingAdmissionPolicy confines its token to
namespaces labelled hybridpd.io/operator-writes=allowed, and there to objects a HybridPDDeployment owns. Where a
namespace did not opt in, the token may still write a CR's status and Events about the CR (so a CR kept out can say
why), and creating a CR there warns its author.

Proven on the local control plane with the chart's ServiceAccount token (TokenRequest, as in its pod): with the
DEFAULT install the token cannot create a Deployment, a RoleBinding or a ServiceAccount in kube-system or in a
namespace that did not opt in, nor touch a labelled namespace's other workloads, while the operator, run from its built
image as that ServiceAccount, still reconciles a CR in the labelled namespace end to end (tests/chart/
test_rbac_proof.py's proof: create, update, delete, no 403); `helm upgrade --set rbac.fence.enabled=false` (the
explicit opt-out) gives the ClusterRole's reach back, which shows the refusals came from the fence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hpd_devcluster.testing import wait_for

from .conftest import Cluster
from .helmkit import CHART, Helm, adopt_crd, find, sa_kubeconfig, wait_rbac
from .test_rbac_proof import REMOVED, chart_args, chart_default, leaderworkerset_crd, podmonitor_crd, prove

__all__ = ["leaderworkerset_crd", "podmonitor_crd"]  # the proof's autouse fixtures (the kinds it proves), used here too

LABEL = ("hybridpd.io/operator-writes", "allowed")


def test_the_fence_is_on_by_default_names_the_operator_and_the_label_and_can_be_turned_off(helm: Helm) -> None:
    docs = helm.template()
    vap = find(docs, "ValidatingAdmissionPolicy", "hpd-hybrid-pd-operator-fence")
    (cond,) = vap["spec"]["matchConditions"]
    assert (
        cond["expression"] == "request.userInfo.username == 'system:serviceaccount:hpd-system:hpd-hybrid-pd-operator'"
    )
    assert "'hybridpd.io/operator-writes'" in vap["spec"]["variables"][0]["expression"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    warn = find(docs, "ValidatingAdmissionPolicyBinding", "hpd-hybrid-pd-operator-opt-in")
    assert warn["spec"]["validationActions"] == ["Warn"]
    off = helm.template("--set", "rbac.fence.enabled=false")
    assert not [
        d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy") and "fence" in d["metadata"]["name"]
    ]


def sa_api(kubeconfig: Path) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def deployment(name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if owner:
        md["ownerReferences"] = [owner]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": md,
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        },
    }


def rolebinding(name: str, cluster_role: str) -> dict[str, Any]:
    """Grants `cluster_role` in the namespace to kube-system's default ServiceAccount (escalation prevention lets
    the operator grant only what it holds: its own ClusterRole, which is plenty)."""
    return {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"}],
    }


def outcome(call: Callable[[], object]) -> str:
    """'ok', or the apiserver's status code and message of the refusal."""
    try:
        call()
    except client.ApiException as e:
        return f"{e.status} {e.body}"
    return "ok"


def service_account(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}}


def event_about(kind: str, name: str, ns: str) -> dict[str, Any]:
    """A core/v1 Event whose subject is `kind` `name` (what report.event posts about a CR)."""
    ref = {"apiVersion": "hybridpd.io/v1alpha1" if kind == "HybridPDDeployment" else "v1", "kind": kind, "name": name,
           "namespace": ns}  # fmt: skip
    return {"metadata": {"name": f"{name}.fence", "namespace": ns}, "involvedObject": ref, "reason": "NotOptedIn",
            "message": "namespace not opted in", "type": "Warning", "source": {"component": "hybrid-pd-operator"}}  # fmt: skip


def refused_writes(sa: client.ApiClient, ns: str, own_role: str) -> dict[str, str]:
    """What the operator's token gets for a Deployment, a RoleBinding and a ServiceAccount in `ns` (dry run)."""
    apps, rbac, core = client.AppsV1Api(sa), client.RbacAuthorizationV1Api(sa), client.CoreV1Api(sa)
    dry = {"dry_run": "All"}
    return {
        "deployment": outcome(lambda: apps.create_namespaced_deployment(ns, deployment("stray"), **dry)),
        "rolebinding": outcome(lambda: rbac.create_namespaced_role_binding(ns, rolebinding("x", own_role), **dry)),
        "serviceaccount": outcome(lambda: core.create_namespaced_service_account(ns, service_account("x"), **dry)),
    }


@pytest.mark.cluster
def test_the_default_install_confines_the_operators_token_and_the_operator_still_works_behind_it(k8s: Cluster) -> None:
    rel, work, elsewhere = k8s.make_namespace("hpd-system"), k8s.make_namespace("models"), k8s.make_namespace("other")
    release = "hpd"
    adopt_crd(k8s.helm, k8s.kubeconfig, release, rel)
    # the default install (cluster scope, the fence on); the operator watches `work` only, so CRs that other tests
    # leave in unlabelled namespaces cannot make it hit the fence (a 403 fails the proof)
    sets = ["--set", "operator.resyncSeconds=2", "--set", f"watchNamespaces[0]={work}"]
    k8s.helm.run("install", release, str(CHART), "-n", rel, *sets, kubeconfig=k8s.kubeconfig)
    try:
        sa_kc = sa_kubeconfig(k8s.kubeconfig, rel, f"{release}-hybrid-pd-operator", k8s.tmp / "sa.kubeconfig")
        sa = sa_api(sa_kc)
        apps, core = client.AppsV1Api(sa), client.CoreV1Api(sa)
        dry = {"dry_run": "All"}
        own_role = f"{release}-hybrid-pd-operator"
        client.CoreV1Api(k8s.api).patch_namespace(work, {"metadata": {"labels": dict([LABEL])}})

        def all_refused(ns: str) -> dict[str, str] | None:  # a new policy takes a moment to be enforced
            got = refused_writes(sa, ns, own_role)
            return got if all(v.startswith("403 ") for v in got.values()) else None

        for ns in ("kube-system", elsewhere):
            got = wait_for(lambda ns=ns: all_refused(ns), 30, what=f"the fence enforced in {ns}")
            for kind, refusal in got.items():
                assert "rbac.fence" in refusal and f"namespace {ns} is not" in refusal, (ns, kind, refusal)

        # Where the namespace did not opt in, the CR's author is warned at once, and the operator may still explain:
        # the CR's status and an Event about it pass, an Event about anything else does not.
        co = client.CustomObjectsApi(k8s.api)
        cr = {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment", "metadata": {"name": "kept-out"},
              "spec": {"model": {"name": "x/y", "hybrid": "none"}}}  # fmt: skip
        _, _, headers = co.create_namespaced_custom_object_with_http_info(
            "hybridpd.io", "v1alpha1", elsewhere, "hybridpddeployments", cr
        )
        warning = headers.get("Warning", "")
        assert f"namespace {elsewhere} is not labelled hybridpd.io/operator-writes=allowed" in warning, headers
        sa_co = client.CustomObjectsApi(sa)
        status = {"status": {"phase": "Failed"}}
        got = outcome(lambda: sa_co.patch_namespaced_custom_object_status(
            "hybridpd.io", "v1alpha1", elsewhere, "hybridpddeployments", "kept-out", status, dry_run="All"))  # fmt: skip
        assert got == "ok", got
        ev = event_about("HybridPDDeployment", "kept-out", elsewhere)
        assert outcome(lambda: core.create_namespaced_event(elsewhere, ev, **dry)) == "ok"
        got = outcome(lambda: core.create_namespaced_event(elsewhere, event_about("Pod", "x", elsewhere), **dry))
        assert got.startswith("403 ") and "rbac.fence" in got, got
        got = outcome(
            lambda: core.create_namespaced_event("kube-system", event_about("Pod", "x", "kube-system"), **dry)
        )
        assert got.startswith("403 "), got

        # Inside the labelled namespace: nothing that no HybridPDDeployment owns, created or changed.
        got = outcome(lambda: apps.create_namespaced_deployment(work, deployment("stray"), **dry))
        assert got.startswith("403 ") and "owned by a HybridPDDeployment" in got, got
        admin_apps = client.AppsV1Api(k8s.api)
        admin_apps.create_namespaced_deployment(work, deployment("theirs"))
        got = outcome(lambda: apps.patch_namespaced_deployment("theirs", work, {"spec": {"replicas": 3}}, **dry))
        assert got.startswith("403 ") and "is not" in got, got
        got = outcome(lambda: apps.delete_namespaced_deployment("theirs", work, **dry))
        assert got.startswith("403 "), got
        # An ownerReference that cites a real CR's uid does not make any RoleBinding fair game: only the Role of the
        # binding's own name, bound to the ServiceAccount of that name (what the builders make), passes.
        owner = co.create_namespaced_custom_object("hybridpd.io", "v1alpha1", work, "hybridpddeployments",
                                                   {**cr, "metadata": {"name": "owner"}})  # fmt: skip
        ref = {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment", "name": "owner",
               "uid": owner["metadata"]["uid"]}  # fmt: skip
        rbac = client.RbacAuthorizationV1Api(sa)
        client.RbacAuthorizationV1Api(k8s.api).create_namespaced_role(  # what a binding may name must exist
            work, {"metadata": {"name": "owner-router", "ownerReferences": [ref]}, "rules": []}
        )

        def binding(name: str, subject: dict[str, str], role: str) -> dict[str, Any]:
            return {"metadata": {"name": name, "ownerReferences": [ref]}, "subjects": [subject],
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}}  # fmt: skip

        everyone = {"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}
        for bad in (binding("owner-router", everyone, "owner-router"),
                    binding("owner-router", {"kind": "ServiceAccount", "name": "default"}, "owner-router"),
                    binding("owner-x", {"kind": "ServiceAccount", "name": "owner-x"}, "owner-router")):  # fmt: skip
            got = outcome(lambda bad=bad: rbac.create_namespaced_role_binding(work, bad, **dry))
            assert got.startswith("403 ") and "binds only the Role" in got, got
        good = binding("owner-router", {"kind": "ServiceAccount", "name": "owner-router", "namespace": work},
                       "owner-router")  # fmt: skip
        got = outcome(lambda: rbac.create_namespaced_role_binding(work, good, **dry))
        assert not got.startswith("403 ") or "rbac.fence" not in got, got  # RBAC may still refuse: the fence does not
        co.delete_namespaced_custom_object("hybridpd.io", "v1alpha1", work, "hybridpddeployments", "owner")

        # ... while the operator, as this ServiceAccount, reconciles a CR there from create to delete, no 403.
        wait_rbac(k8s.api, rel, own_role, work, dict.fromkeys(REMOVED, True))
        op = k8s.start_operator(sa_kc, chart_args(k8s.api, release, rel))
        prove(k8s.api, op, work, images=(chart_default("vllm"), chart_default("router")))
        assert admin_apps.read_namespaced_deployment("theirs", work).spec.replicas == 0
        op.stop()

        # The explicit opt-out: the ClusterRole's reach comes back (so the refusals above were the fence's).
        k8s.helm.run("upgrade", release, str(CHART), "-n", rel, *sets, "--set", "rbac.fence.enabled=false",
                     kubeconfig=k8s.kubeconfig)  # fmt: skip

        def allowed_elsewhere() -> dict[str, str] | None:
            got = refused_writes(sa, elsewhere, own_role)
            return got if all(v == "ok" for v in got.values()) else None

        wait_for(allowed_elsewhere, 30, what="the fence lifted (rbac.fence.enabled=false)")
        assert all(v == "ok" for v in refused_writes(sa, "kube-system", own_role).values())
    finally:
        k8s.helm.run("uninstall", release, "-n", rel, kubeconfig=k8s.kubeconfig, check=False)
