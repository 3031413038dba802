"""Diagnose P->D output mismatches seen in run.py (token 0 repeated on decode after a NIXL transfer).

Two P/D pairs on one GPU (0.15 of its memory each instance), warmup off:
  A: the operator's profile argv exactly (as run.py), requests direct P->D (the toy-proxy protocol) and through
     vllm-router;
  B: the same argv without `--block-size` (vLLM's own choice), requests direct P->D.
Each request is compared with a colocated request on the pair's decode. Writes diagnose.json to --out.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run


def _drop_flag(args: list[str], flag: str) -> list[str]:
    i = args.index(flag)
    return args[:i] + args[i + 2 :]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    base_env = dict(run.os.environ)
    base_env["PYTHONPATH"] = run.os.pathsep.join([str(run.REPO / "images" / "runtime"), base_env.get("PYTHONPATH", "")])
    ports = {
        "A": {"prefill": {"vllm": 8200, "runtime": 8201, "side": 5600}, "decode": {"vllm": 8300, "runtime": 8301, "side": 5700}},
        "B": {"prefill": {"vllm": 8400, "runtime": 8401, "side": 5800}, "decode": {"vllm": 8500, "runtime": 8501, "side": 5900}},
    }  # fmt: skip
    roles: dict[str, run.Role] = {}
    for pair in ("A", "B"):
        rs, _ = run.role_commands("eager", run.HERE / "tiny-nemotron-h", Path(f"/tmp/diag-cache-{pair}"), warmup=False)
        for name, r in rs.items():
            p = ports[pair][name]
            args = list(r.args)
            args[args.index("--port") + 1] = str(p["vllm"])
            args[args.index("--gpu-memory-utilization") + 1] = "0.15"
            if pair == "B":
                args = _drop_flag(args, "--block-size")
            env = dict(r.env)
            env.update({"HPD_VLLM_PORT": str(p["vllm"]), "HPD_RUNTIME_PORT": str(p["runtime"]),
                        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(p["side"])})  # fmt: skip
            roles[f"{pair}-{name}"] = run.Role(f"{pair}-{name}", args, env)
    run.PORTS.update({k: ports[k.split("-")[0]][k.split("-")[1]] for k in roles})
    phase = run.Phase("diag", roles)
    report: dict[str, Any] = {"argv": {k: r.args for k, r in roles.items()}, "results": {}}
    out_file = ns.out / "diagnose.json"
    try:
        run.start_roles(phase, ns.out, base_env)
        run.wait_ready(phase, time.perf_counter() + 400)
        run.PORTS["prefill"], run.PORTS["decode"] = ports["A"]["prefill"], ports["A"]["decode"]
        router = run.Router(ns.out, "diag", base_env)
        try:
            for pair in ("A", "B"):
                pp, dp = ports[pair]["prefill"]["vllm"], ports[pair]["decode"]["vllm"]
                rows = []
                for i, length in enumerate([300, 650, 1000, 1400, 2200, 3000]):
                    ids = run.prompt(random.Random(1000 + i), length)
                    body = run.completion(str(run.HERE / "tiny-nemotron-h"), ids, 16)
                    rid = str(uuid.uuid4())
                    _, pout = run.post(f"http://127.0.0.1:{pp}/v1/completions", dict(body, max_tokens=1, kv_transfer_params={
                        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                        "remote_block_ids": None, "remote_host": None, "remote_port": None}), {"X-Request-Id": rid})  # fmt: skip
                    kv = pout.get("kv_transfer_params")
                    _, dout = run.post(f"http://127.0.0.1:{dp}/v1/completions", dict(body, kv_transfer_params=kv),
                                       {"X-Request-Id": rid})  # fmt: skip
                    _, cout = run.post(
                        f"http://127.0.0.1:{dp}/v1/completions", body, {"X-Request-Id": str(uuid.uuid4())}
                    )
                    row: dict[str, Any] = {"prompt_tokens": length, "kv_params_keys": sorted(kv or {}),
                                           "p_finish": pout["choices"][0].get("finish_reason"),
                                           "direct_pd": run.token_ids(dout), "colocated": run.token_ids(cout)}  # fmt: skip
                    if pair == "A":
                        _, rout = run.post(f"http://127.0.0.1:{run.ROUTER_PORT}/v1/completions", body,
                                           {"X-Request-Id": str(uuid.uuid4())})  # fmt: skip
                        row["router_pd"] = run.token_ids(rout)
                    row["direct_identical"] = row["direct_pd"] == row["colocated"]
                    if "router_pd" in row:
                        row["router_identical"] = row["router_pd"] == row["colocated"]
                    rows.append(row)
                    report["results"][pair] = rows
                    out_file.write_text(json.dumps(report, indent=1))
        finally:
            router.stop()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        run.stop_roles(roles)
        out_file.write_text(json.dumps(report, indent=1))
    summary = {p: [(r["prompt_tokens"], r["direct_identical"], r.get("router_identical")) for r in rows]
               for p, rows in report["results"].items()}  # fmt: skip
    print(json.dumps({"summary": summary, "error": report.get("error")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
