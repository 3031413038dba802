"""The committed CRD is exactly what crdgen generates, and it is a structural schema Kubernetes accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.api import crdgen
from hpd_operator.api.rules import RULES

RULE_IDS = {r.id for r in RULES}

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "hybridpddeployments.hybridpd.io.yaml"


CHART_CRD = REPO / "charts" / "hybrid-pd-operator" / "files" / "crds" / "hybridpddeployments.hybridpd.io.yaml"


def test_committed_crd_equals_regeneration() -> None:
    assert CRD.read_text() == crdgen.render_crd(), "CRD is stale: run `python -m hpd_operator.api.crdgen`"


def test_chart_crd_is_byte_identical_to_crds_dir() -> None:
    assert crdgen.CHART_CRD_PATH == CHART_CRD
    assert CHART_CRD.read_bytes() == CRD.read_bytes(), (
        "chart CRD copy is stale: run `python -m hpd_operator.api.crdgen`"
    )


def test_check_flag_covers_the_chart_copy(tmp_path: Path) -> None:
    good, stale = tmp_path / "good.yaml", tmp_path / "stale.yaml"
    good.write_text(crdgen.render_crd())
    stale.write_text(crdgen.render_crd() + "# edited by hand\n")
    assert crdgen.main(["--check", "--output", str(good), "--output", str(stale)]) == 1
    assert crdgen.main(["--check"]) == 0  # both committed copies


def test_operator_defaulted_images_have_no_crd_default(crd: dict[str, Any]) -> None:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "default" not in spec["properties"]["image"]
    router = spec["properties"]["router"]
    assert "default" not in router["properties"]["image"] and "image" not in router["default"]
    assert "x-hpd-operator-default" not in crdgen.render_crd()


def test_check_flag_detects_drift(tmp_path: Path) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text("stale\n")
    assert crdgen.main(["--check", "--output", str(stale)]) == 1
    assert crdgen.main(["--check", "--output", str(CRD)]) == 0


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for k, v in node.get("properties", {}).items():
            out += walk(v, f"{path}.{k}")
        if "items" in node:
            out += walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return dict(yaml.safe_load(CRD.read_text()))


def test_schema_is_structural(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        for bad in ("$ref", "anyOf", "oneOf", "allOf", "title", "$defs", "const"):
            assert bad not in node, f"{path or '.'} has {bad}"
        assert node.get("additionalProperties") is not False, path
        if "exclusiveMinimum" in node:
            assert isinstance(node["exclusiveMinimum"], bool), path
        assert (
            "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"
        if node.get("type") == "array":
            assert "maxItems" in node or path.startswith(".status"), f"{path}: unbounded list (CEL cost)"


def test_crd_identity_subresources_and_columns(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert spec["names"]["shortNames"] == ["hpd"] and spec["names"]["categories"] == ["all"]
    v = spec["versions"][0]
    assert v["subresources"]["status"] == {}
    assert v["subresources"]["scale"] == {
        "specReplicasPath": ".spec.decode.replicas",
        "statusReplicasPath": ".status.decode.replicas",
        "labelSelectorPath": ".status.decode.selector",
    }
    columns = ["Ready", "Prefill", "Decode", "Gen", "Rollout", "Prefill-Scaler", "Decode-Scaler", "Serving", "Endpoint",
               "Age"]  # fmt: skip
    assert [c["name"] for c in v["additionalPrinterColumns"]] == columns


def test_cel_rules_present(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r["rule"] for _, n in walk(schema) for r in n.get("x-kubernetes-validations", [])]
    text = "\n".join(rules)
    assert "self.prefill.tensorParallelSize % self.decode.tensorParallelSize == 0" in text
    assert "self.replicas >= 0" in text
    assert "self.name.matches" in text
    assert "--block[-_]size" in text


def test_defaults_reach_nested_fields(crd: dict[str, Any]) -> None:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["decode"]["default"] == {
        "replicas": 1,
        "tensorParallelSize": 1,
        "pipelineParallelSize": 1,
        "gpusPerNode": 8,
        "extraArgs": [],
    }
    assert spec["properties"]["decode"]["properties"]["replicas"]["default"] == 1
    assert spec["properties"]["vllmVersion"]["default"] == "0.20.0"
    assert spec["properties"]["kvTransfer"]["properties"]["sideChannelPort"]["default"] == 5600
    assert spec["required"] == ["model"]


def test_cel_cases_are_rejected_by_the_operator_too() -> None:
    """What the apiserver rejects (tests/crd/cel_cases.py), the operator's own validation rejects as well."""
    import pydantic
    from cel_cases import BAD_NAMES, BAD_SPECS, GOOD_SPECS  # tests/crd is on sys.path (rootdir-relative)

    from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec
    from hpd_operator.api.parse import parse_cr
    from hpd_operator.errors import SpecError
    from hpd_operator.validation import validate

    for case, spec, _ in BAD_SPECS:
        with pytest.raises((pydantic.ValidationError, SpecError)) as ei:
            validate(HybridPDDeployment(spec=HybridPDDeploymentSpec.model_validate(spec)))
        if isinstance(ei.value, SpecError) and case in RULE_IDS:
            assert case in {v.rule for v in ei.value.violations}, (case, ei.value.message)
    for _, spec in GOOD_SPECS:
        validate(HybridPDDeployment(spec=HybridPDDeploymentSpec.model_validate(spec)))
    for rule, name, _ in BAD_NAMES:
        obj = {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment", "metadata": {"name": name},
               "spec": {"model": {"name": "x/y"}}}  # fmt: skip
        with pytest.raises(SpecError) as ei2:
            parse_cr(obj)
        assert rule in {v.rule for v in ei2.value.violations}


def test_every_cel_rule_of_the_table_has_a_recorded_case() -> None:
    from cel_cases import BAD_NAMES, BAD_SPECS, BAD_UPDATES

    cases = {case for case, _, _ in BAD_SPECS} | {rule for rule, _, _ in BAD_NAMES}
    cases |= {rule for rule, _, _, _ in BAD_UPDATES}
    missing = {r.id for r in RULES if r.cel is not None} - cases
    assert not missing, f"rules without a case in tests/crd/cel_cases.py: {sorted(missing)}"
