"""bench/load (issue #27, and #26's P->D first-token figures): what the GPU burst will run, checked on the CPU. The
end-to-end run against the vLLM stand-in, the real router and vLLM's own `vllm bench serve` is
tests/versions/test_load_smoke_vllm.py (it needs the vLLM parser venv)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LOAD = REPO / "bench" / "load"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_load_{name}", LOAD / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


run_load = load("run_load")
run = run_load.run  # bench/gpu/run.py as run_load imports it


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "hpd_operator", "render", "-f", str(REPO / "bench/gpu/sample-crs.yaml"), "-o", "json"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def test_colocated_replicas_are_the_rendered_prefill_without_the_kv_connector(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Same flags, env, memory and cache key as the P/D prefill (so the replicas reuse its compile caches), minus
    --kv-transfer-config, each on its own ports; equal hardware: two replicas of one role's GPU memory."""
    run.PORTS.update({n: {"vllm": 8400 + 100 * i, "runtime": 8401 + 100 * i, "side": 5800}
                      for i, n in enumerate(run_load.COLOCATED)})  # fmt: skip
    pd = run.role_commands(rendered, "nemotron-h-8b", tmp_path, tmp_path / "cache")
    colo, notes = run_load.colocated_roles(rendered, "nemotron-h-8b", tmp_path, tmp_path / "cache", spread=False)
    assert list(colo) == ["colo-a", "colo-b"] and notes
    p = pd["prefill"]
    for name, r in colo.items():
        k = p.argv.index("--kv-transfer-config")
        want = p.argv[:k] + p.argv[k + 2 :]
        want[want.index("--port") + 1] = str(run.PORTS[name]["vllm"])
        assert r.argv == want and "--kv-transfer-config" not in r.argv
        changed = {n for n in set(r.env) | set(p.env) if r.env.get(n) != p.env.get(n)}
        assert changed == {"HPD_VLLM_PORT", "HPD_RUNTIME_PORT"}
        assert r.env["HPD_ROLE"] == "prefill" and r.env["HPD_WARMUP_PAIR_CHECK"] == "false"
        assert r.env["CUDA_VISIBLE_DEVICES"] == p.env["CUDA_VISIBLE_DEVICES"]
    assert colo["colo-a"].env["HPD_RUNTIME_PORT"] != colo["colo-b"].env["HPD_RUNTIME_PORT"]
    run.GPUS[:] = [0, 1]
    spread, _ = run_load.colocated_roles(rendered, "nemotron-h-8b", tmp_path, tmp_path / "cache", spread=True)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in spread.values()] == ["0", "1"]


@pytest.mark.parametrize("sweep", ["h200", "smoke"])
def test_sweep_points_fit_the_cr_and_repeat_exactly_on_both_sides(rendered: list[dict[str, Any]], sweep: str) -> None:
    """Every point's longest prompt plus its longest output fits --max-model-len; names and seeds are unique (the
    colocated side runs the P/D side's points by name with the same seeds)."""
    decode = run.rendered_container(rendered, "nemotron-h-8b", "decode")["args"]
    max_len = int(decode[decode.index("--max-model-len") + 1])
    points = run_load.SWEEPS[sweep] + run_load.PROBES[sweep]
    assert len({p.name for p in points}) == len({p.seed for p in points}) == len(points)
    for p in points:
        rr = json.loads(p.range_ratio) if p.range_ratio.startswith("{") else float(p.range_ratio)
        r_in, r_out = (rr["input"], rr["output"]) if isinstance(rr, dict) else (rr, rr)
        assert math.ceil(p.input_len * (1 + r_in)) + math.ceil(p.output_len * (1 + r_out)) <= max_len, p.name
        assert p.family in {"warmup", "concurrency", "rate", "length", "probe"}
        assert (p.max_concurrency is None) != (p.request_rate is None) or p.family == "probe", p.name
    if sweep == "h200":
        assert [p.x for p in run_load.PROBES["h200"]] == [1024, 4096, 8192]  # issue #26: about 1k, 4k and 8k
        assert all(p.max_concurrency == 1 and p.num_prompts >= 5 and p.detailed for p in run_load.PROBES["h200"])
        for p in run_load.SWEEPS["h200"]:  # 128-256 output tokens
            r = json.loads(p.range_ratio)["output"] if p.range_ratio.startswith("{") else float(p.range_ratio)
            assert math.floor(p.output_len * (1 - r)) >= 128 and math.ceil(p.output_len * (1 + r)) <= 256, p.name
        assert {p.family for p in run_load.SWEEPS["h200"]} == {"warmup", "concurrency", "rate", "length"}


