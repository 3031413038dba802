"""The release workflow lints clean (actionlint) and publishes exactly the references the operator defaults to."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.api import constants

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yaml"


def actionlint() -> str:
    """The binary hack/actionlint.sh built into the cache (hack/test.sh runs it; instant once built)."""
    out = subprocess.run([str(REPO / "hack" / "actionlint.sh")], capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"actionlint missing and hack/actionlint.sh could not build it:\n{out.stderr}"
    return out.stdout.strip()


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def operator_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def test_actionlint_is_clean() -> None:
    out = subprocess.run([actionlint(), "-no-color", str(WORKFLOW)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / ".github" / "workflows" / "release.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text(WORKFLOW.read_text().replace("needs.version.outputs.version", "needs.versoin.outputs.version"))
    out = subprocess.run([actionlint(), "-no-color", str(broken)], capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "versoin" in out.stdout


def test_runs_on_version_tags_only(workflow: dict[str, Any]) -> None:
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert triggers == {"push": {"tags": ["v*"]}}


def test_publishes_exactly_the_default_image_references(workflow: dict[str, Any]) -> None:
    env = workflow["env"]
    published = {
        f"{env['REGISTRY']}/{env['NAMESPACE']}/{item['image']}:{item['tag'] or operator_version()}"
        for item in workflow["jobs"]["images"]["strategy"]["matrix"]["include"]
    }
    assert published == {
        f"ghcr.io/hybridpd/hybrid-pd-operator:{operator_version()}",
        constants.DEFAULT_VLLM_IMAGE,
        constants.DEFAULT_ROUTER_IMAGE,
    }


def test_build_args_match_the_dockerfile_defaults(workflow: dict[str, Any]) -> None:
    for item in workflow["jobs"]["images"]["strategy"]["matrix"]["include"]:
        dockerfile = (REPO / item["dockerfile"]).read_text()
        for line in item["build-args"].split():
            assert re.search(rf"^ARG {re.escape(line)}$", dockerfile, re.M), f"{item['dockerfile']}: ARG {line}"
    vllm = next(i for i in workflow["jobs"]["images"]["strategy"]["matrix"]["include"] if i["image"] == "vllm-runtime")
    assert f"VLLM_IMAGE=vllm/vllm-openai:v{constants.DEFAULT_VLLM_VERSION}" in vllm["build-args"].split()
    assert vllm["tag"] == constants.DEFAULT_VLLM_VERSION


def test_chart_goes_to_the_oci_repository(workflow: dict[str, Any]) -> None:
    env = workflow["env"]
    script = workflow["jobs"]["chart"]["steps"][-1]["run"]
    push = next(line.strip() for line in script.splitlines() if line.strip().startswith("helm push"))
    resolved = push.replace("${REGISTRY}", env["REGISTRY"]).replace("${NAMESPACE}", env["NAMESPACE"])
    assert resolved == 'helm push "dist/hybrid-pd-operator-${VERSION}.tgz" "oci://ghcr.io/hybridpd/charts"'
    assert workflow["jobs"]["chart"]["needs"] == ["version", "images"]
