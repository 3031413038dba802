"""What we ship passes a platform team's scanners: checkov 3.3.30 (its Kubernetes checks, hack/scan-tools.sh) and
kubernetes-validate (strict, the schemas of our Kubernetes 1.35) on the chart's renders (defaults and every toggle)
and on every example's children as the operator applies them (`hpd_operator.render`, the same builders).

Every check checkov fails is either fixed or listed in ACCEPTED with its reason; a failure not listed fails the test,
and so does a listed one that no longer fails anywhere, so the list can neither grow nor go stale silently."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hpd_operator.render import load_documents, render

from .helmkit import CHART, REPO, Helm

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
ALL_TOGGLES = CHART / "ci" / "all-toggles-values.yaml"
KUBERNETES = "1.35.0"
CUSTOM_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "LeaderWorkerSet"}
"""Kinds of other projects' CRDs: no schema in kubernetes-validate (the CRDs' own tests cover them)."""

NO_CPU_LIMIT = "no CPU limit by design: CFS throttling adds latency to every request (requests are set)"
UNPINNED = (
    "tags in the examples and the chart's defaults; production pins digests (image.digest, images.*, spec.image as "
    "repo@sha256:..., docs/install.md) and status.profile names every unpinned image"
)
PULL_POLICY = (
    "IfNotPresent (the kubelet's default) on purpose: Always makes every start of a GPU pod wait on the registry for "
    "a multi-GB image, and a pinned digest cannot change under the same reference anyway"
)
ACCEPTED: dict[tuple[str, str], str] = {
    ("CKV_K8S_9", "operator"): "no readiness probe by design (kopf's deployment guide): the operator serves no traffic",
    ("CKV_K8S_11", "operator"): NO_CPU_LIMIT,
    ("CKV_K8S_11", "router"): NO_CPU_LIMIT,
    ("CKV_K8S_11", "prefill"): NO_CPU_LIMIT,
    ("CKV_K8S_11", "decode"): NO_CPU_LIMIT,
    ("CKV_K8S_13", "prefill"): "no memory limit by default: a limit OOM-kills a loading model (spec.<role>.resources)",
    ("CKV_K8S_13", "decode"): "no memory limit by default: a limit OOM-kills a loading model (spec.<role>.resources)",
    ("CKV_K8S_15", "operator"): PULL_POLICY,
    ("CKV_K8S_15", "router"): PULL_POLICY,
    ("CKV_K8S_15", "prefill"): PULL_POLICY,
    ("CKV_K8S_15", "decode"): PULL_POLICY,
    ("CKV_K8S_38", "operator"): "the operator is a Kubernetes client: it needs its token",
    ("CKV_K8S_38", "router"): "vllm-router discovers the engines by watching pods: it needs its token (Role: pods)",
    (
        "CKV_K8S_38",
        "decode",
    ): "decode with the pair check reports its KV path (<cr>-kv-reporter token); prefill has none",
    ("CKV_K8S_43", "operator"): UNPINNED,
    ("CKV_K8S_43", "router"): UNPINNED,
    ("CKV_K8S_43", "prefill"): UNPINNED,
    ("CKV_K8S_43", "decode"): UNPINNED,
}
"""(check id, component) -> why it fails by design. Component: the operator (the chart's Deployment), the router, or
an engine role, from the object's name."""
OPERATOR_NAMES = {"hpd-hybrid-pd-operator", "hpd-op"}
"""The chart's objects in these renders (release `hpd`; ci/all-toggles-values.yaml's fullnameOverride)."""
NAMESPACE = "models"
"""The operator applies every child into its CR's namespace; the examples leave it out (kubectl -n picks it)."""


def component(resource: str) -> str:
    """`Deployment.models.nano-decode-1a2b3c4d` -> `decode`; the chart's objects -> `operator`."""
    name = resource.split(".", 2)[-1]
    if name in OPERATOR_NAMES:
        return "operator"
    if name.endswith("-router"):
        return "router"
    for role in ("prefill", "decode"):
        if f"-{role}-" in name:
            return role
    return name


@pytest.fixture(scope="module")
def renders(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory: chart-default.yaml, chart-all-toggles.yaml and example-<name>.yaml (the operator's children)."""
    out = tmp_path_factory.mktemp("renders")
    (out / "chart-default.yaml").write_text(yaml.safe_dump_all(helm.template(), sort_keys=False))
    all_toggles = helm.template("-f", str(ALL_TOGGLES))
    (out / "chart-all-toggles.yaml").write_text(yaml.safe_dump_all(all_toggles, sort_keys=False))
    for ex in EXAMPLES:
        crs = load_documents(ex.read_text())
        for cr in crs:
            cr["metadata"]["namespace"] = NAMESPACE
        docs = render(crs)
        (out / f"example-{ex.stem}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return out


def documents(renders: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for f in sorted(renders.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                yield f.name, doc


def checkov() -> Path:
    p = subprocess.run(
        [str(REPO / "hack" / "scan-tools.sh")], check=False, capture_output=True, text=True, timeout=1800
    )
    assert p.returncode == 0, f"hack/scan-tools.sh failed (checkov is a prerequisite of this test):\n{p.stderr}"
    return Path(p.stdout.strip())


def failed_checks(renders: Path) -> list[dict[str, Any]]:
    p = subprocess.run(
        [str(checkov()), "-d", str(renders), "--framework", "kubernetes", "-o", "json", "--quiet", "--compact"],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode in (0, 1), p.stderr  # 1: some check failed (judged below)
    report = json.loads(p.stdout)
    reports = report if isinstance(report, list) else [report]
    out = [c for r in reports for c in r.get("results", {}).get("failed_checks", [])]
    passed = sum(r.get("summary", {}).get("passed", 0) for r in reports)
    assert passed > 100, f"checkov passed only {passed} checks: did it read the renders?"
    return out


def test_checkov_finds_no_failure_that_is_not_explained(renders: Path) -> None:
    failed = failed_checks(renders)
    seen = {(c["check_id"], component(c["resource"])) for c in failed}
    unexplained = sorted(
        f"{c['check_id']} {c['check_name']}: {c['resource']} ({Path(c['file_path']).name})"
        for c in failed
        if (c["check_id"], component(c["resource"])) not in ACCEPTED
    )
    assert not unexplained, "fix these, or add them to ACCEPTED with the reason:\n" + "\n".join(unexplained)
    stale = sorted(set(ACCEPTED) - seen)
    assert not stale, f"ACCEPTED lists checks that no longer fail (remove them): {stale}"


def test_every_rendered_object_is_valid_for_kubernetes_strictly(renders: Path) -> None:
    errors, checked = [], 0
    for name, doc in documents(renders):
        try:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
            checked += 1
        except kubernetes_validate.SchemaNotFoundError:
            if doc["kind"] not in CUSTOM_KINDS and doc["apiVersion"].split("/")[0] != "hybridpd.io":
                errors.append(f"{name}: no schema for {doc['apiVersion']} {doc['kind']}")
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{name}: {doc['kind']} {doc['metadata'].get('name')}: {e.message}")
    assert not errors, "\n".join(errors)
    assert checked > 50, checked
