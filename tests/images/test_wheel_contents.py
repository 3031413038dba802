"""The operator's wheel (what goes into every image) carries the operator and the runtime, never the test harness."""

from __future__ import annotations

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
