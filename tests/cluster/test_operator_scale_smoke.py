"""bench/operator_scale at its smallest size (N = 10, a short idle window): the bench runs end to end on a control
plane of its own and measures what it claims. Correctness only: no time is asserted (CI machines vary)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpd_devcluster import cluster
from hpd_operator.render import render

from .kube import REPO

pytestmark = pytest.mark.cluster

BENCH = REPO / "bench" / "operator_scale" / "run.py"
N = 10


def test_operator_scale_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    cmd = [sys.executable, str(BENCH), "--sizes", str(N), "--idle-seconds", "5", "--settle-seconds", "1",
           "--latency-samples", "1", "--timeout", "300", "--out", str(out), "--log-dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the bench stops its operator and cluster on SIGTERM
        log, _ = proc.communicate(timeout=60)
        pytest.fail(f"the bench did not finish in 540 s:\n{log[-6000:]}")
    assert proc.returncode == 0, f"the bench failed:\n{log[-6000:]}"
    # it stopped the cluster it started
    assert cluster.ClusterState.load(f"scale-{proc.pid}-{N}") is None

    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python ") and "--sizes 10" in doc["command"]
    assert len(doc["git"]["commit"]) == 40
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["kubernetes"]
    r = doc["results"][str(N)]

    per_cr = len(render([yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())]))
    assert r["per_cr"]["children"] == per_cr

    # correctness: every CR Ready, each with exactly the rendered children, nothing unowned, the bare copy complete
    c = r["correctness"]
    assert c["crs"] == N and c["crs_ready_now"] == N
    assert c["crs_with_exactly_the_rendered_children"] == N, c["crs_with_other_children"]
    assert c["children_not_owned_by_a_cr"] == []
    assert c["bare_objects"] == c["bare_objects_expected"] == N * per_cr

    op = r["operator"]
    assert op["crs_ready"] == N and op["children_seen"] == op["children_expected"] == N * per_cr
    assert op["exited_early"] is None and op["log"]["tracebacks"] == 0
    for key in ("seconds_to_all_children_created", "seconds_to_all_ready", "children_per_second", "throughput_ratio",
                "cpu_seconds_converge", "cpu_seconds_idle", "cpu_seconds_total", "peak_rss_mib"):  # fmt: skip
        assert isinstance(op[key], int | float), key
    assert op["peak_rss_mib"] > 0 and op["cpu_seconds_total"] > 0
    assert r["bare"]["objects"] == N * per_cr and r["bare"]["objects_per_second"] > 0

    # API requests: the apiserver's own counter by verb, and the audit log split by user
    req = r["api_requests"]
    for window in ("bare", "converge", "idle"):
        assert set(req[window]) >= {"seconds", "apiserver_request_total_by_verb_all_clients", "audit_by_user_and_verb",
                                    "operator_writes", "operator_reads"}, window  # fmt: skip
    assert req["bare"]["audit_by_user_and_verb"]["hpd-bench-bare"] == {"patch": N * per_cr}
    assert req["bare"]["operator_reads"] == req["bare"]["operator_writes"] == 0  # not started yet
    assert req["converge"]["apiserver_request_total_by_verb_all_clients"].get("APPLY", 0) >= N * per_cr
    by_resource = req["converge"]["operator_by_verb_and_resource"]
    assert by_resource.get("patch deployments", 0) + by_resource.get("create deployments", 0) >= 3 * N, by_resource
    assert isinstance(req["idle"]["operator_reads_per_cr_per_minute"], float)

    lat = r["status_latency"]
    assert len(lat["samples"]) == 1 and lat["timed_out"] == 0, lat
    assert {t["target"] for t in doc["targets"]} >= {
        "operator/bare throughput >= 0.5",
        "0 write requests in the idle window",
    }
