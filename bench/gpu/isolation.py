"""Start a bench role the way a kubelet isolates it (issue #43): the namespace topologies of prefill and decode.

The PID namespace decides whether UCX's cuda_ipc can open the peer's CUDA IPC handle (docs/kv-path.md): two pods
have two PID namespaces, and the KV path falls back to TCP emulation; one pod with `shareProcessNamespace` has one.
A role is wrapped in `unshare` / `nsenter` (util-linux) and `setpriv` before its own argv:

- `host`: no namespaces of its own, the caller's uid: both roles are processes of one host (how bench/gpu ran
  before issue #43; the figures of docs/kv-path.md's first tables were measured so).
- `pods`: each role its own PID, IPC and mount namespace, its own /proc and its own /dev/shm (a tmpfs), a non-root
  uid: two pods as the operator renders them (`hostPID: false`, `hostIPC: false`).
- `pair`: one new PID and IPC namespace shared by both roles (the pod's, held by a `sleep` as the pause
  container holds it), each role its own mount namespace and /proc, different uids: two containers of one pod
  with `shareProcessNamespace: true`.

The network namespace stays the host's in every topology: the roles talk over loopback (NIXL's notifications and
UCX's TCP lanes), where two pods would talk over the pod network. Nothing here needs the GPU; the argv builders are
pure (tests/unit/test_bench_gpu_isolation.py), `start_holder` / `stop_holder` run processes (root only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str
    why: str
    roles_share_pid_namespace: bool
    roles_share_ipc_namespace: bool
    own_mount_namespace: bool
    uids: tuple[tuple[int, int], tuple[int, int]] | None
    """(uid, gid) of (prefill, decode); None: the caller's."""


TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology("host", "both roles processes of one host, the caller's namespaces and uid (bench/gpu before #43)",
                 True, True, False, None),
        Topology("pods", "two default pods: each role its own PID, IPC and mount namespace, /proc and /dev/shm; "
                 "non-root uids 1000 and 1001", False, False, True, ((1000, 1000), (1001, 1001))),
        Topology("pair", "one pod with shareProcessNamespace: one PID and IPC namespace for both roles, each its "
                 "own mount namespace and /proc; non-root uids 1000 and 1001", True, True, True,
                 ((1000, 1000), (1001, 1001))),
    )
}  # fmt: skip
ROLES = ("p", "d")


def setpriv(uid_gid: tuple[int, int] | None) -> list[str]:
    """Drop to a non-root uid/gid (no supplementary groups), as a pod's `runAsUser` / `runAsGroup`."""
    if uid_gid is None:
        return []
    uid, gid = uid_gid
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def role_prefix(topology: str, role: str, holder_pid: int | None = None, as_root: bool = False) -> list[str]:
    """What goes before a role's own argv. `pair` needs the pid of the process that holds the shared namespaces
    (`start_holder`). `as_root`: keep the caller's uid (where a non-root process cannot open the GPU)."""
    t = TOPOLOGIES[topology]
    ids = t.uids[ROLES.index(role)] if t.uids and not as_root else None
    if t.name == "host":
        return setpriv(ids)
    if t.name == "pods":
        # unshare stays root until setpriv: it mounts the pod's own /proc and /dev/shm in the new mount namespace
        return ["unshare", "--pid", "--ipc", "--mount", "--fork", "--mount-proc", "--kill-child", "--",
                "sh", "-c", 'mount -t tmpfs -o size=1g,mode=1777 shm /dev/shm && exec "$@"', "pod",
                *setpriv(ids)]  # fmt: skip
    if holder_pid is None:
        raise ValueError("the pair topology needs the holder's pid (start_holder)")
    # enter the pod's PID and IPC namespace (nsenter forks for the PID namespace), then a container's own mount
    # namespace with a /proc of the pod's PID namespace
    return ["nsenter", f"--target={holder_pid}", "--pid", "--ipc", "--",
            "unshare", "--mount", "--mount-proc", "--", *setpriv(ids)]  # fmt: skip


HOLDER_ARGV = ("unshare", "--pid", "--ipc", "--fork", "--mount-proc", "--kill-child", "--", "sleep", "infinity")
"""The pod's sandbox for `pair`: a new PID and IPC namespace whose first process sleeps (the pause container)."""


def child_pid(parent: int, timeout: float = 5.0) -> int:
    """The first child of `parent` (unshare --fork's child is the namespace's PID 1)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == parent:
                    return int(stat.parent.name)
        time.sleep(0.02)
    raise TimeoutError(f"no child of {parent} within {timeout} s")


def start_holder() -> tuple[subprocess.Popen[bytes], int]:
    """Start the pair's namespace holder; (its unshare process, the pid to nsenter)."""
    p = subprocess.Popen(list(HOLDER_ARGV), start_new_session=True)
    return p, child_pid(p.pid)


def stop_holder(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)


def namespaces(pid: int) -> dict[str, str]:
    """The namespaces a process is in (`pid:[4026531836]`, ...), read from the host's /proc."""
    out: dict[str, str] = {}
    for ns in ("pid", "ipc", "mnt", "net"):
        with contextlib.suppress(OSError):
            out[ns] = os.readlink(f"/proc/{pid}/ns/{ns}")
    return out


def prepare_dirs(paths: Sequence[Path]) -> None:
    """Directories the non-root roles write to (their rendezvous, HOME): world-writable, sticky."""
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)
        os.chmod(p, 0o1777)
