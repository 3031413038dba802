"""How an engine process is launched and stopped (pure; part of the profile, hpd_operator.profile): the parallel
layout of a replica (pipeline stages, vLLM's own multi-node launch for a replica that spans nodes, docs/multi-node.md)
and the graceful stop (vLLM's --shutdown-timeout, the preStop drain's env and the grace period that fits them,
docs/autoscaling.md "Scale-down that drains"). Each setting is written with its reason (profile_model.RoleWriter)."""

from __future__ import annotations

from hpd_operator.profile_model import EnvEntry, RoleWriter
from hpd_operator.validation import Validated
from hpd_runtime import contract

__all__ = ["drain_env", "drain_grace_seconds", "parallel_args", "shutdown_args", "worker_args"]


def drain_grace_seconds(drain_timeout_seconds: int) -> int:
    """terminationGracePeriodSeconds of an engine pod: the preStop's propagation wait and drain, then vLLM's own
    --shutdown-timeout after SIGTERM, and a margin for the process to exit."""
    return contract.DRAIN_PROPAGATION_SECONDS_DEFAULT + 2 * drain_timeout_seconds + 10


def shutdown_args(s: RoleWriter, valid: Validated) -> list[str]:
    seconds = valid.spec.drain_timeout_seconds
    if seconds == 0:
        return []
    why = (
        "spec.drainTimeoutSeconds: on SIGTERM vLLM finishes in-flight requests for up to this long (its default 0 "
        "aborts them: a scale-down or rollout would fail every request the pod was serving)"
    )
    return s.flag("--shutdown-timeout", str(seconds), why)


def drain_env(s: RoleWriter, valid: Validated) -> list[EnvEntry]:
    """What the preStop (`hpd_runtime drain`) reads."""
    return [
        s.env(contract.ENV_DRAIN_TIMEOUT_SECONDS, str(valid.spec.drain_timeout_seconds),
              "spec.drainTimeoutSeconds: how long the preStop lets in-flight requests finish"),
        s.env(contract.ENV_DRAIN_PROPAGATION_SECONDS, str(contract.DRAIN_PROPAGATION_SECONDS_DEFAULT),
              "how long the preStop waits for the endpoint and the router to stop sending the pod new requests"),
    ]  # fmt: skip


def parallel_args(s: RoleWriter, valid: Validated, role: contract.Role) -> list[str]:
    """Pipeline stages, and vLLM's own multi-node launch for a replica that spans nodes (every pod of the group gets
    the same args; the kubelet fills in what LeaderWorkerSet's webhook put into the env: the node rank and the
    leader's address)."""
    rs, row = valid.spec.role(role), valid.row
    args: list[str] = []
    if rs.pipeline_parallel_size > 1:
        why = f"spec.{role}.pipelineParallelSize: {rs.gpus_per_replica} GPUs per replica (TP x PP)"
        args += s.flag("--pipeline-parallel-size", str(rs.pipeline_parallel_size), why)
    if not rs.multi_node:
        return args
    mp = f"[{row.cite('multi-node-mp')}]"
    nodes = f"{rs.gpus_per_replica} GPUs per replica over {rs.nodes_per_replica} nodes of spec.{role}.gpusPerNode"
    args += s.flag(
        "--distributed-executor-backend", "mp", f"vLLM's multiprocessing executor spans the nodes, no Ray {mp}"
    )
    args += s.flag("--nnodes", str(rs.nodes_per_replica), f"{nodes} ({rs.gpus_per_pod} ranks on each pod)")
    args += s.flag(
        "--node-rank",
        f"$({contract.ENV_LWS_WORKER_INDEX})",
        "each pod's index in its LeaderWorkerSet group (0 = leader)",
    )
    args += s.flag(
        "--master-addr",
        f"$({contract.ENV_LWS_LEADER_ADDRESS})",
        "the group leader's DNS name (LeaderWorkerSet's per-group headless Service): torch.distributed's rendezvous",
    )
    return args + s.flag(
        "--master-port", str(contract.MASTER_PORT), "torch.distributed's rendezvous port on the leader"
    )


def worker_args(s: RoleWriter, valid: Validated, role: contract.Role) -> tuple[str, ...]:
    if not valid.spec.role(role).multi_node:
        return ()
    why = (
        "on the workers of a group only: vLLM runs the ranks of its node without an API server (the leader serves, "
        f"warms up, runs the pair check and joins the router) [{valid.row.cite('multi-node-mp')}]"
    )
    return tuple(s.flag("--headless", why=why))
