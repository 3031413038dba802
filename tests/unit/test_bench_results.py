"""Every result file in bench/results says what was measured: the setup (machine, model, vLLM version, mode, GPUs
per role, whether the roles shared a GPU and a PID namespace), the command, and how many requests were sent,
answered and failed. A new result that omits one of them, or whose counts do not add up, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
FILES = sorted(RESULTS.glob("*.json"))
SETUP_KEYS = {
    "machine",
    "model",
    "vllm_version",
    "mode",
    "gpus_per_role",
    "roles_share_gpu",
    "roles_share_pid_namespace",
}


def setup_problems(setup: Any) -> list[str]:
    if not isinstance(setup, dict):
        return ["no setup object"]
    out = [f"setup.{k} missing" for k in sorted(SETUP_KEYS - setup.keys())]
    for key in ("machine", "model"):
        if not (isinstance(setup.get(key), str) and setup[key].strip()):
            out.append(f"setup.{key}: a non-empty string ('not recorded' if unknown)")
    v = setup.get("vllm_version")
    if v is not None and not re.fullmatch(r"\d+\.\d+\.\d+", str(v)):
        out.append(f"setup.vllm_version {v!r}: x.y.z or null")
    if setup.get("mode") not in ("eager", "compile", None):
        out.append(f"setup.mode {setup.get('mode')!r}: eager, compile or null")
    gpus = setup.get("gpus_per_role")
    if not isinstance(gpus, dict) or not all(
        isinstance(g, list) and all(isinstance(i, int) for i in g) for g in gpus.values()
    ):
        out.append(f"setup.gpus_per_role {gpus!r}: role -> list of GPU indices ({{}} when no GPU)")
    for key in ("roles_share_gpu", "roles_share_pid_namespace"):
        if setup.get(key) not in (True, False, None):
            out.append(f"setup.{key}: true, false or null")
    if setup.get("vllm_version") is not None and not gpus:
        out.append("setup.gpus_per_role is empty although vLLM ran")
    return out


def count_problems(where: str, req: Any) -> list[str]:
    if not isinstance(req, dict) or not {"sent", "answered", "failed"} <= req.keys():
        return [f"{where}: sent, answered and failed"]
    n = [req["sent"], req["answered"], req["failed"]]
    if all(x is None for x in n):
        return [] if req.get("counted") else [f"{where}: counts null without saying why ('counted')"]
    if not all(isinstance(x, int) and x >= 0 for x in n):
        return [f"{where}: counts must be non-negative integers: {n}"]
    return [] if n[0] == n[1] + n[2] else [f"{where}: sent {n[0]} != answered {n[1]} + failed {n[2]}"]


def problems(d: dict[str, Any]) -> list[str]:
    out = setup_problems(d.get("setup"))
    if not (isinstance(d.get("command"), str) and d["command"].strip()):
        out.append("command: the exact command line, or 'not recorded'")
    if "requests" not in d:
        out.append("requests missing (null only where the bench sends no requests)")
    elif d["requests"] is None:
        if (d.get("setup") or {}).get("vllm_version") is not None:
            out.append("requests is null although vLLM ran")
    else:
        out += count_problems("requests", d["requests"])
    if d.get("requests") and "sides" in d:  # bench/load/run_load.py: per point, and the totals are their sum
        rows = [r for rec in d["sides"].values() for r in rec.get("probe", []) + rec.get("points", [])]
        for r in rows:
            out += count_problems(f"point {r['point']['name']}@{r['target']}", r.get("requests"))
            if r.get("result") and r.get("requests") and r["requests"]["failed"] != r["result"].get("failed"):
                out.append(f"point {r['point']['name']}: requests.failed differs from vLLM's own count")
        for k in ("sent", "answered", "failed"):
            if sum((r.get("requests") or {}).get(k) or 0 for r in rows) != d["requests"][k]:
                out.append(f"requests.{k} is not the sum over the points")
    return out


def test_there_are_results() -> None:
    assert len(FILES) > 10


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_a_result_file_records_its_setup_command_and_requests(path: Path) -> None:
    assert problems(json.loads(path.read_text())) == []


def test_a_result_without_the_fields_or_with_dropped_failures_is_caught() -> None:
    good = json.loads((RESULTS / "2026-12-02-load-8b-len8k-pd.json").read_text())
    assert problems(good) == []
    for key in ("setup", "command", "requests"):
        assert problems({k: v for k, v in good.items() if k != key}), key
    no_ns = {**good, "setup": {k: v for k, v in good["setup"].items() if k != "roles_share_pid_namespace"}}
    assert problems(no_ns) == ["setup.roles_share_pid_namespace missing"]
    dropped = {**good, "requests": {"sent": 32, "answered": 30, "failed": 0}}
    assert "requests: sent 32 != answered 30 + failed 0" in problems(dropped)
    wrong_mode = {**good, "setup": {**good["setup"], "mode": "graphs"}}
    assert problems(wrong_mode) == ["setup.mode 'graphs': eager, compile or null"]
