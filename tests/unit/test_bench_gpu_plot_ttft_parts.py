"""bench/gpu/plot_ttft_parts.py on a synthetic `ttft-parts` result of run.py's version-2 shape (numbers made up) and on
the version-1 result file in bench/results: one panel per level in flight plus the shares, skipped rows labelled,
components below zero drawn as zero and named in the footer."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from tests.unit.test_bench_gpu_decode_restart import BENCH, REPO, load_run

spec = importlib.util.spec_from_file_location("bench_gpu_plot_ttft_parts", BENCH / "plot_ttft_parts.py")
assert spec is not None and spec.loader is not None
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)


def row(scale: float, window: int, decode_wait: float = 3.0) -> dict[str, Any]:
    stack = {"prefill_queue": 0.1 * scale, "prefill_compute": 60.0, "descriptor_post": 7.0, "transfer": 3.0,
             "decode_wait": decode_wait, "decode_step": 10.0, "engine_handoff": 4.0, "router_http": 8.0}  # fmt: skip
    total = sum(stack.values())
    return {"parts": {"router_total_ms": total, "colocated_decode_ms": total - 30.0, "stack": stack},
            "all": {"router": [{"window_requests": {"decode": window}}] * 4}}  # fmt: skip


def result() -> dict[str, Any]:
    tp = {"version": 2, "2000": row(1, 1), "8000": row(2, 1),
          "under_load": {"4": {"2000": row(40, 4), "8000": row(80, 4, decode_wait=-2.5)},
                         "16": {"2000": row(400, 16), "8000": {"skipped": "deadline"}}}}  # fmt: skip
    setup = {"model": "m", "vllm_version": "0.20.0", "mode": "compile", "topology": {"name": "pair"}}
    return {"setup": setup, "runs": {"nemotron-h-8b": {"ttft_parts": tp}}}


def texts(fig: Any) -> list[str]:
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels()]
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts] + ticks


def test_the_stack_is_run_py_s() -> None:
    assert plot.STACK == load_run("bench_gpu_run_plot_parts").PARTS_STACK


def test_levels_lengths_skips_and_clipped_components(tmp_path: Path) -> None:
    table = plot.rows(result()["runs"]["nemotron-h-8b"]["ttft_parts"])
    assert list(table) == [1, 4, 16] and list(table[1]) == [2000, 8000]
    fig, clipped = plot.figure(result(), "r.json")
    assert len(fig.axes) == 4
    assert clipped == ["c=4 8000 tokens decode_wait -2.5 ms"]
    got = texts(fig)
    assert "skipped" in got
    assert any(t.endswith("+30 vs colocated") for t in got)
    assert "2,000\nn=4 x ~16" in got and "8,000\nn=4" in got and "8,000\nn=0" in got  # rounds x window; skipped
    assert any("Drawn as 0 (below zero): c=4 8000 tokens decode_wait -2.5 ms" in t for t in got)
    out = tmp_path / "p.png"
    assert plot.main([str(_write(tmp_path, result())), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_version_1_result_plots_its_rows_as_not_measured() -> None:
    old = json.loads((REPO / "bench/results/2026-12-03-gpu-8b-pair-load-ttft-parts.json").read_text())
    fig, clipped = plot.figure(old, "old.json")
    assert clipped == [] and texts(fig).count("not measured") == 3


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    p = tmp_path / "r.json"
    p.write_text(json.dumps(data))
    return p
