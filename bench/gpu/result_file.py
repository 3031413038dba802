"""A bench/results file from one run.py lane's result.json (gpu-burst.sh brings it back): the setup the results
schema asks for (tests/unit/test_bench_results.py), the burst command, the request counts of the steps that send
requests (fallback, orphans, load, ttft, sweep, cold's checks), and the runs with their command lines.

    python3 bench/gpu/result_file.py OUT_JSON RESULT_JSON [RESULT_JSON ...] --command "..." --model "..." --mode eager --note "..."
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

COUNTED = (
    "the requests of the fallback, orphans, load, ttft, ttft-parts (its recorded rounds; the split path counts both "
    "hops; under load also its failed measured requests and every background request) and sweep steps and cold's "
    "P->D vs colocated check (warmup, pair-check and reference requests and ttft-parts' untimed round excluded); "
    "failed = an HTTP error or no answer (a failed split request counts both hops as sent, one as failed)"
)

PAIR_ROLES = (
    "the rendered pair pod's containers (a Pair CR, spec.kvTransfer.processNamespace Pair): prefill and decode are the "
    "pair Deployment's engine containers of those names, their ports and env as rendered, and the router is its in-pod "
    "router container's argv (static 127.0.0.1 URLs), each run's pair_pod.router_argv; what one host still forces is "
    "host_substitutions"
)


def counts(run: dict[str, Any]) -> tuple[int, int]:
    """(sent, failed) of the requests this run's result records one by one or counts."""
    sent = failed = 0
    fb = run.get("fallback") or {}
    for r in (fb.get("traffic") or {}).get("requests", []):
        sent += 1
        failed += r.get("outcome") == "error"
    o = run.get("orphans") or {}
    sent += o.get("sent", 0)
    failed += len(o.get("errors", []))
    for key, lvl in (run.get("load") or {}).items():
        if key.startswith("c") and isinstance(lvl, dict) and "requests" in lvl:
            sent += lvl["requests"] + lvl["errors"]
            failed += lvl["errors"]
    for row in (run.get("ttft") or {}).values():
        if isinstance(row, dict):
            sent += sum(len(row[p]["all_s"]) for p in ("pd", "colocated") if p in row)
    tp = run.get("ttft_parts") or {}
    loaded = [row for level in (tp.get("under_load") or {}).values() for row in level.values()]
    for row in [*tp.values(), *loaded]:
        if isinstance(row, dict) and "all" in row:
            sent += sum(len(v) * (2 if path == "split" else 1) for path, v in row["all"].items())
    for row in loaded:  # under load: the measured requests that failed, and every background request
        sent += sum(len(v) * (2 if path == "split" else 1) for path, v in (row.get("errors") or {}).items())
        failed += sum(len(v) for v in (row.get("errors") or {}).values())
        for path, bg in (row.get("background") or {}).items():
            sent += bg["requests"] * (2 if path == "split" else 1)
            failed += bg["errors"]
    for row in (run.get("sweep") or {}).get("rows", []):
        for p in ("pd", "colocated"):
            if "first_s" in row.get(p, {}):
                sent += 1 + len(row[p]["steady_s"])
            elif p in row:
                sent += 1
                failed += 1
    pc = run.get("pd_vs_colocated") or {}
    sent += 2 * int(pc.get("prompts") or 0)
    return sent, failed


# a GPU name's lent machine kind: (one GPU, n GPUs)
KINDS = {"H200": ("nvidia-h200", "nvidia-h200-x{n}"), "H100": ("nvidia-h100-x1", "nvidia-h100-x{n}")}


def machine(gpus: Any) -> str:
    """A result setup's machine from nvidia-smi's GPU names (one per line, as bench/gpu/run.py's gpu_name records
    them), e.g. 'nvidia-h100-x1: 1x H100 80GB HBM3'; bench/load/run_load.py's setup uses it too."""
    names = [g.strip() for g in str(gpus or "").splitlines() if g.strip() and not g.startswith("none")]
    if not names:
        return f"no GPU seen ({gpus})"
    short = names[0].removeprefix("NVIDIA ")
    kinds = next((k for m, k in KINDS.items() if short.startswith(m)), None) if len(set(names)) == 1 else None
    kind = "kind not recorded" if kinds is None else kinds[len(names) > 1].format(n=len(names))
    return f"{kind}: {len(names)}x {short}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("results", type=Path, nargs="+", help="result.json of each run.py invocation of the call")
    ap.add_argument("--command", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", required=True, choices=("eager", "compile"))
    ap.add_argument("--note", default="")
    ap.add_argument("--device-call", default="")
    ap.add_argument("--vllm-version", default="0.20.0", help="the vLLM the CRs' image tag picked")
    a = ap.parse_args()
    reps = [json.loads(r.read_text()) for r in a.results]
    rep = reps[0]
    topo = rep.get("topology") or {}
    runs: dict[str, Any] = {}
    for i, r in enumerate(reps):  # several invocations in one call: their runs in order, keys kept apart
        for k, v in r["runs"].items():
            runs[k if k not in runs else f"{k} (invocation {i + 1})"] = {**v, "run_py_command": r.get("command")}
    sent = failed = 0
    for run in runs.values():
        s, f = counts(run)
        sent, failed = sent + s, failed + f
    out = {
        "date": rep.get("date"),
        "command": a.command,
        "run_py_command": [r.get("command") for r in reps],
        "setup": {
            "machine": machine(rep.get("gpu")),
            "model": a.model,
            "vllm_version": a.vllm_version,
            "mode": a.mode,
            "gpus_per_role": {"prefill": [0], "decode": [0]},
            "roles_share_gpu": True,
            "roles_share_pid_namespace": topo.get("roles_share_pid_namespace"),
            "topology": topo,
            **({"roles": PAIR_ROLES} if any("pair_pod" in r for r in runs.values()) else {}),
        },
        "requests": {"sent": sent, "answered": sent - failed, "failed": failed, "counted": COUNTED},
        "note": a.note,
        "device_call": a.device_call,
        "gpu": rep.get("gpu"),
        "host_substitutions": rep.get("host_substitutions"),
        "runs": runs,
    }
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(a.out, "requests", out["requests"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
