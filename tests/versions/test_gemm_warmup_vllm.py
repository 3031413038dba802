"""hpd_runtime.gemm_warmup (the vLLM plugin that warms every GEMM row count before Ready, issue #12) against the real
vLLM of each supported version, on the CPU (the `vllm_parser` tier's venvs): the worker still calls the function the
plugin wraps, the wrap lands whether or not the worker module was imported first, the API server process is left
alone, and the sweep runs vLLM's own linear methods once per distinct GEMM at every row count. Whether it removes the
first-request cost at new prompt lengths is a GPU question: bench/gpu (fifth burst; `CR@no-gemm-warmup` is its baseline)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNTIME = HERE.parent.parent / "images" / "runtime"
pytestmark = pytest.mark.vllm_parser


def parser_python(version: str) -> Path:
    from test_vllm_parser_truth import parser_python as venv  # tests/versions is on sys.path (rootdir-relative)

    return venv(version)


def versions() -> tuple[str, ...]:
    from test_vllm_parser_truth import VERSIONS

    return VERSIONS


def probe(version: str, order: str, tmp: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(RUNTIME), "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run(
        [str(parser_python(version)), str(HERE / "gemm_warmup_probe.py"), order, str(tmp / "gloo-store")],
        check=False, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, f"probe failed under vLLM {version}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", versions())
def test_plugin_wraps_kernel_warmup_and_sweeps_every_row_count(version: str, tmp_path: Path) -> None:
    out = probe(version, "after", tmp_path)
    assert out["worker_imports_kernel_warmup"] and out["worker_calls_kernel_warmup"], out
    assert out["api_server_untouched"], "the plugin imported vLLM model code in the API server process"
    assert out["kernel_warmup_wrapped"] and out["worker_binding_wrapped"] and out["wrapped_once"], out
    rows = out["rows_per_gemm"]
    assert isinstance(rows, dict)
    # 5 layers, 4 distinct GEMMs, the biased one also without its bias: 5 calls per row count, rows 1..48 in order
    assert sorted(rows) == sorted([
        "64->(96, 64) bias=False", "96->(64, 96) bias=False", "64->(80, 64) bias=False", "64->(80, 64) bias=True",
        "80->(64, 80) bias=False",
    ]), rows  # fmt: skip
    assert all(v == list(range(1, 49)) for v in rows.values()), rows
    assert "done: 5 GEMM shapes x row counts 1..48" in str(out["log"]), out["log"]
    assert "left out 1: ReplicatedLinear 72->(40, 72) (RuntimeError: needs a packed input)" in str(out["log"]), out


def test_plugin_patches_a_worker_module_imported_before_it(tmp_path: Path) -> None:
    out = probe(versions()[-1], "before", tmp_path)
    assert out["kernel_warmup_wrapped"] and out["worker_binding_wrapped"], out


@pytest.mark.parametrize("version", [versions()[0], versions()[-1]])
def test_plugin_on_vllms_own_nemotron_h_warms_its_gemms_and_skips_the_conv1d(version: str, tmp_path: Path) -> None:
    """On the H200 the first version of the sweep stopped at Mamba2's conv1d: a ColumnParallelLinear whose weight the
    mixer reshapes to 3-D (`t() expects a tensor with <= 2 dimensions`) and that never runs as a GEMM. Built here by
    vLLM's own NemotronH class (the bench's tiny config without its attention layer), every real GEMM must still be
    warmed at every row count and the conv1d left out."""
    out = probe(version, "model", tmp_path)
    assert [1280, 1, 4] in out["linear_weights"], f"the model lost its 3-D conv1d weight: {out['linear_weights']}"
    rows = out["rows_per_gemm"]
    assert isinstance(rows, dict)
    # Mamba in_proj; Mamba out_proj and MLP down (same shape); MLP up
    gemms = ["512->(2320, 512) bias=False", "1024->(512, 1024) bias=False", "512->(1024, 512) bias=False"]
    assert sorted(rows) == sorted(gemms), rows
    assert all(v == list(range(1, 49)) for v in rows.values()), rows
    assert "done: 3 GEMM shapes x row counts 1..48" in str(out["log"]), out["log"]
    assert "left out" not in str(out["log"]), out["log"]
