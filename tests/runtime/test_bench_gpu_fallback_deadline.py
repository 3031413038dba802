"""bench/gpu/run.py's fallback step keeps what it measured when the decode does not come back in time (the 2026-12-03
0.25.1 run lost its whole traffic record that way): against the vLLM stand-in and a real vllm-router, with the
decode's return replaced by the TimeoutError the bench's Ready wait raises at its deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_bench_gpu_decode_restart import load_run, run_on_stand_in

run = load_run("bench_gpu_run_fallback_deadline")


def test_a_decode_back_after_the_deadline_keeps_the_phases_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "BEFORE_S", 0.5)
    real_bounce = run.bounce_decode

    def late(b: Any, traffic: Any, d: Any, res: dict[str, Any]) -> float:
        real_stop = run.stop_role
        monkeypatch.setattr(run, "start_role", lambda *a, **k: None)  # the decode is not back before the deadline
        monkeypatch.setattr(run, "wait_ready", lambda *a, **k: (_ for _ in ()).throw(TimeoutError("not ready in time")))
        try:
            return float(real_bounce(b, traffic, d, res))
        finally:
            monkeypatch.setattr(run, "stop_role", real_stop)

    monkeypatch.setattr(run, "bounce_decode", late)
    res = run_on_stand_in(run, ["cold", "fallback"], tmp_path, monkeypatch, budget_s=180)
    fb = res["fallback"]
    assert fb["error"].startswith("TimeoutError") and res["error"] == f"RuntimeError: fallback: {fb['error']}"
    by = fb["traffic"]["by_phase"]
    assert by["before"]["outcomes"].get("identical", 0) >= 1  # measured before SIGTERM, kept
    assert res["fallback_summary"]["t_sigterm"] is not None and res["fallback_summary"]["t_decode_ready"] is None
    assert any(s["to"] == "prefill" for s in fb["switches"])  # the switch to prefill happened and is on record
