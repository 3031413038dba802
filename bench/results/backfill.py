"""Backfill `setup`, `command` and `requests` into the result files written before those fields existed.

    python3 bench/results/backfill.py            # rewrites bench/results/*.json that lack the fields

Every value comes from the file itself (its argv, env, lane, device and gpu lines, its notes) or from what
bench/gpu/README.md says of the call that produced it; what neither says is written "not recorded". A file that
already has all three fields is left as it is. Run once (2026-12-03); kept so a reader can see how each field was
derived. The fields: tests/unit/test_bench_results.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

MODELS = {
    "tiny-nemotron-h": "tiny-nemotron-h (6 layers: 3 Mamba2, 1 attention, 2 MLP; hidden 512; dummy weights)",
    "tiny-nemotron-h-rep": (
        "tiny-nemotron-h-rep (6 layers: 3 Mamba2, 1 attention, 2 MLP; hidden 512; 1 KV head, 1 Mamba group; "
        "dummy weights)"
    ),
    "tiny-nemotron-h-fixed": (
        "tiny-nemotron-h-fixed (the tiny geometry: 6 layers, hidden 512; fixed seeded weights from "
        "bench/gpu/make_checkpoint.py, the same at every TP)"
    ),
    "tiny-nemotron-h-rep-fixed": (
        "tiny-nemotron-h-rep-fixed (the tiny geometry with 1 KV head and 1 Mamba group; fixed seeded weights from "
        "bench/gpu/make_checkpoint.py)"
    ),
    "nemotron-h-8b": (
        "nemotron-h-8b (NVIDIA Nemotron-H-8B-Base-8K geometry: 52 layers, 24 Mamba2 + 4 attention + 24 MLP, "
        "hidden 4096; dummy weights)"
    ),
}
NO_GPU = {"gpus_per_role": {}, "roles_share_gpu": None, "roles_share_pid_namespace": None}
CONTROL_PLANE = "polyglot: 2 CPU cores, no GPU (shared with other engineers' test runs)"
RUN_PY_PID_NS = True
"""bench/gpu/run.py and bench/load/run_load.py started every role as a process of one host: one PID namespace
(pods are separate ones; docs/kv-path.md measures what that changes)."""


def machine(d: dict[str, Any]) -> str:
    """The machine kind and its GPUs, from the file's `device` line, else from its nvidia-smi name lines."""
    if isinstance(d.get("device"), str):  # e.g. "nvidia-h200-x2 (2 x H200), device session of ..."
        kind, _, rest = d["device"].partition(" ")
        what, _, more = rest.removeprefix("(").partition(")")
        return f"{kind}: {what}{more}" if rest else kind
    if isinstance(d.get("device_call"), dict):
        return str(d["device_call"].get("kind", "not recorded")).replace(" (", ": ", 1).rstrip(")")
    gpus = [g for g in str(d.get("gpu") or "").splitlines() if g.strip()]
    if len(gpus) == 1:
        return "nvidia-h200: 1x H200"
    if len(gpus) == 2:
        return "nvidia-h200-x2: 2x H200 (one host)"
    return "not recorded"


def model_of(argvs: list[list[str]]) -> str:
    for argv in argvs:
        if "--model" in argv:
            name = Path(argv[argv.index("--model") + 1]).name
            return MODELS.get(name, name)
    return "not recorded"


def mode_of(argvs: list[list[str]]) -> str | None:
    modes = {"eager" if "--enforce-eager" in a else "compile" for a in argvs if "--model" in a}
    return modes.pop() if len(modes) == 1 else None


