"""spec.kvTransfer.processNamespace: the PID namespace the engine pods run in, and the security trade of `Host`
(pure; the one wording the profile, the builders, status and the Warning Event share).

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

from typing import Any, Final, Literal

from hpd_operator.conditions import Reason

ProcessNamespace = Literal["Pod", "Host"]
POD: Final = "Pod"
HOST: Final = "Host"
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


def profile_reason() -> str:
    """status.profile's reason for `hostPID: true`."""
    return f"{FIELD} Host: buys {BUYS}. The security trade: {TRADE}"


def data_path_note(kv: Any) -> str | None:
    """What DataPathVerified adds about the PID namespace (None: the pods' own, the default: nothing added)."""
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
