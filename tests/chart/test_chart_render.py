"""The chart with the real helm, no cluster: lint, template (default and every toggle), values documentation,
and the parts that must agree with the operator (appVersion, default images, the CRD copy)."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import yaml

from hpd_operator.api import constants as c

from .helmkit import CHART, CRD_FILE, CRD_NAME, REPO, Helm, find, kinds

ALL_TOGGLES = CHART / "ci" / "all-toggles-values.yaml"


def values() -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return out


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = find(docs, "Deployment")
    out: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return out


def test_helm_lint_strict_default_and_all_toggles(helm: Helm) -> None:
    helm.run("lint", "--strict", str(CHART))
    helm.run("lint", "--strict", str(CHART), "-f", str(ALL_TOGGLES))


def test_default_render_is_a_cluster_scoped_operator_with_its_crd(helm: Helm) -> None:
    docs = helm.template()
    assert kinds(docs) == sorted(
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRole",  # -nodes: nodes list (rbac.readNodes)
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            "ValidatingAdmissionPolicy",  # admission.checkSecretReferences
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",  # rbac.fence (on by default)
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",  # rbac.fence's warning on a CR in a namespace that did not opt in
            "ValidatingAdmissionPolicyBinding",
            "NetworkPolicy",  # networkPolicy: the operator pod's ingress
        ]
    )
    dep = find(docs, "Deployment", "hpd-hybrid-pd-operator")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "hpd-hybrid-pd-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctr = container(docs)
    assert ctr["image"] == "ghcr.io/hybridpd/hybrid-pd-operator:0.1.0"
    assert ctr["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert ctr["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert "readinessProbe" not in ctr
    assert ctr["resources"]["limits"]["memory"] == "256Mi" and ctr["resources"]["requests"]
    assert ctr["args"] == [
        "--liveness-port=8080",
        "--metrics-port=9090",
        "--resync-seconds=300",
        "--workers=4",
        "--recheck-seconds=10",
        f"--vllm-image={c.VLLM_IMAGE_TEMPLATE}",
        f"--router-image={c.DEFAULT_ROUTER_IMAGE}",
    ]  # no --namespace: every namespace
    svc = find(docs, "Service", "hpd-hybrid-pd-operator-metrics")
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    crb = find(docs, "ClusterRoleBinding", "hpd-hybrid-pd-operator")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "hpd-hybrid-pd-operator", "namespace": "hpd-system"}]
    crd = find(docs, "CustomResourceDefinition", CRD_NAME)
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_workers_and_recheck_seconds_reach_the_operators_own_arguments(helm: Helm) -> None:
    from hpd_operator.__main__ import build_parser

    args = container(helm.template("--set", "operator.workers=12", "--set-json", "operator.recheckSeconds=2.5"))["args"]
    assert "--workers=12" in args and "--recheck-seconds=2.5" in args
    ns = build_parser().parse_args(["run", *args])  # what `python -m hpd_operator run` makes of them
    assert (ns.workers, ns.recheck_seconds, ns.resync_seconds) == (12, 2.5, 300.0)


def test_all_toggles_render_namespaced_rbac_only_in_watched_namespaces(helm: Helm) -> None:
    docs = helm.template("-f", str(ALL_TOGGLES))
    cluster_scoped = [d["metadata"]["name"] for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert cluster_scoped == ["hpd-op-nodes"] * 2  # only the nodes read (rbac.readNodes; fullnameOverride hpd-op)
    roles = sorted((d["metadata"]["namespace"], d["kind"]) for d in docs if d["kind"] in ("Role", "RoleBinding"))
    assert roles == [("team-a", "Role"), ("team-a", "RoleBinding"), ("team-b", "Role"), ("team-b", "RoleBinding")]
    for rb in (d for d in docs if d["kind"] == "RoleBinding"):
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "hpd-operator-sa", "namespace": "hpd-system"}]
    ctr = container(docs)
    assert ctr["image"].endswith("@sha256:" + "0123456789abcdef" * 4)
    assert "--namespace=team-a" in ctr["args"] and "--namespace=team-b" in ctr["args"] and "--verbose" in ctr["args"]
    assert "--vllm-image=registry.example.com/vllm-runtime:0.22.0" in ctr["args"]
    assert ctr["env"] == [{"name": "PYTHONFAULTHANDLER", "value": "1"}]
    crd = find(docs, "CustomResourceDefinition")
    assert "annotations" not in crd["metadata"]  # crds.keep=false
    assert find(docs, "Service")["spec"]["type"] == "NodePort"


def test_namespace_scope_without_watch_list_watches_the_release_namespace(helm: Helm) -> None:
    docs = helm.template("--set", "rbac.scope=namespace", namespace="ml-serving")
    assert [(d["kind"], d["metadata"]["namespace"]) for d in docs if d["kind"] in ("Role", "RoleBinding")] == [
        ("Role", "ml-serving"),
        ("RoleBinding", "ml-serving"),
    ]
    assert "--namespace=ml-serving" in container(docs)["args"]
    assert [d["metadata"]["name"] for d in docs if d["kind"].startswith("Cluster")] == [
        "hpd-hybrid-pd-operator-nodes"
    ] * 2
    no_nodes = helm.template("--set", "rbac.scope=namespace", "--set", "rbac.readNodes=false", namespace="ml-serving")
    assert not [d for d in no_nodes if d["kind"].startswith("Cluster")]


def test_the_same_rules_in_both_scopes(helm: Helm) -> None:
    cluster = find(helm.template(), "ClusterRole", "hpd-hybrid-pd-operator")["rules"]
    namespaced = find(helm.template("--set", "rbac.scope=namespace"), "Role")["rules"]
    assert cluster == namespaced
    granted = {
        (g, r, v) for rule in cluster for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    for never in ("*", "escalate", "bind", "impersonate", "update", "deletecollection"):
        assert not [x for x in granted if x[2] == never and not x[1].endswith("/finalizers")], never
    assert not [x for x in granted if x[1] == "pods" and x[2] not in ("get", "list", "watch")]
    assert not [x for x in granted if x[1] in ("secrets", "configmaps", "nodes", "namespaces")]
    assert ("", "events", "create") in granted
    nodes = find(helm.template(), "ClusterRole", "hpd-hybrid-pd-operator-nodes")["rules"]
    assert nodes == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    assert ("hybridpd.io", "hybridpddeployments/finalizers", "update") in granted


def test_crds_disabled_and_rbac_off_render_no_crd_and_no_rbac(helm: Helm) -> None:
    docs = helm.template(
        "--set", "crds.enabled=false", "--set", "rbac.create=false", "--set", "admission.checkSecretReferences=false"
    )  # fmt: skip
    # the fence is admission, not RBAC: it stays (rules granted by hand reach as far as the chart's would)
    fence = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2
    assert kinds(docs) == sorted(["Deployment", "NetworkPolicy", "Service", "ServiceAccount", *fence])


def test_chart_crd_is_the_generated_crd_plus_labels_and_keep(helm: Helm) -> None:
    rendered = find(helm.template(), "CustomResourceDefinition")
    source = yaml.safe_load(CRD_FILE.read_text())
    md = rendered.pop("metadata")
    assert md["name"] == CRD_NAME and md["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert rendered == {k: v for k, v in source.items() if k != "metadata"}


def test_app_version_is_the_operator_version_and_image_defaults_are_the_operators() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    v = values()
    assert v["image"]["repository"] == "ghcr.io/hybridpd/hybrid-pd-operator" and v["image"]["tag"] == ""
    assert v["images"] == {"vllm": c.VLLM_IMAGE_TEMPLATE, "router": c.DEFAULT_ROUTER_IMAGE, "vllmDigests": {}}


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w.-]*):")


def test_every_value_is_documented() -> None:
    """helm-docs style: every key has a `# --` comment right above it, unless a documented ancestor covers it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented, covered_below = [], -1
    for i, line in enumerate(lines):
        m = _KEY.match(line)
        if not m:
            continue
        indent = len(m["indent"])
        if covered_below >= 0 and indent > covered_below:
            continue  # inside a documented default (e.g. resources.requests)
        covered_below = -1
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("#") and not lines[j].lstrip().startswith("# --"):
            j -= 1
        documented = j >= 0 and lines[j].lstrip().startswith("# --")
        is_group = line.rstrip().endswith(":")
        if documented:
            covered_below = indent
        elif not is_group:
            undocumented.append(f"{i + 1}: {line.strip()}")
    assert not undocumented, "values without a `# --` comment:\n" + "\n".join(undocumented)


