"""`python -m hpd_operator render`: every example renders; invalid specs print the InvalidSpec text and exit 2."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.__main__ import main
from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.profile_model import Profile
from hpd_operator.render import RenderError, load_documents, render
from hpd_operator.validation import validate

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def engine_args(manifests: list[dict[str, Any]], role: str) -> list[str]:
    """The vLLM args of a role, from a builder Deployment or from the profile view (before builders existed)."""
    for m in manifests:
        if m.get("kind") == "HybridPDProfile" and m.get("role") == role:
            return list(m["args"])
        if m.get("kind") == "Deployment" and m["metadata"]["labels"].get("app.kubernetes.io/component") == role:
            return list(m["spec"]["template"]["spec"]["containers"][0]["args"])
    raise AssertionError(f"no {role} engine in the output")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"nemotron-3-nano.yaml", "heterogeneous-tp.yaml", "minimal.yaml"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["render", "-f", str(example)], capsys)
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    for role in ("prefill", "decode"):
        assert "--kv-transfer-config" in engine_args(docs, role)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_as_json(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["render", "-f", str(example), "-o", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == "List" and len(doc["items"]) >= 2
    assert engine_args(doc["items"], "decode")


def test_seed_example_has_the_seed_settings(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(["render", "-f", str(REPO / "examples" / "nemotron-3-nano.yaml")], capsys)
    args = engine_args(list(yaml.safe_load_all(out)), "decode")
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert "--block-size" not in args  # vLLM picks the Mamba-aligned size (an explicit 128 broke P->D on 0.20)
    assert args[args.index("--max-model-len") + 1] == "8192"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.85"
    assert "--no-async-scheduling" in args


def test_invalid_spec_prints_the_condition_text_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = {
        "apiVersion": "hybridpd.io/v1alpha1",
        "kind": "HybridPDDeployment",
        "metadata": {"name": "bad"},
        "spec": {"model": {"name": "x/y"}, "prefill": {"tensorParallelSize": 3}, "decode": {"tensorParallelSize": 2}},
    }
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    code, out, err = run(["render", "-f", str(f)], capsys)
    assert code == 2 and out == ""
    assert "HybridPDDeployment bad is invalid" in err
    try:
        validate(HybridPDDeployment.model_validate(bad))
    except Exception as e:  # the operator's condition message
        assert str(e) in err
        assert "spec.decode.tensorParallelSize" in str(e)


def test_schema_errors_also_exit_2_with_the_field_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("kind: HybridPDDeployment\nmetadata: {name: b}\nspec: {model: {name: m}, decode: {replicas: -1}}\n")
    code, _, err = run(["render", "-f", str(f)], capsys)
    assert code == 2
    assert "spec.decode.replicas" in err


def test_multi_document_file_renders_all_crs() -> None:
    text = "\n---\n".join(p.read_text() for p in EXAMPLES)
    manifests = render(load_documents(text), builder=lambda cr, prof: [{"kind": "X", "name": cr.metadata.name}])
    assert len(manifests) == len(EXAMPLES)


def test_render_uses_the_builder_hook() -> None:
    seen: list[Profile] = []

    def build_all(cr: HybridPDDeployment, profile: Profile) -> list[dict[str, object]]:
        seen.append(profile)
        return [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{cr.metadata.name}-decode"}}]

    out = render(load_documents((REPO / "examples" / "minimal.yaml").read_text()), builder=build_all)
    assert out[0]["kind"] == "Deployment" and seen[0].row == "0.20"


def test_render_error_carries_the_spec_error() -> None:
    with pytest.raises(RenderError) as ei:
        render(
            [
                {
                    "kind": "HybridPDDeployment",
                    "metadata": {"name": "n"},
                    "spec": {"model": {"name": "m"}, "blockSize": 40},
                }
            ]
        )
    assert ei.value.name == "n" and ei.value.error.rule == "block-size-multiple-of-16"


def test_stdin_and_module_entry_point() -> None:
    text = (REPO / "examples" / "minimal.yaml").read_text()
    proc = subprocess.run(
        [sys.executable, "-m", "hpd_operator", "render", "-f", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--kv-transfer-config" in proc.stdout


def test_no_cr_in_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "cm.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    code, _, err = run(["render", "-f", str(f)], capsys)
    assert code == 1 and "no HybridPDDeployment" in err


def test_profile_view_is_the_fallback_builder() -> None:
    from hpd_operator.render import profile_manifests

    docs = render(load_documents((REPO / "examples" / "minimal.yaml").read_text()), builder=profile_manifests)
    assert [d["kind"] for d in docs] == ["HybridPDProfile", "HybridPDProfile"]
    assert [d["role"] for d in docs] == ["prefill", "decode"]


def test_dump_is_deterministic() -> None:
    from hpd_operator.render import dump

    objs = load_documents((REPO / "examples" / "nemotron-3-nano.yaml").read_text())
    a, b = io.StringIO(), io.StringIO()
    dump(render(objs), "yaml", a)
    dump(render(objs), "yaml", b)
    assert a.getvalue() == b.getvalue()
