"""One clean-clone `CI=true bash .ci/run` as a result entry: pass/fail, wall and CPU time, and what each pytest-xdist
worker ran when (the critical path), from the run's output and its $HPD_TEST_TIMINGS file (tests/conftest.py).

    python bench/suite_times.py --log /tmp/ci-run-1.log --timings /tmp/ci-timings-1.jsonl \\
        --commit 79ddfbd --started 15:16:01 --append bench/results/2026-12-04-make-test-streak.json

The log is the run's combined stdout and stderr under `/usr/bin/time -v` (its resource lines close the log); the
entry goes to stdout, or is appended to the `runs` of the result file `--append` names.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path
from typing import Any

_SUMMARY = re.compile(r"^=+ (?P<body>.*\d+ (?:passed|failed|error).*) in (?P<secs>[\d.]+)s")
_TIME_V = {
    "Elapsed (wall clock) time (h:mm:ss or m:ss)": "whole_run_wall",
    "User time (seconds)": "cpu_user_s",
    "System time (seconds)": "cpu_system_s",
    "Percent of CPU this job got": "cpu_percent",
    "Maximum resident set size (kbytes)": "max_rss_kb",
    "Exit status": "exit_status",
}
_DURATION = re.compile(r"^\s*([\d.]+)s (call|setup|teardown)\s+(\S+)")


def _clock(text: str) -> float:
    """`/usr/bin/time`'s h:mm:ss or m:ss.ss as seconds."""
    parts = [float(p) for p in text.split(":")]
    secs = 0.0
    for p in parts:
        secs = secs * 60 + p
    return secs


def parse_log(text: str) -> dict[str, Any]:
    """The pytest summary, its failures, the slowest phases and /usr/bin/time -v's figures."""
    out: dict[str, Any] = {"failed_tests": [], "slowest": []}
    in_durations = False
    for line in text.splitlines():
        if m := _SUMMARY.match(line):
            out["result"], out["pytest_s"] = m["body"].strip(), float(m["secs"])
        elif line.startswith(("FAILED ", "ERROR ")) and "::" in line:
            out["failed_tests"].append(line[:600])
        elif "slowest" in line and "durations" in line:
            in_durations = True
        elif in_durations and (m := _DURATION.match(line)):
            out["slowest"].append({"seconds": float(m[1]), "phase": m[2], "test": m[3]})
        elif in_durations and line.strip() and not line.startswith(" "):
            in_durations = False
        stripped = line.strip()
        for label, key in _TIME_V.items():
            if stripped.startswith(label + ":"):
                value = stripped[len(label) + 1 :].strip().rstrip("%")
                if key == "whole_run_wall":
                    out[key] = _clock(value)
                else:
                    out[key] = float(value) if key.startswith("cpu_") and key != "cpu_percent" else int(value)
    if "whole_run_wall" in out:
        out["whole_run_wall_s"] = round(out.pop("whole_run_wall"), 1)
        out["whole_run_wall_min"] = round(out["whole_run_wall_s"] / 60, 1)
    return out


def parse_timings(lines: list[str]) -> dict[str, Any]:
    """Per worker: its control plane's up/down, the seconds its test phases took, when its first phase started and
    its last ended (relative to the first phase of the run), and its longest scopes (module, or all real-node modules)."""
    phases, planes = [], []
    for line in lines:
        if not line.strip():
            continue
        doc = json.loads(line)
        (phases if "test" in doc else planes).append(doc)
    if not phases:
        return {"workers": {}, "control_planes": planes}
    t0 = min(p["start"] for p in phases)
    workers: dict[str, Any] = {}
    scopes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for p in phases:
        w = workers.setdefault(p["worker"], {"busy_s": 0.0, "first_s": None, "last_end_s": 0.0, "phases": 0})
        w["busy_s"] += p["seconds"]
        w["phases"] += 1
        start = p["start"] - t0
        w["first_s"] = start if w["first_s"] is None else min(w["first_s"], start)
        w["last_end_s"] = max(w["last_end_s"], start + p["seconds"])
        path = p["test"].split("::", 1)[0]
        scope = "real-node modules" if path.rsplit("/", 1)[-1].startswith("test_real_node") else path
        scopes[p["worker"]][scope] += p["seconds"]
    for name, w in workers.items():
        w["busy_s"], w["first_s"], w["last_end_s"] = (
            round(w["busy_s"], 1),
            round(w["first_s"], 1),
            round(w["last_end_s"], 1),
        )
        w["longest_scopes_s"] = {s: round(v, 1) for s, v in scopes[name].most_common(5)}
    last = max(workers, key=lambda n: workers[n]["last_end_s"])
    return {"workers": dict(sorted(workers.items())), "last_worker": last, "control_planes": planes}


def entry(log: str, timings: list[str], commit: str, started: str) -> dict[str, Any]:
    parsed = parse_log(log)
    slowest = parsed.pop("slowest")
    out = {"started_utc": started, "commit": commit, **parsed, **parse_timings(timings), "slowest_10": slowest[:10]}
    out["passed"] = parsed.get("exit_status") == 0 and not parsed["failed_tests"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--timings", type=Path, required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--started", required=True, help="UTC time the run started (HH:MM:SS)")
    ap.add_argument("--append", type=Path, help="a result file whose `runs` list gets the entry")
    args = ap.parse_args(argv)
    timings = args.timings.read_text().splitlines() if args.timings.exists() else []
    doc = entry(args.log.read_text(errors="replace"), timings, args.commit, args.started)
    if args.append:
        result = json.loads(args.append.read_text())
        result.setdefault("runs", []).append(doc)
        args.append.write_text(json.dumps(result, indent=1) + "\n")
    else:
        json.dump(doc, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
