"""bench/load end to end on the CPU, its smallest size (`--sweep smoke`): the real-size CR's rendered argv started the
way bench/gpu/run.py starts vLLM (our runtime's launch, warmup, pair check, readiness) with the vLLM stand-in
(tests/runtime/fake_vllm.py) in vLLM's place, the real vllm-router 0.1.17 (dev dependency) in P/D and in regular
mode, and vLLM 0.20's own load generator (`vllm bench serve`, from the `vllm_parser` tier's venv) driving both sides.
Then bench/load/plot.py on the result. Loopback only, ports from the OS; no wall-clock assertions.

What the GPU burst adds: real engines (bench/load/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "runtime" / "fake_vllm.py"
pytestmark = pytest.mark.vllm_parser
VARIANT = "env-UCX_CUDA_IPC_ENABLE_GET_ZCOPY"
"""The A/B "before" variant: the operator renders the KV path fix; the bench can take it away, recorded."""


def parser_python() -> Path:
    from test_vllm_parser_truth import parser_python as venv  # tests/versions is on sys.path (rootdir-relative)

    return venv("0.20.0")  # fails, naming the venv and hack/vllm-parser-env.sh, when it is missing


def test_load_benchmark_smoke_through_the_router_with_vllm_bench_serve(tmp_path: Path) -> None:
    py = parser_python()
    rendered = tmp_path / "rendered.json"
    with rendered.open("w") as fh:
        subprocess.run([sys.executable, "-m", "hpd_operator", "render", "-f", "bench/gpu/sample-crs.yaml", "-o",
                        "json"], stdout=fh, check=True, cwd=REPO)  # fmt: skip
    env = {
        **os.environ,
        # the rendered command is `python3 -m hpd_runtime launch`: this interpreter (hpd_runtime, prometheus_client)
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HPD_VLLM_COMMAND": f"{sys.executable} {FAKE} --token-delay 0.002",
    }
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "bench/load/run_load.py", "--rendered", str(rendered), "--cr", f"nemotron-h-8b@{VARIANT}",
         "--sweep", "smoke", "--out", str(out), "--work", str(work), "--free-ports", "--deadline-s", "900",
         "--bench-python", str(py)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in out.glob("*.log")} if out.exists() else {}
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:], logs)
    res = json.loads((out / "result.json").read_text())
    assert list(res["sides"]) == ["pd", "colocated"] and res["variant"] == VARIANT and not res["skipped_sides"]
    assert res["reaped_at_end"] == []  # every engine, router and load generator had stopped by itself
    assert res["hardware"] == "one H200, P and D share it" and res["command"].startswith(
        "python3 bench/load/run_load.py"
    )
    plan = res["plan"]
    rows = [r for rec in res["sides"].values() for r in rec["probe"] + rec["points"]]
    sent = sum(r["point"]["num_prompts"] for r in rows)
    assert res["requests"] == {"sent": sent, "answered": sent, "failed": 0}
    assert res["setup"]["roles_share_pid_namespace"] is True and res["setup"]["vllm_version"] == "0.20.0"
    for side, rec in res["sides"].items():
        assert "error" not in rec and not rec.get("skipped"), (side, rec.get("error"), rec.get("skipped"), logs)
        assert rec["load_generator"]["vllm"] == "0.20.0"
        assert set(rec["experiment"].values()) == {"removed UCX_CUDA_IPC_ENABLE_GET_ZCOPY"}
        assert len(rec["experiment"]) == 2
        assert all("UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in r["env"] for r in rec["roles"].values())
        assert set(rec["stop"]["exit_codes_after_sigterm"].values()) == {0} and "engines_killed" not in rec["stop"]
        # every point of the plan ran, in order, each with vLLM's own figures and the command that made them
        assert [r["point"] for r in rec["points"]] == plan["points"]
        for row in rec["probe"] + rec["points"]:
            p, r = row["point"], row["result"]
            assert row["status"]["ok"], row["status"]
            assert row["command"].startswith("vllm bench serve ") and f"--seed {p['seed']}" in row["command"]
            assert r["completed"] == p["num_prompts"] and r["failed"] == 0, (p["name"], r.get("errors"))
            assert all(isinstance(r[f"p{q}_{m}_ms"], float) for q in (50, 90, 99) for m in ("ttft", "itl", "tpot"))
            assert r["request_goodput"] is not None and r["total_output_tokens"] > 0
            assert r["total_input_tokens"] >= p["num_prompts"] * int(p["input_len"] * 0.5)
    pd, colo = res["sides"]["pd"], res["sides"]["colocated"]
    assert "--kv-transfer-config" in pd["roles"]["decode"]["argv"]
    assert all("--kv-transfer-config" not in r["argv"] for r in colo["roles"].values())
    assert pd["deployment"]["pair_check_at_ready"][0]["ok"] is True
    # the probe: P->D through the router and colocated on decode; decode's NIXL figures prove the router's requests
    # went P->D (the stand-in records a transfer per request that carries prefill's kv_transfer_params)
    targets = [(r["point"]["name"], r["target"]) for r in pd["probe"]]
    assert targets == [(p["name"], t) for p in plan["probe"] for t in ("router", "decode")]
    for row in pd["probe"]:
        assert len(row["result"]["ttfts"]) == row["point"]["num_prompts"]  # --save-detailed: every sample
        if row["target"] == "router":
            assert row["nixl"]["transfers"] == row["point"]["num_prompts"] + row["point"]["warmups"], row["nixl"]
    assert [(r["point"]["name"], r["target"]) for r in colo["probe"]] == [(p["name"], "router") for p in plan["probe"]]
    # the plots of this result
    png = tmp_path / "png"
    subprocess.run([sys.executable, "bench/load/plot.py", str(out / "result.json"), "--out-dir", str(png)],
                   cwd=REPO, check=True, capture_output=True, text=True)  # fmt: skip
    assert sorted(p.name for p in png.iterdir()) == [
        f"load-{f}.png" for f in ("concurrency", "length", "probe", "rate")
    ]