@pytest.mark.parametrize("ports", [("8080", "8080")])
def test_template_refuses_equal_liveness_and_metrics_ports(helm: Helm, ports: tuple[str, str]) -> None:
    p = helm.run(
        "template", "x", str(CHART), "--set", f"operator.livenessPort={ports[0]}", "--set",
        f"operator.metricsPort={ports[1]}", check=False,
    )  # fmt: skip
    assert p.returncode != 0 and "operator.livenessPort and operator.metricsPort must differ" in p.stderr


def test_the_operator_pods_network_policy_admits_only_its_metrics_port(helm: Helm) -> None:
    np = find(helm.template(), "NetworkPolicy", "hpd-hybrid-pd-operator")
    dep = find(helm.template(), "Deployment", "hpd-hybrid-pd-operator")
    assert np["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert np["spec"]["policyTypes"] == ["Ingress"]
    assert np["spec"]["ingress"] == [{"ports": [{"port": 9090, "protocol": "TCP"}]}]  # from anywhere, nothing else
    docs = helm.template("-f", str(CHART / "ci" / "all-toggles-values.yaml"))
    rules = find(docs, "NetworkPolicy", "hpd-op")["spec"]["ingress"]
    assert [r["ports"][0]["port"] for r in rules] == [9091, 8081]
    assert rules[0]["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert not [d for d in helm.template("--set", "networkPolicy.enabled=false") if d["kind"] == "NetworkPolicy"]


def test_vllm_digests_become_the_operators_digest_flags(helm: Helm) -> None:
    digest = "sha256:" + "0" * 64
    args = container(helm.template("--set", f"images.vllmDigests.0\\.20\\.0={digest}"))["args"]
    assert f"--vllm-image-digest=0.20.0={digest}" in args
    assert not [a for a in container(helm.template())["args"] if a.startswith("--vllm-image-digest")]