def gpus_of(envs: dict[str, dict[str, str]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for role, env in envs.items():
        cvd = (env or {}).get("CUDA_VISIBLE_DEVICES")
        if cvd is not None and role in ("prefill", "decode"):
            out[role] = [int(x) for x in cvd.split(",") if x.strip()]
    return out


def shares(g: dict[str, list[int]]) -> bool | None:
    if "prefill" not in g or "decode" not in g:
        return None
    return bool(set(g["prefill"]) & set(g["decode"]))


def vllm_of(d: dict[str, Any], names: list[str]) -> str:
    sites = sorted(((d.get("lane") or {}).get("vllm_sites") or {}).keys())
    if any("v025" in n for n in names):
        return "0.25.1"
    if len(sites) == 1:
        return sites[0]
    return "0.20.0"  # the only version staged before 0.25.1 was (bench/gpu/README.md)


def run_py_setup(d: dict[str, Any]) -> dict[str, Any]:
    """bench/gpu/run.py files: per run when the runs differ, with the file's setup from its first run."""
    runs = d.get("runs")
    if not isinstance(runs, dict):  # the first run.py's shape: one run, argv/env at the top
        runs = {"run": {"argv": d.get("argv", {}), "env": d.get("env", {})}}
    per_run = {}
    for name, r in runs.items():
        argvs = list((r.get("argv") or {}).values())
        g = gpus_of(r.get("env") or {})
        per_run[name] = {
            "model": model_of(argvs),
            "vllm_version": vllm_of(d, [name]),
            "mode": mode_of(argvs),
            "gpus_per_role": g,
            "roles_share_gpu": shares(g),
            "roles_share_pid_namespace": RUN_PY_PID_NS,
        }
    first = next(iter(per_run.values()))
    setup = {"machine": machine(d), **first}
    if not setup["gpus_per_role"] and setup["machine"] == "nvidia-h200: 1x H200":  # env without CUDA_VISIBLE_DEVICES
        setup["gpus_per_role"], setup["roles_share_gpu"] = {"prefill": [0], "decode": [0]}, True
    for key in ("model", "vllm_version", "mode", "gpus_per_role", "roles_share_gpu"):
        if len({json.dumps(v[key]) for v in per_run.values()}) > 1:
            setup[key] = None if key in ("mode", "roles_share_gpu") else first[key]
            setup["by_run"] = {
                n: {k: v[k] for k in ("mode", "gpus_per_role", "roles_share_gpu")} for n, v in per_run.items()
            }
    return setup


# --- requests -------------------------------------------------------------------------------------------------------
def run_py_requests(d: dict[str, Any]) -> dict[str, Any]:
    """The requests bench/gpu/run.py sent and recorded an outcome for: P->D and colocated answers compared
    (pd_vs_colocated, 2 per prompt), first-request and per-length timings, the prefill-restart and decode-step
    traffic. Warmup and pair-check requests are the runtime's own and not counted."""
    sent = answered = failed = 0

    def add(ok: int, bad: int = 0) -> None:
        nonlocal sent, answered, failed
        sent, answered, failed = sent + ok + bad, answered + ok, failed + bad

    runs = d.get("runs") if isinstance(d.get("runs"), dict) else d.get("phases") or {}
    for r in runs.values():
        for key in ("pd_via_router", "colocated_on_decode"):  # the first run.py: per phase, at the top
            if isinstance(r.get(key), dict):
                add(len(r[key].get("all_s") or []))
        pvc = r.get("pd_vs_colocated") or {}
        if isinstance(pvc, dict) and "prompts" in pvc:
            add(2 * int(pvc["prompts"]))
        for key in ("first_request", "first_request_fresh_router"):
            for rec in (r.get(key) or {}).values():
                if isinstance(rec, dict):
                    add(len(rec.get("all_s") or []))
        for rec in (r.get("shapes") or {}).values():
            for row in (rec or {}).get("rows", []) if isinstance(rec, dict) else []:
                add(len(row.get("all_s") or []))
        counts = (((r.get("restart") or {}).get("timeline") or {}).get("counts")) or {}
        add(sum(v for k, v in counts.items() if k != "error"), counts.get("error", 0))
        traffic = ((r.get("decode_steps") or {}).get("traffic") or {}).get("by_phase") or {}
        for ph in traffic.values():
            bad = ph["outcomes"].get("error", 0)
            add(ph["requests"] - bad, bad)
    return {"sent": sent, "answered": answered, "failed": failed,
            "counted": "P->D and colocated requests whose outcome the file records (warmup and pair-check requests "
                       "excluded)"}  # fmt: skip


def load_requests(d: dict[str, Any]) -> dict[str, Any]:
    """bench/load/run_load.py files: vLLM's own completed/failed per point (warm-up requests excluded)."""
    sent = answered = failed = 0
    for rec in d["sides"].values():
        for row in rec.get("probe", []) + rec.get("points", []):
            res = row.get("result") or {}
            n = int(row["point"]["num_prompts"])
            ok, bad = int(res.get("completed", 0)), int(res.get("failed", n))
            row["requests"] = {"sent": n, "answered": ok, "failed": bad}
            sent, answered, failed = sent + n, answered + ok, failed + bad
    return {"sent": sent, "answered": answered, "failed": failed}


INVALID_8K = (
    "invalid: the bench's word tokenizer wrote ~8 characters per token, and vLLM 0.20 refused the longer 8k text "
    "prompts before tokenizing them (HTTP 400); fixed 2026-12-02 (bench/gpu/word_tokenizer.py) and re-measured in "
    "2026-12-02-load-8b-len8k-{pd,colocated}.json"
)


def load_setup(d: dict[str, Any]) -> dict[str, Any]:
    gpus: dict[str, list[int]] = {}
    for rec in d["sides"].values():
        for role, r in rec["roles"].items():
            cvd = r["env"].get("CUDA_VISIBLE_DEVICES", "")
            gpus[role] = [int(x) for x in cvd.split(",") if x.strip()]
    argvs = [r["argv"] for rec in d["sides"].values() for r in rec["roles"].values()]
    sides = set(d["sides"])
    share = len({tuple(v) for v in gpus.values()}) == 1
    return {
        "machine": "nvidia-h200: 1x H200",
        "model": MODELS["nemotron-h-8b"] if d["cr"] == "nemotron-h-8b" else d["cr"],
        "vllm_version": "0.20.0",
        "mode": mode_of(argvs),
        "gpus_per_role": gpus,
        "roles_share_gpu": share,
        "roles_share_pid_namespace": RUN_PY_PID_NS,
        "sides": sorted(sides),
    }


# --- corrections of what a file's own raw data contradicts ------------------------------------------------------------
def correct(name: str, d: dict[str, Any]) -> None:
    runs = d.get("runs") if isinstance(d.get("runs"), dict) else {}
    for r in runs.values():
        steps = r.get("decode_steps") or {}
        by_phase = (steps.get("traffic") or {}).get("by_phase") or {}
        # run.py's canary summary counted answered requests only: take each phase's outcomes from its traffic
        for key, phase in (("canary_on", "canary-on"), ("canary_off", "canary-off")):
            if phase in by_phase and key in steps:
                outcomes = by_phase[phase]["outcomes"]
                steps[key]["all"]["requests"] = by_phase[phase]["requests"]
                steps[key]["all"]["outcomes"] = outcomes
                steps[key]["all"]["latency_of"] = "answered requests only (failed ones are counted in outcomes)"
                steps["summary"][key]["outcomes"] = outcomes
        if name == "2026-12-02-gpu-canary-v020-cold-concurrent-pair-check.json":
            r["autotune_events_after_ready_scope"] = (
                "cold step only, counted before the canary phase; in the canary phase prefill autotuned "
                "_state_passing_fwd_kernel (2.05 s) and _chunk_scan_fwd_kernel (27.9 s) after Ready (from the "
                "note; those log lines are in the device call's logs, not committed)"
            )
    lane = (d.get("lane") or {}).get("gpus")
    used = sorted({g for v in d["setup"]["gpus_per_role"].values() for g in v})
    if lane and used and sorted(lane) != used:
        d["setup"]["note"] = (
            f"lane.gpus {lane} is the lane's list; the roles ran on GPU(s) {used} (CUDA_VISIBLE_DEVICES)"
        )


# --- per family -----------------------------------------------------------------------------------------------------
def backfill(name: str, d: dict[str, Any]) -> dict[str, Any]:
    if "sides" in d:  # run_load.py
        d.setdefault("setup", load_setup(d))
        d["requests"] = load_requests(d)
        if d["date"] == "2026-12-01":  # before the word tokenizer's fix (bench/gpu/word_tokenizer.py)
            for rec in d["sides"].values():
                for row in rec.get("probe", []) + rec.get("points", []):
                    if row["point"]["input_len"] >= 8192:
                        row["invalid"] = INVALID_8K
        if set(d["sides"]) == {"colocated"}:
            d["hardware"] = "one H200, both colocated replicas share it"
        return d
    if name.startswith(("2026-11-29-gpu-diagnose-pd",)):
        argvs = list(d["argv"].values())
        d["setup"] = {
            "machine": "not recorded (an H200 machine of 2026-11-29; bench/gpu/README.md: both pairs on one GPU)",
            "model": model_of(argvs), "vllm_version": "0.20.0", "mode": mode_of(argvs),
            "gpus_per_role": {"prefill": [0], "decode": [0]}, "roles_share_gpu": True,
            "roles_share_pid_namespace": True,
        }  # fmt: skip
        d.setdefault("command", "not recorded (bench/gpu/diagnose_pd.py, since removed; arguments not kept)")
        results = d["results"]
        n = sum(len(v) if isinstance(v, list) else len(v.get("prompt_tokens", [])) for v in results.values())
        d["requests"] = {"sent": None, "answered": None, "failed": None,
                         "counted": f"not recorded: {n} prompts compared; per-request outcomes are the token ids"}  # fmt: skip
        return d
    if name == "2026-11-30-gpu-blas-first-call.json":
        d["setup"] = {"machine": machine(d), "model": "none (torch GEMMs of the tiny model's linear shapes)",
                      "vllm_version": None, "mode": None, "gpus_per_role": {}, "roles_share_gpu": None,
                      "roles_share_pid_namespace": None}  # fmt: skip
        d.setdefault("command", "; ".join(r["command"] for r in d["runs"].values()))
        d["requests"] = None
        return d
    if name.startswith("2026-12-01-kv-path"):
        d["setup"] = {"machine": machine(d), "model": "none (NIXL transfers of KV-shaped GPU buffers, no vLLM)",
                      "vllm_version": None, "mode": None, "gpus_per_role": {"prefill": [0], "decode": [0]},
                      "roles_share_gpu": True, "roles_share_pid_namespace": True}  # fmt: skip
        d["requests"] = None
        return d
    if "-gpu-" in name:
        d["setup"] = run_py_setup(d)
        correct(name, d)
        d["requests"] = run_py_requests(d)
        return d
    # control-plane benches: no GPU, no inference requests
    m = d.get("machine")
    desc = CONTROL_PLANE if not isinstance(m, dict) else f"polyglot: {m.get('cpus', '?')} CPU cores, no GPU"
    d["setup"] = {"machine": desc, "model": "none (no vLLM: kube-apiserver, kwok nodes, the operator)",
                  "vllm_version": None, "mode": None, **NO_GPU}  # fmt: skip
    d["requests"] = None
    return d


def main() -> int:
    for path in sorted(HERE.glob("*.json")):
        text = path.read_text()
        d = json.loads(text)
        if all(k in d for k in ("setup", "command", "requests")):
            continue
        indent = 1 if text.startswith('{\n "') else 2  # keep each file's own layout: a reviewable diff
        path.write_text(json.dumps(backfill(path.name, d), indent=indent) + ("\n" if text.endswith("\n") else ""))
        print(path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
