"""helm install / upgrade (with a CRD change) / uninstall into the real local control plane, in both RBAC scopes.
kwok runs the operator's pod (it becomes Ready without running anything), so `--wait` works as on a real cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from hpd_devcluster.testing import wait_for

from .conftest import Cluster
from .helmkit import CHART, CRD_NAME, Helm, adopt_crd, restore_crd

pytestmark = pytest.mark.cluster


def change_crd(chart: Path) -> None:
    """A CRD change as a release would make one: a new printer column and a new optional spec field."""
    f = chart / "files" / "crds" / f"{CRD_NAME}.yaml"
    crd = yaml.safe_load(f.read_text())
    version = crd["spec"]["versions"][0]
    version["additionalPrinterColumns"].insert(
        3, {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "priority": 0}
    )
    version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["upgradeProbe"] = {"type": "string"}
    f.write_text(yaml.safe_dump(crd, sort_keys=False))
    meta = chart / "Chart.yaml"
    meta.write_text(meta.read_text().replace("version: 0.1.0", "version: 0.1.1", 1))


def served_crd(helm: Helm, kubeconfig: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(helm.kubectl(kubeconfig, "get", "crd", CRD_NAME, "-o", "json").stdout)
    return out


def rbac_objects(api: client.ApiClient, release: str, ns: str) -> list[str]:
    rbac = client.RbacAuthorizationV1Api(api)
    sel = f"app.kubernetes.io/instance={release}"
    found = [f"ClusterRole/{o.metadata.name}" for o in rbac.list_cluster_role(label_selector=sel).items]
    found += [f"ClusterRoleBinding/{o.metadata.name}" for o in rbac.list_cluster_role_binding(label_selector=sel).items]
    found += [f"Role/{o.metadata.name}" for o in rbac.list_namespaced_role(ns, label_selector=sel).items]
    found += [f"RoleBinding/{o.metadata.name}" for o in rbac.list_namespaced_role_binding(ns, label_selector=sel).items]
    return sorted(found)


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_install_upgrade_with_crd_change_and_uninstall(scope: str, k8s: Cluster, chart_copy: Path) -> None:
    helm, kubeconfig, api_client = k8s.helm, k8s.kubeconfig, k8s.api
    ns, release = k8s.make_namespace("hpd-system"), f"hpd-{scope}"
    full = f"{release}-hybrid-pd-operator"
    adopt_crd(helm, kubeconfig, release, ns)
    try:
        out = helm.run(
            "install", release, str(CHART), "-n", ns, "--set", f"rbac.scope={scope}", "--wait", "--timeout", "90s",
            kubeconfig=kubeconfig,
        ).stdout  # fmt: skip
        assert "kubectl get hpd" in out and "status.endpoint" in out  # NOTES.txt
        apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
        dep = apps.read_namespaced_deployment(full, ns)
        assert dep.status.ready_replicas == 1 and dep.spec.template.spec.service_account_name == full
        assert core.read_namespaced_service_account(full, ns) and core.read_namespaced_service(f"{full}-metrics", ns)
        kinds = ["ClusterRole", "ClusterRoleBinding"] if scope == "cluster" else ["Role", "RoleBinding"]
        nodes = [f"ClusterRole/{full}-nodes", f"ClusterRoleBinding/{full}-nodes"]  # rbac.readNodes, both scopes
        assert rbac_objects(api_client, release, ns) == sorted([*(f"{k}/{full}" for k in kinds), *nodes])

        # A bad value fails at upgrade with the schema's message, and the release stays as it was.
        bad = helm.run("upgrade", release, str(CHART), "-n", ns, "--set", "rbac.scope=everything",
                       kubeconfig=kubeconfig, check=False)  # fmt: skip
        assert bad.returncode != 0 and "- rbac.scope: rbac.scope must be one of the following" in bad.stderr, bad.stderr
        assert (
            json.loads(helm.run("history", release, "-n", ns, "-o", "json", kubeconfig=kubeconfig).stdout)[-1][
                "revision"
            ]
            == 1
        )

        # Upgrade with a changed CRD: the new column and field are served afterwards.
        assert "Model" not in [
            c["name"] for c in served_crd(helm, kubeconfig)["spec"]["versions"][0]["additionalPrinterColumns"]
        ]
        change_crd(chart_copy)
        helm.run("upgrade", release, str(chart_copy), "-n", ns, "--set", f"rbac.scope={scope}", "--wait",
                 "--timeout", "90s", kubeconfig=kubeconfig)  # fmt: skip
        crd = served_crd(helm, kubeconfig)
        assert [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]] == [
            "Ready", "Prefill", "Decode", "Model", "Gen", "Rollout", "Prefill-Scaler", "Decode-Scaler", "Serving", "Endpoint",
            "Age",
        ]  # fmt: skip
        cr = {
            "apiVersion": "hybridpd.io/v1alpha1",
            "kind": "HybridPDDeployment",
            "metadata": {"name": "probe"},
            "spec": {"model": {"name": "nvidia/probe-model"}, "upgradeProbe": "kept"},
        }
        helm.kubectl(kubeconfig, "apply", "-n", ns, "-f", "-", stdin=json.dumps(cr))
        stored = json.loads(helm.kubectl(kubeconfig, "get", "hpd", "probe", "-n", ns, "-o", "json").stdout)
        assert stored["spec"]["upgradeProbe"] == "kept"  # not pruned: the new schema is the one served
        table = helm.kubectl(kubeconfig, "get", "hpd", "probe", "-n", ns).stdout
        # the default table: the scaler columns are priority 1 (-o wide), Gen and Rollout are not
        header = table.splitlines()[0].split()
        assert header == ["NAME", "READY", "PREFILL", "DECODE", "MODEL", "GEN", "ROLLOUT", "ENDPOINT", "AGE"]
        assert "nvidia/probe-model" in table
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

        # Uninstall: the operator and its RBAC go; the CRD and the CRs stay (crds.keep).
        helm.run("uninstall", release, "-n", ns, "--wait", "--timeout", "90s", kubeconfig=kubeconfig)
        wait_for(lambda: not apps.list_namespaced_deployment(ns).items, 30, what="operator Deployment deleted")
        assert rbac_objects(api_client, release, ns) == []
        assert not [s for s in core.list_namespaced_service_account(ns).items if s.metadata.name == full]
        assert served_crd(helm, kubeconfig)["metadata"]["name"] == CRD_NAME
        helm.kubectl(kubeconfig, "get", "hpd", "probe", "-n", ns)
    finally:
        helm.run("uninstall", release, "-n", ns, kubeconfig=kubeconfig, check=False)
        restore_crd(helm, kubeconfig)
