"""The local cluster's lifecycle: `up`, `down` and `running`, for the CLI, the tests and the benches.

    state = lifecycle.up(name)        # a healthy cluster `name` as is; else a stale one torn down, a fresh one started
    lifecycle.down(name)              # the LWS controller, the real node, then the control plane; safe to call twice
    with lifecycle.running(name) as state: ...

It stands above the control plane (cluster.py) and the real node (realnode.py, which runs on that control plane),
so the order of teardown is decided here, in one place: the real node's kubelet deletes its pods through the
apiserver, so the real node stops first, the control plane after it.
"""

from __future__ import annotations

import contextlib
import urllib.error
from collections.abc import Iterator

from hpd_devcluster import cluster, lws, realnode
from hpd_devcluster.cluster import DEFAULT_NAME, ClusterError, ClusterState, ExtraArgs, NodePool


def up(
    name: str = DEFAULT_NAME, pool: NodePool | None = None, timeout: float = 120.0, extra_args: ExtraArgs | None = None
) -> ClusterState:
    """Bring the cluster `name` up (idempotent: a healthy running cluster is returned as is, whatever `extra_args`
    say; the scale bench uses them for the apiserver's audit log and the controller-manager's client rate). A
    cluster that is recorded but not healthy is torn down first, the same way as `down` (its real node included)."""
    cluster.check_extra_args(extra_args)
    existing = ClusterState.load(name)
    if existing is not None:
        if cluster.healthy(existing):
            return existing
        down(name)
    return cluster.start(name, pool, timeout, extra_args)


def down(name: str = DEFAULT_NAME) -> list[str]:
    """Stop everything `up` (and `realnode.start`, `lws.start`) started for `name` and delete its data (logs are
    kept); return the names of the processes stopped. Safe to call twice."""
    state = ClusterState.load(name)
    if state is None:
        return []
    with contextlib.suppress(OSError, ClusterError, urllib.error.URLError):
        lws.stop(state)  # a LeaderWorkerSet controller the tests started on this cluster
    stopped_node = realnode.stop(state)  # before the apiserver: the kubelet deletes its pods through it
    return stopped_node + cluster.teardown(state)


@contextlib.contextmanager
def running(name: str, pool: NodePool | None = None, extra_args: ExtraArgs | None = None) -> Iterator[ClusterState]:
    """A cluster for the duration of a `with` block (the benches and the fresh-install test)."""
    state = up(name, pool, extra_args=extra_args)
    try:
        yield state
    finally:
        down(name)
