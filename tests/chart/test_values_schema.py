"""values.schema.json: accepts values.yaml and ci/*.yaml (jsonschema, no helm) and makes helm itself reject bad
values with a message that names the value and the rule (helm template runs the same validation as install)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from .helmkit import CHART, Helm

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


@pytest.mark.parametrize("path", [CHART / "values.yaml", *sorted((CHART / "ci").glob("*.yaml"))], ids=lambda p: p.name)
def test_shipped_values_validate(path: Path) -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(yaml.safe_load(path.read_text()))


# (case, values, the field helm must name, what helm 3.18 says about it)
BAD: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "scope-typo",
        {"rbac": {"scope": "cluster-wide"}},
        "rbac.scope",
        'must be one of the following: "cluster", "namespace"',
    ),
    ("unknown-key", {"rbac": {"scopes": "namespace"}}, "rbac", "Additional property scopes is not allowed"),
    ("unknown-top-level-key", {"watchNamespace": ["a"]}, "(root)", "Additional property watchNamespace is not allowed"),
    ("namespace-not-dns", {"watchNamespaces": ["Team_A"]}, "watchNamespaces.0", "Does not match pattern"),
    ("duplicate-namespaces", {"watchNamespaces": ["a", "a"]}, "watchNamespaces", "must be unique"),
    ("numeric-tag", {"image": {"tag": 1.1}}, "image.tag", "Expected: string, given: number"),
    (
        "bad-digest",
        {"image": {"digest": "sha256:abc"}},
        "image.digest",
        "Does not match pattern '^(sha256:[a-f0-9]{64})?$'",
    ),
    ("pull-policy", {"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy", '"Always", "IfNotPresent", "Never"'),
    ("empty-vllm-image", {"images": {"vllm": ""}}, "images.vllm", "String length must be greater than or equal to 1"),
    ("image-with-space", {"images": {"router": "ghcr.io/x y:1"}}, "images.router", "Does not match pattern"),
    ("zero-resync", {"operator": {"resyncSeconds": 0}}, "operator.resyncSeconds", "Must be greater than 0"),
    ("zero-workers", {"operator": {"workers": 0}}, "operator.workers", "Must be greater than or equal to 1"),
    ("fractional-workers", {"operator": {"workers": 2.5}}, "operator.workers", "Expected: integer, given: number"),
    ("zero-recheck", {"operator": {"recheckSeconds": 0}}, "operator.recheckSeconds", "Must be greater than 0"),
    ("port-range", {"operator": {"metricsPort": 70000}}, "operator.metricsPort", "less than or equal to 65535"),
    ("bool-as-string", {"crds": {"enabled": "yes"}}, "crds.enabled", "Expected: boolean, given: string"),
    ("service-type", {"metrics": {"service": {"type": "Ingress"}}}, "metrics.service.type", '"ClusterIP", "NodePort"'),
    ("size-limit", {"tmpSizeLimit": "lots"}, "tmpSizeLimit", "Does not match pattern"),
    ("fence-bool", {"rbac": {"fence": {"enabled": "true"}}}, "rbac.fence.enabled", "Expected: boolean, given: string"),
    (
        "fence-label-key",
        {"rbac": {"fence": {"namespaceLabelKey": "not a label"}}},
        "rbac.fence.namespaceLabelKey",
        "Does not match pattern",
    ),
    (
        "fence-label-value",
        {"rbac": {"fence": {"namespaceLabelValue": "a b"}}},
        "rbac.fence.namespaceLabelValue",
        "Does not match pattern",
    ),
    ("admission-typo", {"admission": {"checkSecretRefs": False}}, "admission", "Additional property"),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_helm_rejects_bad_values_with_a_readable_message(
    helm: Helm, tmp_path: Path, case: tuple[str, dict[str, Any], str, str]
) -> None:
    name, bad, field, rule = case
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(bad))
    p = helm.run("template", "x", str(CHART), "-f", str(f), check=False)
    assert p.returncode != 0, f"helm accepted {bad}:\n{p.stdout[:2000]}"
    assert "values don't meet the specifications of the schema" in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith(f"- {field}: ")]
    assert any(rule in line for line in lines), f"no '- {field}: ...{rule}...' in helm's message:\n{p.stderr}"
