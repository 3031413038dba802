"""bench/gpu/result_file.py names the machine from the GPU run.py recorded: a result measured on a lent H100 must not
say H200 (it did, hard-coded, until the 2026-12-08 pair-pod run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_result_file", BENCH / "result_file.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_machine_is_the_recorded_gpu() -> None:
    rf = load()
    assert rf.machine("NVIDIA H100 80GB HBM3") == "nvidia-h100-x1: 1x H100 80GB HBM3"
    assert rf.machine("NVIDIA H200") == "nvidia-h200: 1x H200"
    assert rf.machine("NVIDIA H200\nNVIDIA H200\n") == "nvidia-h200-x2: 2x H200"
    assert rf.machine("NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3") == "nvidia-h100-x2: 2x H100 80GB HBM3"
    assert rf.machine("") == "no GPU seen ()"
    assert rf.machine("none (nvidia-smi not found)") == "no GPU seen (none (nvidia-smi not found))"
    assert rf.machine("NVIDIA A100-SXM4-80GB") == "kind not recorded: 1x A100-SXM4-80GB"
    assert rf.machine("NVIDIA H200\nNVIDIA H100 80GB HBM3") == "kind not recorded: 2x H200"
