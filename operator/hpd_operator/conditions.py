"""The one typed vocabulary of the CR's status: condition types, reasons and phases (used by status.py, the
Events the operator posts, metrics and the tests). `tests/unit/test_status.py` checks it against the status model
(api/models.py), so the producer and the CRD cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from hpd_runtime import contract


class ConditionType(StrEnum):
    READY = "Ready"
    PREFILL_READY = "PrefillReady"
    DECODE_READY = "DecodeReady"
    ROUTER_READY = "RouterReady"
    WARMED_UP = "WarmedUp"
    HYBRID_PROFILE_APPLIED = "HybridProfileApplied"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    DATA_PATH_VERIFIED = "DataPathVerified"


COMPONENT_CONDITION: dict[str, ConditionType] = {
    "prefill": ConditionType.PREFILL_READY,
    "decode": ConditionType.DECODE_READY,
    contract.COMPONENT_ROUTER: ConditionType.ROUTER_READY,
}


class Phase(StrEnum):
    PENDING = "Pending"
    PROGRESSING = "Progressing"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class Reason(StrEnum):
    """Condition reasons and Event reasons (an Event's reason is the condition reason it reports, or a child
    action: Created / Updated / Pruned)."""

    # role conditions
    MISSING = "Missing"
    SCALED_TO_ZERO = "ScaledToZero"
    ALL_REPLICAS_READY = "AllReplicasReady"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    ROLLOUT_FAILED = "RolloutFailed"
    UNSCHEDULABLE = "Unschedulable"
    """A pod of the role cannot be scheduled (the scheduler's message is in the condition)."""
    NODE_LOST = "NodeLost"
    """A pod of the role is bound to a node that no longer exists."""
    NOT_SCHEDULED = "NotScheduled"
    """A pod of the role has waited longer than status.NOT_SCHEDULED_AFTER without any scheduler looking at it (no
    PodScheduled condition: e.g. podTemplate.spec.schedulerName names a scheduler that is not running)."""
    # WarmedUp
    WARMUP_DISABLED = "WarmupDisabled"
    ALL_ENGINES_WARM = "AllEnginesWarm"
    WARMUP_PENDING = "WarmupPending"
    # DataPathVerified
    DATA_PATH_VERIFIED = "Verified"
    """Every desired decode replica is Ready: each passed its pair check with every Ready prefill (and, with the
    canary on, its last canary: a failing one turns that decode not Ready)."""
    KV_PATH_BELOW_FLOOR = "KVPathBelowFloor"
    """Verified, but the KV rate a Ready decode measured is under spec.kvTransfer.floorGBps (status.kvPath)."""
    DATA_PATH_UNVERIFIED = "NotVerified"
    PAIR_CHECK_DISABLED = "PairCheckDisabled"
    # HybridProfileApplied
    HYBRID = "Hybrid"
    ATTENTION_ONLY = "AttentionOnly"
    UNKNOWN = "Unknown"
    # Progressing / Degraded
    ROLLING_OUT = "RollingOut"
    STABLE = "Stable"
    AS_EXPECTED = "AsExpected"
    # Progressing during a rollout between generations (docs/rollouts.md)
    GENERATION_STARTING = "GenerationStarting"
    """The spec's generation is coming up beside the serving one (which keeps all traffic until it is Ready)."""
    GENERATION_BLOCKED = "GenerationBlocked"
    """The spec's generation cannot come up (unschedulable, e.g. no spare GPUs; progress deadline exceeded); the
    serving generation keeps serving (Progressing=False)."""
    TRAFFIC_SWITCHING = "TrafficSwitching"
    """The router moves to the spec's generation; the old generation drains."""
    # Ready
    ALL_COMPONENTS_READY = "AllComponentsReady"
    COMPONENTS_NOT_READY = "ComponentsNotReady"
    # failures of one reconcile (Ready=False, Degraded=True, phase Failed; one Warning Event per transition)
    INVALID_SPEC = "InvalidSpec"
    """The spec is rejected (field path + rule in the message); nothing is applied or pruned."""
    APPLY_FAILED = "ApplyFailed"
    """The apiserver refused a child (kind/name + the apiserver's field message)."""
    OWNERSHIP_CONFLICT = "OwnershipConflict"
    """A child's name is taken by an object this CR does not own; it is left alone."""
    RECONCILE_ERROR = "ReconcileError"
    """An unexpected error in one step (named in the message); other CRs are not affected."""
    LWS_MISSING = "LeaderWorkerSetMissing"
    """A role's replica spans nodes (a LeaderWorkerSet) and LeaderWorkerSet is not installed; nothing is applied."""
    RISKY_SPEC = "RiskySpec"
    """Not fatal, deployed anyway (Warning Event, status.profile.warnings): e.g. an image tag naming another vLLM
    release than spec.vllmVersion, a spec.blockSize vLLM may raise."""
    SHARED_HOST_PID_NAMESPACE = "SharedHostPIDNamespace"
    """A Warning Event, once per CR generation: spec.kvTransfer.processNamespace is Host, every engine pod runs in
    the node's PID namespace (a security trade for cuda_ipc between same-node pods: hpd_operator.api.processns)."""
    STATUS_WRITE_FAILED = "StatusWriteFailed"
    """The apiserver refused the CR's status (Event only: the status could not say it), e.g. a spec too large to
    store a status beside it."""
    # child actions (Events only)
    CREATED = "Created"
    UPDATED = "Updated"
    PRUNED = "Pruned"
    # rollout transitions (Events only, one per transition)
    GENERATION_STARTED = "GenerationStarted"
    TRAFFIC_SWITCHED = "TrafficSwitched"
    GENERATION_REMOVED = "GenerationRemoved"
    """An old generation drained (no router pod selects it any more) and was removed."""
    GENERATION_CANCELLED = "GenerationCancelled"
    """A generation that never served was removed: the spec went back to the serving one, or moved on."""
    # degraded mode (spec.router.degradedMode): the endpoint serves colocated on the role that is left
    DECODE_UNAVAILABLE = "DecodeUnavailable"
    """No Ready decode pod of the serving generation: the endpoint serves colocated on its prefill pods."""
    PREFILL_UNAVAILABLE = "PrefillUnavailable"
    """No Ready prefill pod of the serving generation: the endpoint serves colocated on its decode pods."""
    PD_RESTORED = "PDRestored"
    """The missing role is Ready again (decode: its pair check passed): the endpoint is the router again (Event)."""


FAILURE_REASONS: frozenset[Reason] = frozenset(
    {Reason.INVALID_SPEC, Reason.APPLY_FAILED, Reason.OWNERSHIP_CONFLICT, Reason.RECONCILE_ERROR, Reason.LWS_MISSING}
)
FALLBACK_REASONS: frozenset[Reason] = frozenset({Reason.DECODE_UNAVAILABLE, Reason.PREFILL_UNAVAILABLE})
ROLE_PROBLEM_REASONS: frozenset[Reason] = frozenset(
    {Reason.ROLLOUT_FAILED, Reason.UNSCHEDULABLE, Reason.NODE_LOST, Reason.NOT_SCHEDULED}
)


@dataclass(frozen=True)
class Failure:
    """Why one reconcile could not converge the children (it becomes the Ready/Degraded conditions and one Event)."""

    reason: Reason
    message: str


MAX_MESSAGE = 4000
"""Condition messages are cut here (the CRD allows 32768; an apiserver error can quote a whole object)."""


def condition(ctype: ConditionType, ok: bool | None, reason: Reason, message: str) -> dict[str, str]:
    """One status condition (camelCase; the times are stamped by the status)."""
    status = "Unknown" if ok is None else ("True" if ok else "False")
    return {"type": str(ctype), "status": status, "reason": str(reason), "message": clip(message)}


def problem_text(problems: Sequence[tuple[Reason, str]]) -> str:
    return "; ".join(f"{r}: {m}" for r, m in problems)


def truth(status: str) -> bool | None:
    """A condition's status string as a bool (None: Unknown)."""
    return None if status == "Unknown" else status == "True"


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
