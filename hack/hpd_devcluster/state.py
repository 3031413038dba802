"""What every part of the local control plane shares (stdlib only: this package must work before anything else is
installed): the cluster's recorded state (`ClusterState`, `state.json`), its failures (`ClusterError`), the child
processes this Python process started, free loopback ports, and plain calls to its apiserver. cluster.py (the control
plane) and the add-ons that run beside it (lws.py) both stand on it; neither imports the other for these."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpd_devcluster import build


class ClusterError(RuntimeError):
    """A step of `up`/`down` failed; the message names the step and the log to read."""

    def __init__(self, step: str, log: Path | None = None, detail: str = "") -> None:
        tail = ""
        if log is not None and log.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        where = f"; log: {log}" if log is not None else ""
        super().__init__(f"devcluster step {step!r} failed{where}{(': ' + detail) if detail else ''}\n{tail}".rstrip())
        self.step = step
        self.log = log


@dataclass
class ClusterState:
    name: str
    dir: str
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    argv: dict[str, list[str]] = field(default_factory=dict)
    """Each process's command line as `up` started it, so `restart` starts it again with the same flags."""

    @property
    def root(self) -> Path:
        return Path(self.dir)

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def save(self) -> None:
        (self.root / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, name: str) -> ClusterState | None:
        path = cluster_dir(name) / "state.json"
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))


def cluster_dir(name: str) -> Path:
    return build.cache_dir() / "clusters" / name


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Processes started by this Python process, so an early exit can report its exit status."""


def alive(pid: int, binary_name: str) -> bool:
    """True if `pid` runs and is the binary we started (guards against PID reuse).

    A child of this process is asked through its Popen object: right after Popen returns, /proc/<pid>/cmdline
    can still be empty while the kernel finishes the exec (seen here), which must not read as "exited".
    """
    child = CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and (cmdline == "" or os.path.basename(cmdline) == binary_name)


# --- talking to the apiserver (stdlib only: this package must work before anything else is installed) ---------


def ssl_context(state: ClusterState, client: str = "admin") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(state.pki / "ca.crt"))
    ctx.load_cert_chain(str(state.pki / f"{client}.crt"), str(state.pki / f"{client}.key"))
    return ctx


def api(state: ClusterState, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 10) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        state.server + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, context=ssl_context(state), timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def url_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    """GET `url` answers 200 (https with `ctx`, plain http without)."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False
