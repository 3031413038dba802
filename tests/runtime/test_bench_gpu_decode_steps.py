"""bench/gpu/run.py's decode steps (issue #31): restart-decode, replace-decode and canary, checked on the CPU with
the vLLM stand-in (tests/runtime/fake_vllm.py, started by our own launcher through HPD_VLLM_COMMAND, as the
runtime tests do) and a real vllm-router, so the GPU call runs code whose schedule and bookkeeping already ran.
Real processes and real timers (three decode restarts, each Ready after its pair check): a runtime test, not a
unit test; the pure parts of the same steps are tests/unit/test_bench_gpu_decode_restart.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_bench_gpu_decode_restart import load_run, run_on_stand_in

run = load_run("bench_gpu_run_decode_steps")


# --- the steps against the stand-in ---------------------------------------------------------------------------------
def test_restart_replace_and_canary_steps_on_the_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU call's plan, `tiny-eager:cold+restart-decode+replace-decode+canary`, with vLLM replaced by the
    stand-in: every phase runs, each answer is judged, the decode restarts on its address, the replacement serves
    from 127.0.0.2 through a second router after the old decode departed, and the canary ran only in the on phase."""
    monkeypatch.setattr(run, "LOAD_PHASE_S", 2.0)
    monkeypatch.setattr(run, "BEFORE_S", 0.5)
    monkeypatch.setattr(run, "AFTER_S", 1.0)
    monkeypatch.setattr(run, "CANARY_ON_SECONDS", "0.5")
    steps = ["cold", "restart-decode", "replace-decode", "canary"]
    res = run_on_stand_in(run, steps, tmp_path, monkeypatch, budget_s=240)
    assert "error" not in res, res.get("error")
    d = res["decode_steps"]
    phases = d["traffic"]["by_phase"]
    assert not any("DIFFERENT" in p["outcomes"] for p in phases.values()), phases
    for phase in ("canary-on", "restart-after", "replace-switched", "replace-after", "canary-off"):
        assert phases[phase]["outcomes"].get("identical", 0) >= 1 and "error" not in phases[phase]["outcomes"], phase

    r = d["restart_decode"]
    assert r["exit_code"] == 0 and r["t_sigterm"] < r["t_gone"] <= r["t_ready"]
    assert [c["ok"] for c in r["pair_checks"]] == [True]  # the restarted decode proved its pair before Ready
    statuses = [s for _, s, _ in d["traffic"]["readyz"]["decode"]]
    assert 200 in statuses and statuses.index(200) < len(statuses) - 1 and statuses[-1] == 0  # up, down, ..., gone

    p = d["replace_decode"]
    assert p["new_pod_ip"] == "127.0.0.2" and p["new_side_channel"] == f"127.0.0.2:{run.PORTS['decode-new']['side']}"
    assert p["old_exit_code"] == 0 and p["new_colocated_equals_old"] and [c["ok"] for c in p["pair_checks"]] == [True]
    after = [x for x in d["traffic"]["requests"] if x["phase"] in ("replace-after", "canary-off")]
    assert after and {x["router"] for x in after} == {"router-2"}

    on, off = d["canary_on"], d["canary_off"]
    assert (
        on["canary_seconds"] == "0.5"
        and on["canary_events_in_phase"]
        and all(e["ok"] for e in on["canary_events_in_phase"])
    )
    assert on["canary_checks_after"]['hpd_runtime_canary_checks_total{result="ok"}'] >= 1
    assert off["canary_seconds"] == "0" and off["canary_events_total"] == 0 and off["all"]["latency_s"]["p50"] > 0
    assert on["overlapping_a_canary"]["requests"] + on["not_overlapping"]["requests"] == len(
        [x for x in d["traffic"]["requests"] if x["phase"] == "canary-on" and "s" in x]
    )
    assert d["prefill_log"]["errors"] == 0 and d["summary"]["canary_on"]["canaries_in_phase"] >= 1
    assert set(res["exit_codes_after_sigterm"]) == {"prefill", "decode", "decode-new"}
    assert res["canary_step"] == "decode: HPD_CANARY_SECONDS=0.5 (was '300')"
