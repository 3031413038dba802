"""rbac.fence (issue #32 item 6): with the default cluster scope the operator's token may write Deployments and
RoleBindings in every namespace, kube-system included; the chart's opt-in ValidatingAdmissionPolicy confines it to
namespaces labelled hybridpd.io/operator-writes=allowed, and there to objects a HybridPDDeployment owns.

Proven on the local control plane with the chart's ServiceAccount token (TokenRequest, as in its pod): before the
fence the token creates a Deployment in an unlabelled namespace and a RoleBinding in kube-system; after `helm
upgrade --set rbac.fence.enabled=true` it cannot, nor touch a labelled namespace's other workloads, while the
operator, run from its built image as that ServiceAccount, still reconciles a CR there end to end (tests/chart/
test_rbac_proof.py's proof: create, update, delete, no 403)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hpd_devcluster.testing import wait_for

from .conftest import Cluster
from .helmkit import CHART, Helm, adopt_crd, find, sa_kubeconfig
from .test_rbac_proof import chart_args, chart_default, podmonitor_crd, prove

__all__ = ["podmonitor_crd"]  # the proof's autouse fixture (the PodMonitor kind), used here as well

LABEL = ("hybridpd.io/operator-writes", "allowed")


def test_the_fence_is_opt_in_and_names_the_operator_and_the_label(helm: Helm) -> None:
    assert not [
        d for d in helm.template() if d["kind"] == "ValidatingAdmissionPolicy" and "fence" in d["metadata"]["name"]
    ]
    docs = helm.template("--set", "rbac.fence.enabled=true")
    vap = find(docs, "ValidatingAdmissionPolicy", "hpd-hybrid-pd-operator-fence")
    (cond,) = vap["spec"]["matchConditions"]
    assert (
        cond["expression"] == "request.userInfo.username == 'system:serviceaccount:hpd-system:hpd-hybrid-pd-operator'"
    )
    assert "'hybridpd.io/operator-writes'" in vap["spec"]["variables"][0]["expression"]
    assert vap["spec"]["failurePolicy"] == "Fail"


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


@pytest.mark.cluster
def test_the_fence_confines_the_operators_token_and_the_operator_still_works_behind_it(k8s: Cluster) -> None:
    rel, work, elsewhere = k8s.make_namespace("hpd-system"), k8s.make_namespace("models"), k8s.make_namespace("other")
    release = "hpd"
    adopt_crd(k8s.helm, k8s.kubeconfig, release, rel)
    # cluster scope (the ClusterRole the fence is for); the operator watches `work` only, so CRs that other tests
    # leave in unlabelled namespaces cannot make it hit the fence (a 403 fails the proof)
    sets = ["--set", "operator.resyncSeconds=2", "--set", f"watchNamespaces[0]={work}"]
    k8s.helm.run("install", release, str(CHART), "-n", rel, *sets, kubeconfig=k8s.kubeconfig)
    try:
        sa_kc = sa_kubeconfig(k8s.kubeconfig, rel, f"{release}-hybrid-pd-operator", k8s.tmp / "sa.kubeconfig")
        apps, rbac = client.AppsV1Api(sa_api(sa_kc)), client.RbacAuthorizationV1Api(sa_api(sa_kc))
        dry = {"dry_run": "All"}
        own_role = f"{release}-hybrid-pd-operator"

        # Without the fence: the token writes anywhere its ClusterRole reaches (what the README now says plainly).
        assert outcome(lambda: apps.create_namespaced_deployment(elsewhere, deployment("stray"), **dry)) == "ok"
        assert (
            outcome(lambda: rbac.create_namespaced_role_binding("kube-system", rolebinding("x", own_role), **dry))
            == "ok"
        )

        k8s.helm.run("upgrade", release, str(CHART), "-n", rel, *sets, "--set", "rbac.fence.enabled=true",
                     kubeconfig=k8s.kubeconfig)  # fmt: skip
        client.CoreV1Api(k8s.api).patch_namespace(work, {"metadata": {"labels": dict([LABEL])}})

        def refused_elsewhere() -> str | None:
            got = outcome(lambda: apps.create_namespaced_deployment(elsewhere, deployment("stray"), **dry))
            return got if got != "ok" else None

        refusal = wait_for(refused_elsewhere, 30, what="the fence enforced")
        assert refusal.startswith("403 ") and f"namespace {elsewhere} is not" in refusal, refusal
        got = outcome(lambda: rbac.create_namespaced_role_binding("kube-system", rolebinding("x", own_role), **dry))
        assert got.startswith("403 ") and "rbac.fence" in got, got

        # Inside the labelled namespace: nothing that no HybridPDDeployment owns, created or changed.
        got = outcome(lambda: apps.create_namespaced_deployment(work, deployment("stray"), **dry))
        assert got.startswith("403 ") and "owned by a HybridPDDeployment" in got, got
        admin_apps = client.AppsV1Api(k8s.api)
        admin_apps.create_namespaced_deployment(work, deployment("theirs"))
        got = outcome(lambda: apps.patch_namespaced_deployment("theirs", work, {"spec": {"replicas": 3}}, **dry))
        assert got.startswith("403 ") and "is not" in got, got
        got = outcome(lambda: apps.delete_namespaced_deployment("theirs", work, **dry))
        assert got.startswith("403 "), got

        # ... while the operator, as this ServiceAccount, reconciles a CR there from create to delete, no 403.
        op = k8s.start_operator(sa_kc, chart_args(k8s.api, release, rel))
        prove(k8s.api, op, work, images=(chart_default("vllm"), chart_default("router")))
        assert admin_apps.read_namespaced_deployment("theirs", work).spec.replicas == 0
    finally:
        k8s.helm.run("uninstall", release, "-n", rel, kubeconfig=k8s.kubeconfig, check=False)
