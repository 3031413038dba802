"""bench/suite_times.py: a CI run's output and its $HPD_TEST_TIMINGS lines become a result entry that says whether the
run passed, how long it and pytest took, and which worker ran what (the critical path)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("suite_times", Path(__file__).parents[2] / "bench" / "suite_times.py")
assert SPEC is not None and SPEC.loader is not None
suite_times = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(suite_times)

LOG = """[test] pytest (3 workers)
============================= slowest 30 durations =============================
156.88s call     tests/cluster/test_real_node_e2e.py::test_rollout
76.63s setup    tests/cluster/test_a.py::test_one
=========================== short test summary info ============================
FAILED tests/chart/test_rbac_proof.py::test_x[cluster] - Forbidden: 403
================== 1 failed, 1116 passed in 874.36s (0:14:34) ==================
\tUser time (seconds): 2121.74
\tSystem time (seconds): 540.31
\tPercent of CPU this job got: 148%
\tElapsed (wall clock) time (h:mm:ss or m:ss): 29:54.69
\tMaximum resident set size (kbytes): 1903648
\tExit status: 2
"""


def _phase(test: str, worker: str, start: float, seconds: float) -> str:
    return json.dumps({"test": test, "phase": "call", "worker": worker, "start": start, "seconds": seconds})


def test_a_failed_run_is_not_passed_and_keeps_its_figures() -> None:
    got = suite_times.entry(LOG, [], "abc1234", "14:34:13")
    assert got["passed"] is False and got["exit_status"] == 2
    assert got["result"] == "1 failed, 1116 passed" and got["pytest_s"] == 874.36
    assert got["whole_run_wall_s"] == 1794.7 and got["whole_run_wall_min"] == 29.9
    assert (got["cpu_user_s"], got["cpu_system_s"], got["cpu_percent"]) == (2121.74, 540.31, 148)
    assert got["failed_tests"] == ["FAILED tests/chart/test_rbac_proof.py::test_x[cluster] - Forbidden: 403"]
    assert [s["seconds"] for s in got["slowest_10"]] == [156.88, 76.63]


def test_a_clean_run_passes_and_its_last_worker_is_the_critical_path() -> None:
    log = LOG.replace("1 failed, 1116 passed", "1117 passed").replace("Exit status: 2", "Exit status: 0")
    log = "\n".join(line for line in log.splitlines() if not line.startswith("FAILED"))
    timings = [
        _phase("tests/cluster/test_real_node.py::a", "gw0", 100.0, 300.0),
        _phase("tests/cluster/test_real_node_e2e.py::b", "gw0", 400.0, 200.0),
        _phase("tests/unit/test_x.py::c", "gw1", 100.5, 50.0),
        json.dumps({"cluster": "pytest-1", "worker": "gw1", "up_s": 9.0, "down_s": 1.0}),
    ]
    got = suite_times.entry(log, timings, "abc1234", "15:16:01")
    assert got["passed"] is True
    assert got["last_worker"] == "gw0"
    assert got["workers"]["gw0"] == {"busy_s": 500.0, "first_s": 0.0, "last_end_s": 500.0, "phases": 2,
                                     "longest_scopes_s": {"real-node modules": 500.0}}  # fmt: skip
    assert got["workers"]["gw1"]["last_end_s"] == 50.5
    assert got["control_planes"] == [{"cluster": "pytest-1", "worker": "gw1", "up_s": 9.0, "down_s": 1.0}]
