"""spec.kvTransfer.processNamespace: the PID namespace the engine pods run in, the security trade of `Host`, and the
pair pods of `Pair` (pure; the one wording the profile, the builders, status and the Warning Event share).

`Pair` (builders.pair) puts one prefill and one decode engine container into each pod with `shareProcessNamespace:
true`: one PID namespace of the pod's own, hostPID false, no security trade (no Event); decode's ports are its own
(engine_ports), since both share the pod's network namespace.

UCX's cuda_ipc opens the peer's CUDA IPC handle only when both processes are in one PID namespace
(openucx/ucx#11978); two default pods on one node are not, and UCX falls back to its TCP emulation (~0.4 GB/s on an
H200, docs/kv-topologies.md). `Host` puts every engine pod of the CR into the node's PID namespace (`hostPID: true`),
so a prefill and a decode that land on the same node share one and keep cuda_ipc. Refused by default: the field is
the only way to get it (a podTemplate's `hostPID` stays refused, api/rules.py FORBIDDEN_POD_FIELDS).

No pod affinity is added: a preferred affinity would need the generation's label, which the generation's template
(whose hash names the generation) cannot contain, and it would pack GPU pods onto nodes against the user's own
spec.<role>.affinity; where P and D should share a node, spec.<role>.affinity (or nodeSelector) says so, and the
transport UCX chose is reported either way (status.kvPath.transport, DataPathVerified).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from hpd_operator.conditions import Reason
from hpd_runtime import contract

ProcessNamespace = Literal["Pod", "Host", "Pair"]
POD: Final = "Pod"
HOST: Final = "Host"
PAIR: Final = "Pair"
FIELD: Final = "spec.kvTransfer.processNamespace"

TRADE: Final = (
    "every engine pod of this CR runs in the node's PID namespace (hostPID: true): it sees every process of the node "
    "(their command lines and environment, other tenants' included) and can signal those of its uid; Pod Security "
    "baseline and restricted refuse it, so the namespace must admit privileged pods"
)
BUYS: Final = (
    "UCX's cuda_ipc between a prefill and a decode pod that land on the same node (in separate PID namespaces UCX "
    "falls back to tcp emulation, ~0.4 GB/s); nothing across nodes"
)


def shares_host_pid(kv: Any) -> bool:
    """Whether the CR's engine pods run in the node's PID namespace (`kv`: its spec.kvTransfer)."""
    return bool(getattr(kv, "process_namespace", POD) == HOST)


def pairs(kv: Any) -> bool:
    """Whether the CR runs pair pods (`kv`: its spec.kvTransfer): one pod per prefill+decode pair, its containers in
    one PID namespace of the pod's own (shareProcessNamespace), with an in-pod router (docs/kv-topologies.md)."""
    return bool(getattr(kv, "process_namespace", POD) == PAIR)


@dataclass(frozen=True)
class EnginePorts:
    """What one engine container listens on: vLLM's API, the runtime's readiness server, NIXL's side channel."""

    vllm: int
    runtime: int
    side_channel: int


def engine_ports(kv: Any, role: contract.Role) -> EnginePorts:
    """The role's ports: the contract's in a pod of its own; in a pair pod, decode's are its own
    (contract.PAIR_DECODE_*), since both engines share the pod's network namespace and pod IP."""
    base = int(kv.side_channel_port)
    if role == "decode" and pairs(kv):
        return EnginePorts(
            contract.PAIR_DECODE_VLLM_PORT,
            contract.PAIR_DECODE_RUNTIME_PORT,
            base + contract.PAIR_DECODE_SIDE_CHANNEL_OFFSET,
        )
    return EnginePorts(contract.VLLM_PORT, contract.RUNTIME_PORT, base)


PAIR_REASON: Final = (
    f"{FIELD} Pair: prefill and decode run as two containers of one pod with shareProcessNamespace, one PID namespace "
    "of the pod's own (not the node's), so UCX's cuda_ipc opens the peer's CUDA IPC handle (23.9 GB/s measured on an "
    "H200 against 0.47 GB/s over tcp emulation between two pods); an in-pod router pairs the pod's own prefill and "
    "decode, so no request pairs halves of two pods"
)


def profile_reason() -> str:
    """status.profile's reason for `hostPID: true`."""
    return f"{FIELD} Host: buys {BUYS}. The security trade: {TRADE}"


def data_path_note(kv: Any) -> str | None:
    """What DataPathVerified adds about the PID namespace (None: the pods' own, the default: nothing added)."""
    if pairs(kv):
        return f"PID namespace shared by prefill and decode inside each pair pod ({FIELD} Pair): cuda_ipc reachable"
    if not shares_host_pid(kv):
        return None
    return (
        f"PID namespace shared with the node ({FIELD} Host, a security trade: every engine pod sees the node's "
        "processes): cuda_ipc reachable between prefill and decode on the same node"
    )


def security_event(kv: Any) -> tuple[str, str] | None:
    """The Warning Event (reason, message) posted once per CR generation while opted in; None otherwise."""
    if not shares_host_pid(kv):
        return None
    return str(Reason.SHARED_HOST_PID_NAMESPACE), f"{FIELD} is Host: {TRADE}; it buys {BUYS}"
