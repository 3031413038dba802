"""hpd_runtime.gemm_warmup (the vLLM plugin that warms every GEMM row count before Ready, issue #12) against the real
vLLM of each supported version, on the CPU (the `vllm_parser` tier's venvs): the worker still calls the function the
plugin wraps, the wrap lands whether or not the worker module was imported first, the API server process is left
alone, and the sweep runs vLLM's own linear methods once per distinct GEMM at every row count. Whether it removes the
first-request cost at new prompt lengths is a GPU question: bench/gpu (the `CR@gemm-warmup` plan variant of run.py)."""

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


def test_plugin_patches_a_worker_module_imported_before_it(tmp_path: Path) -> None:
    out = probe(versions()[-1], "before", tmp_path)
    assert out["kernel_warmup_wrapped"] and out["worker_binding_wrapped"], out