def test_bench_argv_states_the_slo_percentiles_and_seed() -> None:
    p = run_load.SWEEPS["h200"][1]
    argv = run_load.bench_argv(p, base_url="http://127.0.0.1:8090", model="m", tokenizer=Path("/t"),
                               result_dir=Path("/r"), filename="f.json", label="pd-router")  # fmt: skip

    def val(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert val("--dataset-name") == "random" and val("--seed") == str(p.seed) and val("--tokenizer") == "/t"
    assert val("--max-concurrency") == str(p.max_concurrency) and "--request-rate" not in argv
    assert argv[argv.index("--goodput") + 1 : argv.index("--goodput") + 3] == ["ttft:2000", "tpot:50"]
    assert val("--metric-percentiles") == "50,90,99" and val("--percentile-metrics") == "ttft,tpot,itl,e2el"
    assert "--ignore-eos" in argv and "--save-result" in argv and val("--result-filename") == "f.json"
    rate = run_load.bench_argv(run_load.SWEEPS["h200"][4], base_url="u", model="m", tokenizer=Path("/t"),
                               result_dir=Path("/r"), filename="f", label="l")  # fmt: skip
    assert rate[rate.index("--request-rate") + 1] == "4" and "--max-concurrency" not in rate


def test_the_sweep_time_is_split_evenly_after_the_next_sides_start() -> None:
    f = run_load.sweep_end
    assert f(100.0, 500.0, next_side=False, side_start_s=120.0, probe_s=18.0) == 500.0
    reserve = run_load.COLOCATED_START_FACTOR * 120.0 + 18.0 + run_load.STOP_EST_S
    assert f(100.0, 500.0, next_side=True, side_start_s=120.0, probe_s=18.0) == pytest.approx(100 + (400 - reserve) / 2)
    assert f(100.0, 200.0, next_side=True, side_start_s=300.0, probe_s=18.0) == 100.0  # nothing left: no sweep


def test_the_reaper_kills_exactly_the_process_groups_it_noted(tmp_path: Path) -> None:
    """A run cut short leaves engines in their own sessions holding the GPU: reap() kills the groups the run noted,
    and nothing whose pid was reused by another process (the start time differs)."""
    reaper = run_load.Reaper(tmp_path / "pgids")
    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    try:
        reaper.note(procs[0].pid)
        start = run_load.proc_start(procs[1].pid)
        assert start is not None
        with reaper.path.open("a") as fh:  # the same pid, another process (an earlier start time)
            fh.write(f"{procs[1].pid} {int(start) - 1}\n")
        assert run_load.reap(reaper.path) == [procs[0].pid]
        assert procs[0].wait(10) == -9 and procs[1].poll() is None
        assert run_load.reap(tmp_path / "absent") == []
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_children_finds_the_engine_a_launcher_started(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.Popen(['sleep', '60'], "
                               "start_new_session=True).wait()"], start_new_session=True)  # fmt: skip
    try:
        kids: list[int] = []
        for _ in range(100):
            if kids := run_load.children(parent.pid):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert len(kids) == 1 and run_load.running(kids[0])
        role = run.Role("decode", [], {}, 1, proc=parent)
        assert run_load.Reaper(tmp_path / "pgids").note_role(role) == kids
        assert run_load.reap(tmp_path / "pgids") == [parent.pid, kids[0]]
        assert run_load.wait_gone(kids, 10) == []
    finally:
        parent.kill()
        parent.wait(10)


def test_the_next_side_waits_for_the_gpu_memory_to_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter(["0, 121034 MiB, 143771 MiB", "0, 60211 MiB, 143771 MiB", "0, 2 MiB, 143771 MiB"])
    monkeypatch.setattr(run_load, "gpu_memory", lambda: next(readings))
    monkeypatch.setattr(run_load.time, "sleep", lambda s: None)
    run.GPUS[:] = [0, 1]
    assert run_load.wait_gpu_free(30) == "0, 2 MiB, 143771 MiB"
    monkeypatch.setattr(run_load, "gpu_memory", lambda: "nvidia-smi not available")
    assert run_load.wait_gpu_free(30) == "nvidia-smi not available"  # no GPU (the CPU smoke test): no wait


FAKE_VLLM_BENCH = {
    "vllm/__init__.py": "__version__ = '0.20.0-fake'\n",
    "vllm/platforms/__init__.py": "class _P:\n    def is_unspecified(self):\n        return False\n\ncurrent_platform = _P()\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/utils.py": "def cli_env_setup():\n    pass\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": "import argparse\nFlexibleArgumentParser = argparse.ArgumentParser\n",
    "vllm/benchmarks/__init__.py": "",
    "vllm/benchmarks/serve.py": (
        "import json, time\n"
        "def add_cli_args(p):\n    p.add_argument('--sleep', type=float, default=0)\n"
        "    p.add_argument('--result-filename', required=True)\n"
        "def main(args):\n    time.sleep(args.sleep)\n"
        "    open(args.result_filename, 'w').write(json.dumps({'completed': 1}))\n"
    ),
}


def test_the_load_generator_process_survives_a_bad_and_a_hung_run(tmp_path: Path) -> None:
    """bench_serve.py's protocol around vLLM's parser and main (a stand-in package here): a run that argparse
    refuses is reported and the process goes on; a hung run is cut at its timeout and a fresh process takes the next."""
    for rel, text in FAKE_VLLM_BENCH.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    runner = run_load.BenchRunner(sys.executable, tmp_path / "bench.log", env, run_load.Reaper(tmp_path / "pgids"))
    try:
        assert runner.wait_ready(60)["vllm"] == "0.20.0-fake"
        out = tmp_path / "r.json"
        assert runner.run(["--result-filename", str(out)], 60)["ok"] and json.loads(out.read_text()) == {"completed": 1}
        bad = runner.run(["--no-such-flag"], 60)
        assert not bad["ok"] and "SystemExit" in bad["error"]
        first = runner.proc.pid
        hung = runner.run(["--sleep", "600", "--result-filename", str(out)], 2)
        assert not hung["ok"] and "TimeoutError" in hung["error"] and runner.proc.pid != first
        assert runner.run(["--result-filename", str(tmp_path / "r2.json")], 60)["ok"]
        assert "usage" in (tmp_path / "bench.log").read_text()  # vLLM's own output goes to the log
    finally:
        runner.close()
    assert run_load.reap(tmp_path / "pgids") == []  # both processes are gone


def test_a_points_requests_add_up_or_the_point_is_failed() -> None:
    p = run_load.asdict(run_load.SWEEPS["h200"][2])  # 32 prompts
    row = {"point": p, "target": "router", "status": {"ok": True}, "result": {"completed": 25, "failed": 7}}
    assert run_load.point_requests(row) == {"sent": 32, "answered": 25, "failed": 7}
    assert run_load.summary_row(row)["failed"] == 7 and run_load.summary_row(row)["sent"] == 32
    assert run_load.point_requests({**row, "result": None}) == {"sent": 32, "answered": 0, "failed": 32}
    with pytest.raises(ValueError, match="25 completed \\+ 0 failed of 32 sent"):  # 7 failures gone from the counts
        run_load.point_requests({**row, "result": {"completed": 25, "failed": 0}})
    with pytest.raises(ValueError):
        run_load.point_requests({**row, "result": {"completed": 32}})


def test_the_results_totals_and_setup_say_what_ran(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    rows = [
        {"requests": {"sent": 5, "answered": 3, "failed": 2}},
        {"requests": {"sent": 32, "answered": 32, "failed": 0}},
    ]
    report = {"sides": {"pd": {"probe": rows[:1], "points": rows[1:]}, "colocated": {"points": rows[1:]}}}
    assert run_load.request_totals(report) == {"sent": 69, "answered": 67, "failed": 2}
    roles = run.role_commands(rendered, "nemotron-h-8b", tmp_path, tmp_path / "cache")
    as_run = {n: {"argv": r.argv, "env": r.env} for n, r in roles.items()}
    setup = run_load.setup_record(gpus="NVIDIA H200", model="m", vllm="0.20.0", sides=["pd"], roles=as_run)
    assert setup["machine"] == "nvidia-h200: 1x H200" and setup["mode"] == "compile"
    assert setup["gpus_per_role"] == {"prefill": [0], "decode": [0]} and setup["roles_share_gpu"] is True
    assert setup["roles_share_pid_namespace"] is True
    run_load.spread_roles(roles)
    as_run = {n: {"argv": r.argv, "env": r.env} for n, r in roles.items()}
    two = run_load.setup_record(gpus="NVIDIA H200\nNVIDIA H200", model="m", vllm="0.20.0", sides=["pd"], roles=as_run)
    assert two["machine"] == "nvidia-h200-x2: 2x H200" and two["gpus_per_role"] == {"prefill": [0], "decode": [1]}
    assert two["roles_share_gpu"] is False
    # --topology: the result says how the roles were isolated; two default pods share no PID namespace (no cuda_ipc)
    pods = run_load.setup_record(gpus="NVIDIA H200", model="m", vllm="0.20.0", sides=["pd"], roles=as_run,
                                 topology="pods")  # fmt: skip
    assert (pods["topology"], pods["roles_share_pid_namespace"]) == ("pods", False)
    pair = run_load.setup_record(gpus="NVIDIA H200", model="m", vllm="0.20.0", sides=["pd"], roles=as_run,
                                 topology="pair")  # fmt: skip
    assert (pair["topology"], pair["roles_share_pid_namespace"]) == ("pair", True)
    assert setup["topology"] == "host"


def test_the_topology_flag_takes_the_isolation_benchs_topologies() -> None:
    base = ["--rendered", "r.json", "--cr", "nemotron-h-8b", "--out", "o"]
    assert run_load.parse_args(base).topology == "host"
    assert run_load.parse_args([*base, "--topology", "pods"]).topology == "pods"
    with pytest.raises(SystemExit):
        run_load.parse_args([*base, "--topology", "shared"])


def test_model_geometry_reads_the_hybrid_pattern() -> None:
    assert run_load.model_geometry(REPO / "bench" / "gpu" / "tiny-nemotron-h") == (
        "6 layers, 3 Mamba2 + 1 attention + 2 MLP, hidden 512; dummy weights"
    )
