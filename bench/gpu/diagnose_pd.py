"""Diagnose the P->D output mismatch seen in run.py (decode answers token 0 repeated after a NIXL transfer).

Two P/D pairs on one GPU (0.15 of its memory per instance), both started through `hpd_runtime launch` with the
operator's profile argv, warmup off, one shared cache root (so the second pair reuses the first pair's Triton
kernels and autotune results):

  A: the profile argv plus `--block-size 128` (the profile's default until this diagnosis; vLLM 0.20 raises the
     attention block to 640 tokens on a 64-token kernel block for the tiny Nemotron-H);
  B: the profile argv as it is now, without `--block-size` (vLLM's own choice: 528 tokens on a 16-token kernel
     block).

Per pair, three stages on the same 8 prompts (300-3,000 tokens), each P->D answer compared with a colocated
answer on that pair's decode:

  fresh  P->D first (no request has touched decode's KV memory yet), then the colocated answers;
  dirty  after 16 concurrent 2,000-token colocated requests on both P and D (KV memory reused, as after warmup),
         P->D again;
  repeat P->D once more (is the result stable?).

Writes diagnose.json (and the vLLM block-size log lines) to --out. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run

from hpd_runtime.warmup import PAIR_KV_PARAMS  # the runtime's own P->D request (its pair check sends the same)

PROMPTS = [300, 650, 1000, 1400, 1800, 2200, 2600, 3000]
PAIRS = ("B", "A")  # B first: the candidate fix gets the time if the budget runs short
LOG_MARKERS = ("Setting attention block size", "kernel block", "block_size", "nan", "NaN", "ERROR")


def pd_once(pp: int, dp: int, body: dict[str, Any]) -> tuple[list[int] | None, list[str]]:
    rid = str(uuid.uuid4())
    p_body = dict(body, max_tokens=1, kv_transfer_params=dict(PAIR_KV_PARAMS))
    _, pout = run.post(f"http://127.0.0.1:{pp}/v1/completions", p_body, {"X-Request-Id": rid})
    kv = pout.get("kv_transfer_params") or {}
    _, dout = run.post(
        f"http://127.0.0.1:{dp}/v1/completions", dict(body, kv_transfer_params=kv), {"X-Request-Id": rid}
    )
    return run.token_ids(dout), sorted(kv)


def identical(pd: list[list[int] | None], colocated: list[list[int] | None]) -> list[bool]:
    return [a == b for a, b in zip(pd, colocated, strict=True)]


def dirty(port: int, model: str) -> None:
    rng = random.Random(7)
    bodies = [run.completion(model, run.prompt(rng, 2000), 8) for _ in range(16)]
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda b: run.post(f"http://127.0.0.1:{port}/v1/completions", b), bodies))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=560)
    ns = ap.parse_args()
    t0 = time.monotonic()
    ns.out.mkdir(parents=True, exist_ok=True)
    model = str(run.HERE / "tiny-nemotron-h")
    base_env = dict(run.os.environ)
    base_env["PYTHONPATH"] = run.os.pathsep.join([str(run.REPO / "images" / "runtime"), base_env.get("PYTHONPATH", "")])
    ports = {
        "A": {"prefill": {"vllm": 8200, "runtime": 8201, "side": 5600}, "decode": {"vllm": 8300, "runtime": 8301, "side": 5700}},
        "B": {"prefill": {"vllm": 8400, "runtime": 8401, "side": 5800}, "decode": {"vllm": 8500, "runtime": 8501, "side": 5900}},
    }  # fmt: skip
    roles: dict[str, run.Role] = {}
    for pair in PAIRS:
        rs, _ = run.role_commands("eager", run.HERE / "tiny-nemotron-h", Path("/tmp/diag-cache"), warmup=False)
        for name, r in rs.items():
            p = ports[pair][name]
            args = list(r.args)
            args[args.index("--port") + 1] = str(p["vllm"])
            args[args.index("--gpu-memory-utilization") + 1] = "0.15"
            if pair == "A":  # the profile's former default; the profile now passes no --block-size
                args += ["--block-size", "128"]
            env = dict(r.env)
            env.update({"HPD_VLLM_PORT": str(p["vllm"]), "HPD_RUNTIME_PORT": str(p["runtime"]),
                        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(p["side"]), "HPD_PREFILL_PORT": str(ports[pair]["prefill"]["vllm"])})  # fmt: skip
            roles[f"{pair}-{name}"] = run.Role(f"{pair}-{name}", args, env)
    run.PORTS.update({k: ports[k.split("-")[0]][k.split("-")[1]] for k in roles})
    phase = run.Phase("diag", roles)
    report: dict[str, Any] = {"argv": {k: r.args for k, r in roles.items()}, "results": {}}
    out_file = ns.out / "diagnose.json"

    def save() -> None:
        out_file.write_text(json.dumps(report, indent=1))

    try:
        run.start_roles(phase, ns.out, base_env)
        run.wait_ready(phase, time.perf_counter() + 360)
        report["ready_after_s"] = round(time.monotonic() - t0, 1)
        for pair in PAIRS:
            pp, dp = ports[pair]["prefill"]["vllm"], ports[pair]["decode"]["vllm"]
            bodies = [run.completion(model, run.prompt(random.Random(1000 + i), n), 16) for i, n in enumerate(PROMPTS)]
            res: dict[str, Any] = {"prompt_tokens": PROMPTS}
            report["results"][pair] = res
            res["fresh_pd"] = []
            for b in bodies:
                ids, keys = pd_once(pp, dp, b)
                res["fresh_pd"].append(ids)
                res["kv_params_keys"] = keys
                save()
            res["colocated"] = [run.token_ids(run.post(f"http://127.0.0.1:{dp}/v1/completions", b)[1]) for b in bodies]
            res["fresh_identical"] = identical(res["fresh_pd"], res["colocated"])
            save()
            if time.monotonic() - t0 > ns.budget_s - 60:
                res["skipped"] = "dirty/repeat: time budget"
                continue
            dirty(pp, model)
            dirty(dp, model)
            res["dirty_pd"] = [pd_once(pp, dp, b)[0] for b in bodies]
            res["dirty_identical"] = identical(res["dirty_pd"], res["colocated"])
            res["repeat_pd"] = [pd_once(pp, dp, b)[0] for b in bodies]
            res["repeat_identical"] = identical(res["repeat_pd"], res["colocated"])
            save()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        run.stop_roles(roles)
        markers: dict[str, list[str]] = {}
        for name, role in roles.items():
            if role.log is not None and role.log.exists():
                lines = role.log.read_text(errors="replace").splitlines()
                markers[name] = [ln[-300:] for ln in lines if any(m in ln for m in LOG_MARKERS)][:40]
        report["log_markers"] = markers
        save()
    summary = {p: {k: v for k, v in r.items() if k.endswith("identical") or k == "skipped"}
               for p, r in report["results"].items()}  # fmt: skip
    print(
        json.dumps(
            {"summary": summary, "error": report.get("error"), "ready_after_s": report.get("ready_after_s")}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
