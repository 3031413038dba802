"""bench/gpu/run.py's decode steps (issue #31), their pure parts: the replacement decode's command, the answer
judge and the summaries. The steps themselves, run on the vLLM stand-in with real processes (our launcher, a real
vllm-router) and real timers, are tests/runtime/test_bench_gpu_decode_steps.py: not a unit test (about 35 s)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hpd_operator.profile_launch import drain_grace_seconds
from hpd_runtime import contract

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "gpu"
FAKE_VLLM = REPO / "tests" / "runtime" / "fake_vllm.py"


def load_run(name: str) -> ModuleType:
    """A private copy of run.py (its PORTS are shifted per test without touching other tests' copy)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


run = load_run("bench_gpu_run_decode")


def render_sample() -> list[dict[str, Any]]:
    """bench/gpu/sample-crs.yaml as the operator renders it (what the bench runs)."""
    out = subprocess.run(
        [sys.executable, "-m", "hpd_operator", "render", "-f", str(BENCH / "sample-crs.yaml"), "-o", "json"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def run_on_stand_in(
    run: ModuleType, steps: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget_s: float
) -> dict[str, Any]:
    """`run.run_step` for the tiny-eager CR with vLLM replaced by the stand-in (our launcher starts it through
    HPD_VLLM_COMMAND; `python3` on PATH is ours) on free ports, within `budget_s`: the one run's result."""
    run.use_free_ports()
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    fake = f"{sys.executable} {FAKE_VLLM}"
    args = argparse.Namespace(
        out=tmp_path / "out", work=tmp_path / "work", model_dir=None, t_end=time.perf_counter() + budget_s
    )
    args.out.mkdir()
    report: dict[str, Any] = {"runs": {}}
    run.run_step(f"tiny-eager@env+HPD_VLLM_COMMAND={fake}", steps, render_sample(), args, report)
    (res,) = report["runs"].values()
    result: dict[str, Any] = res
    return result


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render_sample()


def completion(ids: list[int], lps: list[float]) -> dict[str, Any]:
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": lps}}], "usage": {"prompt_tokens": 10}}


# --- pure parts -----------------------------------------------------------------------------------------------------
def test_the_replacement_decode_is_the_rendered_decode_with_a_new_pod_address_and_ports(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    roles = run.role_commands(rendered, "tiny-eager", tmp_path / "model", tmp_path / "cache")
    b = run.Bench(
        rendered, "tiny-eager", "", tmp_path / "model", tmp_path / "cache", tmp_path, tmp_path, "m", {}, roles
    )
    new = b.new_decode("0")
    old = roles["decode"]
    assert new.name == "decode-new" and new.host == run.NEW_POD_IP == "127.0.0.2"
    diff = [(a, b_) for a, b_ in zip(old.argv, new.argv, strict=True) if a != b_]
    assert diff == [(str(run.PORTS["decode"]["vllm"]), str(run.PORTS["decode-new"]["vllm"]))]  # --port only
    changed = {k for k in {*old.env, *new.env} if old.env.get(k) != new.env.get(k)}
    assert changed == {
        "HPD_POD_IP", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "HPD_VLLM_PORT",
        "HPD_RUNTIME_PORT", "HPD_RUNTIME_HOST", "HPD_CANARY_SECONDS", "PYTHONPATH",
    }  # fmt: skip
    assert new.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == new.env["HPD_POD_IP"] == "127.0.0.2"  # $(HPD_POD_IP) expanded
    assert new.env["HPD_CANARY_SECONDS"] == "0" and old.env["HPD_CANARY_SECONDS"] == "300"  # as rendered
    assert new.env["HPD_PREFILL_SERVICE"] == old.env["HPD_PREFILL_SERVICE"]  # the same prefill
    assert "gemm-warmup-plugin" in new.env["PYTHONPATH"]  # the plugin, as the image and the first decode have it
    # the rendered decode pod's terminationGracePeriodSeconds: sized for the default drain (docs/autoscaling.md)
    assert b.grace() == drain_grace_seconds(contract.DRAIN_TIMEOUT_SECONDS_DEFAULT)


def test_an_answer_is_identical_close_or_different_by_the_runtimes_output_check() -> None:
    ref = completion([5, 6, 7, 8], [-1.0, -1.1, -1.2, -1.3])
    assert run.judge(completion([5, 6, 7, 8], [-1.0, -1.1, -1.2, -1.3]), ref, 10)["outcome"] == "identical"
    # ids diverge at a near-tie (TP or batch rounding): the gap at the first divergent token is within the bound
    close = run.judge(completion([5, 6, 9, 9], [-1.0, -1.1, -1.2005, -1.3]), ref, 10)
    assert close["outcome"] == "close" and close["gap"] < 0.01
    assert run.judge(completion([0, 0, 0, 0], [-4.0, -4.1, -4.2, -4.3]), ref, 10)["outcome"] == "DIFFERENT"
    assert run.judge(completion([5, 6, 7, 8], [float("nan")] * 4), ref, 10)["outcome"] == "DIFFERENT"


def test_summaries_count_outcomes_and_take_nearest_rank_percentiles() -> None:
    reqs = [{"outcome": "identical", "s": i / 100} for i in range(1, 101)] + [{"outcome": "error"}]
    s = run.summarize(reqs)
    assert s["requests"] == 101 and s["outcomes"] == {"identical": 100, "error": 1}
    assert s["latency_s"]["p50"] == 0.5 and s["latency_s"]["p99"] == 0.99 and s["latency_s"]["max"] == 1.0
    assert run.metric_sums('hpd_runtime_canary_checks_total{result="ok"} 3.0\nother 1\n', ("hpd_runtime_canary",)) == {
        'hpd_runtime_canary_checks_total{result="ok"}': 3.0
    }
