"""bench/gpu/isolation.py: each role started in the namespaces a kubelet gives a pod (issue #43). The argv builders on
any machine; the namespaces themselves where this process may create them (root with unshare; skipped otherwise)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_isolation", BENCH / "isolation.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


iso = load()


def test_the_topologies_say_which_namespaces_the_roles_share() -> None:
    t = iso.TOPOLOGIES
    assert (t["host"].roles_share_pid_namespace, t["pods"].roles_share_pid_namespace) == (True, False)
    assert t["pair"].roles_share_pid_namespace and t["pair"].own_mount_namespace
    assert t["pods"].uids is not None and t["pair"].uids is not None
    assert t["pair"].uids[0][0] != t["pair"].uids[1][0]  # a pair pod's containers may run as different users


def test_host_wraps_nothing_pods_unshare_each_role_and_pair_enter_one_namespace() -> None:
    assert iso.role_prefix("host", "p") == []
    pods = iso.role_prefix("pods", "d")
    assert pods[:7] == ["unshare", "--pid", "--ipc", "--mount", "--fork", "--mount-proc", "--kill-child"]
    assert "mount -t tmpfs" in " ".join(pods)  # the pod's own /dev/shm
    assert pods[-5:] == ["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups", "--"]
    pair = iso.role_prefix("pair", "p", holder_pid=4242)
    assert pair[:5] == ["nsenter", "--target=4242", "--pid", "--ipc", "--"]
    assert pair[5:8] == ["unshare", "--mount", "--mount-proc"] and "--pid" not in pair[5:]
    assert "--reuid=1000" in pair
    with pytest.raises(ValueError, match="holder"):
        iso.role_prefix("pair", "d")
    assert "setpriv" not in iso.role_prefix("pods", "d", as_root=True)


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not all(shutil.which(x) for x in ("unshare", "nsenter", "setpriv")):
        return False
    probe = ["unshare", "--pid", "--ipc", "--mount", "--fork", "--mount-proc", "true"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


PROBE = (
    "import json, os, sys; print(json.dumps({'pid': os.getpid(), 'uid': os.getuid(), "
    "'ns': {n: os.readlink('/proc/self/ns/' + n) for n in ('pid', 'ipc', 'mnt')}}), flush=True); sys.stdin.read()"
)


def _run_together(prefixes: list[list[str]]) -> list[dict[str, object]]:
    """Both roles alive at once (namespace inodes are reused once a namespace is gone), each reporting itself."""
    procs = [subprocess.Popen([*p, sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for p in prefixes]  # fmt: skip
    try:
        return [dict(json.loads(p.stdout.readline())) for p in procs if p.stdout is not None]
    finally:
        for p in procs:
            p.communicate(timeout=30)


@pytest.mark.skipif(not _can_unshare(), reason="needs root and permission to create namespaces")
def test_pods_get_their_own_pid_namespace_and_a_pair_shares_one() -> None:
    me = iso.namespaces(os.getpid())
    pods = _run_together([iso.role_prefix("pods", r) for r in iso.ROLES])
    for p in pods:
        ns = p["ns"]
        assert isinstance(ns, dict) and ns["pid"] != me["pid"] and ns["ipc"] != me["ipc"] and ns["mnt"] != me["mnt"]
        assert p["pid"] == 1  # the pod's first process, as the container's entrypoint
    a, b = (p["ns"] for p in pods)
    assert isinstance(a, dict) and isinstance(b, dict)
    assert a["pid"] != b["pid"] and a["ipc"] != b["ipc"] and a["mnt"] != b["mnt"]
    assert (pods[0]["uid"], pods[1]["uid"]) == (1000, 1001)
    holder, pid = iso.start_holder()
    try:
        pair = _run_together([iso.role_prefix("pair", r, holder_pid=pid) for r in iso.ROLES])
    finally:
        iso.stop_holder(holder)
    a, b = (p["ns"] for p in pair)
    assert isinstance(a, dict) and isinstance(b, dict)
    assert a["pid"] == b["pid"] != me["pid"] and a["ipc"] == b["ipc"]
    assert a["mnt"] != b["mnt"] and me["mnt"] not in (a["mnt"], b["mnt"])  # each container its own
    assert (pair[0]["uid"], pair[1]["uid"]) == (1000, 1001)
