"""The operator's wheel (what goes into every image) carries the operator and the runtime, never the test harness
or the dev-only generators, and nothing in it imports what it does not carry."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from hpd_devcluster import images


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    path: Path = images.build_wheel(tmp_path_factory.mktemp("dist"))
    return zipfile.ZipFile(path)


def test_wheel_has_no_devcluster_harness(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert not [n for n in names if n.startswith("hpd_devcluster")], "hpd_devcluster is in the wheel"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "hpd_devcluster" not in wheel.read(entry_points).decode()
    # the GEMM warmup is a vLLM general plugin: vLLM finds it only through this entry point of the installed wheel
    assert (
        "[vllm.general_plugins]\nhpd_gemm_warmup = hpd_runtime.gemm_warmup:register"
        in wheel.read(entry_points).decode()
    )
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert wheel.read(top_level).decode().split() == ["hpd_operator", "hpd_runtime"]


def test_wheel_has_the_operator_and_the_runtime(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for module in ("hpd_operator/__main__.py", "hpd_operator/api/crdgen.py", "hpd_operator/builders/__init__.py",
                   "hpd_runtime/contract.py", "hpd_runtime/py.typed", "hpd_operator/py.typed"):  # fmt: skip
        assert module in names


def test_wheel_has_the_flag_lists_but_no_dev_only_generator(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert {f"hpd_operator/vllm_flags/{v}.json" for v in ("0.20", "0.25", "0.27", "0.33")} <= names
    generators = ("hpd_operator/monitoring/", "hpd_operator/vllm_flags/generate.py", "hpd_operator/vllm_flags/_dump.py")
    dev_only = sorted(n for n in names if n.startswith(generators))
    assert not dev_only, f"dev-only code in the wheel: {dev_only}"


def _imports(source: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_every_module_the_wheel_imports_of_ours_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    """Imports at any depth (a function's lazy import too): a module of ours the wheel lacks would fail in the images,
    and the dev-only packages (hpd_devcluster, grafana_foundation_sdk) must not be reached at all."""
    names = set(wheel.namelist())
    ours = {n.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for n in names if n.endswith(".py")}
    for name in sorted(n for n in names if n.endswith(".py")):
        for module in _imports(wheel.read(name).decode()):
            top = module.split(".")[0]
            assert top not in ("hpd_devcluster", "grafana_foundation_sdk"), f"{name} imports {module}"
            if top in ("hpd_operator", "hpd_runtime"):
                parent = module.rsplit(".", 1)[0]
                assert module in ours or parent in ours, f"{name} imports {module}, which the wheel does not carry"
