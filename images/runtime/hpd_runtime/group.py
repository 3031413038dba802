"""The pods of a replica that spans nodes (a LeaderWorkerSet group): what a worker does before and while its ranks run.

vLLM's multi-node launch (vllm#23691): every pod runs `vllm serve` with `--nnodes`, its `--node-rank` and the
leader's `--master-addr`/`--master-port`; the workers add `--headless` and serve no API. The leader is an ordinary
engine pod for the runtime (warmup, pair check, readiness). A worker:
- waits until the leader's torch.distributed rendezvous accepts connections (its DNS name resolves only once
  LeaderWorkerSet's per-group Service lists the leader, and the port opens once the leader's rank 0 runs), saying
  so in /readyz, then starts vLLM (LeaderWorkerSet recreates the whole group if a worker's container restarts);
- reports Ready while its vLLM process runs: the group's readiness is its leader's (warm, pair check passed), and
  LeaderWorkerSet counts a group Ready only when all of its pods are.

Pure parts, unit-tested: `leader_address`, `wait_for_leader` (with an injected connect).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence

from hpd_runtime.config import arg_value

LEADER_POLL_SECONDS = 2.0
CONNECT_TIMEOUT_SECONDS = 2.0


def leader_address(args: Sequence[str]) -> tuple[str, int] | None:
    """(host, port) of the leader's rendezvous from the vLLM argv (as the kubelet expanded it); None without
    `--master-addr`."""
    host = arg_value(args, "--master-addr")
    if not host:
        return None
    port = arg_value(args, "--master-port")
    return host, int(port) if port and port.isdigit() else 29501


def tcp_connect(host: str, port: int) -> str | None:
    """None when `host:port` accepts a TCP connection, else why not (resolution or connect error)."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS):
            return None
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def wait_for_leader(
    host: str,
    port: int,
    stop: threading.Event,
    report: Callable[[str], None],
    *,
    connect: Callable[[str, int], str | None] = tcp_connect,
    poll: float = LEADER_POLL_SECONDS,
) -> bool:
    """Poll the leader's rendezvous until it accepts a connection (True) or `stop` is set (False); `report` gets
    the reason while it does not (the kubelet's startup probe bounds the wait)."""
    while not stop.is_set():
        why = connect(host, port)
        if why is None:
            return True
        report(f"waiting for the group leader's rendezvous at {host}:{port} ({why})")
        stop.wait(poll)
    return False
