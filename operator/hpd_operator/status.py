"""Pure: what we observe (the role Deployments) -> the CR's status (conditions, counts, endpoint, profile).

What Ready means: the endpoint can serve a request now. Every role has >= 1 desired replica, every desired replica
of every role is updated and Ready (engine pods only turn Ready after the runtime's warmup), and the Deployments
have caught up with their spec. A role scaled to 0 is reported `<Role>Ready=True, reason=ScaledToZero`, but the
CR is then `Ready=False, reason=ScaledToZero`: nothing can answer on the endpoint.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpd_operator.api.models import HybridPDDeploymentSpec
from hpd_operator.api.names import endpoint_url, selector_string
from hpd_operator.conditions import (
    COMPONENT_CONDITION,
    FAILURE_REASONS,
    ROLE_PROBLEM_REASONS,
    ConditionType,
    Failure,
    Phase,
    Reason,
)
from hpd_operator.errors import SpecError
from hpd_operator.profile import Profile
from hpd_runtime import contract

COMPONENTS: tuple[str, ...] = (*contract.ROLES, contract.COMPONENT_ROUTER)
MAX_MESSAGE = 4000
"""Condition messages are cut here (the CRD allows 32768; an apiserver error can quote a whole object)."""


@dataclass(frozen=True)
class RoleState:
    desired: int
    replicas: int
    ready: int
    updated: int
    available: int
    exists: bool
    caught_up: bool
    """The Deployment controller has observed the latest spec and its spec.replicas is what we want."""
    problems: tuple[tuple[Reason, str], ...] = ()
    """Why the role is failing: a stuck rollout, an unschedulable pod (scheduler's reason), a pod on a lost node."""

    @property
    def ready_all(self) -> bool:
        return self.exists and self.caught_up and self.ready >= self.desired and self.updated >= self.desired

    @property
    def rolling(self) -> bool:
        return not self.ready_all or self.replicas > self.desired


def _deployment_problems(st: Mapping[str, Any]) -> list[tuple[Reason, str]]:
    out: list[tuple[Reason, str]] = []
    for c in st.get("conditions") or []:
        stuck = c.get("type") == "Progressing" and c.get("status") == "False"
        if stuck or (c.get("type") == "ReplicaFailure" and c.get("status") == "True"):
            out.append((Reason.ROLLOUT_FAILED, f"{c.get('reason')}: {c.get('message', '')}"))
    return out


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


NOT_SCHEDULED_AFTER = 60.0
"""Seconds a pod may wait for its scheduler's first look (a PodScheduled condition) before the role is Degraded
(NotScheduled). The default scheduler looks at a new pod within a second; a loaded one within seconds."""


def _parse_time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def unlooked_age(pod: Mapping[str, Any], now: str | None) -> float | None:
    """Seconds an unbound pod has waited without any scheduler's verdict (None: bound, judged, or unknown)."""
    md, sp, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if sp.get("nodeName") or md.get("deletionTimestamp"):
        return None
    if any(c.get("type") == "PodScheduled" for c in st.get("conditions") or []):
        return None
    t0, t1 = _parse_time(md.get("creationTimestamp")), _parse_time(now)
    return None if t0 is None or t1 is None else max((t1 - t0).total_seconds(), 0.0)


def next_pod_check(pods: Iterable[Mapping[str, Any]], now: str | None) -> float | None:
    """Seconds until the next unbound, unjudged pod reaches NOT_SCHEDULED_AFTER (no event announces that moment)."""
    waits = [NOT_SCHEDULED_AFTER - a for p in pods if (a := unlooked_age(p, now)) is not None]
    waits = [w for w in waits if w > 0]
    return min(waits) + 1.0 if waits else None


def pod_problems(
    pods: Sequence[Mapping[str, Any]], nodes: Collection[str] | None, now: str | None = None
) -> tuple[list[tuple[Reason, str]], int]:
    """Unschedulable pods (with the scheduler's message), pods no scheduler has looked at for NOT_SCHEDULED_AFTER
    seconds, and Ready pods bound to a node that no longer exists (`nodes` = the names of the existing nodes; None =
    unknown). Returns the problems and how many pods counted Ready by their Deployment are on lost nodes."""
    out: list[tuple[Reason, str]] = []
    lost_ready = 0
    for pod in pods:
        md, st = pod.get("metadata") or {}, pod.get("status") or {}
        if md.get("deletionTimestamp"):
            continue
        for c in st.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                out.append((Reason.UNSCHEDULABLE, f"pod {md.get('name')}: {c.get('message', 'unschedulable')}"))
        age = unlooked_age(pod, now)
        if age is not None and age >= NOT_SCHEDULED_AFTER:
            sched = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
            out.append((Reason.NOT_SCHEDULED, f"pod {md.get('name')} has waited {age:.0f} s and no scheduler has "
                        f"looked at it: is the scheduler {sched!r} running (podTemplate.spec.schedulerName)?"))  # fmt: skip
        node = (pod.get("spec") or {}).get("nodeName")
        if node and nodes is not None and node not in nodes:
            out.append((Reason.NODE_LOST, f"pod {md.get('name')} is bound to node {node}, which no longer exists"))
            lost_ready += _pod_ready(pod)
    return out, lost_ready


def ready_count(st: Mapping[str, Any], pods: Sequence[Mapping[str, Any]] | None) -> int:
    """The Deployment's readyReplicas, but never more than the Ready pods seen (`pods` None: not observed). The
    Deployment controller lowers its count only after a pod is gone: a status computed from the pod's delete event
    in between would count the deleted pod as Ready (seen: Ready=True with no decode pod Ready after a node loss)."""
    ready = int(st.get("readyReplicas") or 0)
    if pods is None:
        return ready
    seen = sum(1 for p in pods if _pod_ready(p) and not (p.get("metadata") or {}).get("deletionTimestamp"))
    return min(ready, seen)


def role_state(
    desired: int,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]] | None = None,
    nodes: Collection[str] | None = None,
    now: str | None = None,
) -> RoleState:
    problems, lost_ready = pod_problems(pods or (), nodes, now)
    if deployment is None:
        return RoleState(desired, 0, 0, 0, 0, False, False, tuple(problems))
    md, sp, st = deployment.get("metadata", {}), deployment.get("spec", {}), deployment.get("status") or {}
    caught_up = st.get("observedGeneration", 0) >= md.get("generation", 1) and sp.get("replicas", 1) == desired
    return RoleState(
        desired=desired,
        replicas=int(st.get("replicas") or 0),
        ready=max(ready_count(st, pods) - lost_ready, 0),
        updated=int(st.get("updatedReplicas") or 0),
        available=int(st.get("availableReplicas") or 0),
        exists=True,
        caught_up=caught_up,
        problems=tuple(_deployment_problems(st) + problems),
    )


def _cond(ctype: ConditionType, ok: bool | None, reason: Reason, message: str) -> dict[str, str]:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {"type": str(ctype), "status": status, "reason": str(reason), "message": message}


def _problem_text(problems: Sequence[tuple[Reason, str]]) -> str:
    return "; ".join(f"{r}: {m}" for r, m in problems)


def _role_condition(comp: str, s: RoleState, detail: str | None = None) -> dict[str, str]:
    """`detail`: why a pod of the role is not Ready, from its probe Events (hpd_operator.podevents)."""
    cond = _role_condition_plain(comp, s)
    if detail and cond["status"] != "True":
        cond["message"] += f"; {detail}"
    return cond


def _role_condition_plain(comp: str, s: RoleState) -> dict[str, str]:
    name = COMPONENT_CONDITION[comp]
    if not s.exists:
        if s.problems:
            return _cond(
                name, False, s.problems[0][0], f"the {comp} Deployment does not exist; {_problem_text(s.problems)}"
            )
        return _cond(name, False, Reason.MISSING, f"the {comp} Deployment does not exist yet")
    if s.desired == 0:
        return _cond(name, True, Reason.SCALED_TO_ZERO, f"{comp} is scaled to 0 replicas")
    if s.ready_all:
        extra = f"; {_problem_text(s.problems)}" if s.problems else ""
        return _cond(name, True, Reason.ALL_REPLICAS_READY, f"{s.ready}/{s.desired} {comp} replicas ready{extra}")
    if s.problems:
        msg = f"{s.ready}/{s.desired} {comp} replicas ready; {_problem_text(s.problems)}"
        return _cond(name, False, s.problems[0][0], msg)
    msg = f"{s.ready}/{s.desired} {comp} replicas ready, {s.updated} updated"
    return _cond(name, False, Reason.REPLICAS_NOT_READY, msg)


def compute_status(
    *,
    name: str,
    namespace: str,
    spec: HybridPDDeploymentSpec | None,
    observed: Mapping[str, Mapping[str, Any] | None],
    generation: int | None,
    profile: Profile | None = None,
    error: SpecError | None = None,
    failure: Failure | None = None,
    pods: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    nodes: Collection[str] | None = None,
    notes: Sequence[str] = (),
    previous: Sequence[Mapping[str, Any]] = (),
    now: str | None = None,
    role_details: Mapping[str, str] | None = None,
    autoscalers: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The whole `status` (camelCase) for one CR.

    `observed` maps prefill/decode/router to the live Deployment (None if absent), `pods` to the live pods of each
    component, `nodes` is the set of existing node names (None = unknown). `spec` is None when the spec cannot be
    parsed; then `error` says why. `failure` is why this reconcile could not converge (InvalidSpec, ApplyFailed,
    OwnershipConflict, ReconcileError); `error` is shorthand for an InvalidSpec failure. `notes` are extra messages
    (e.g. a PodMonitor skipped). `previous` conditions and `now` keep lastTransitionTime stable across unchanged
    statuses (the caller owns the clock). `role_details` maps a role to why its pods are not Ready (their probe
    output, hpd_operator.podevents); it is appended to that role's condition message while the role is not Ready.
    `autoscalers` maps an autoscaling role to its status.<role>.autoscaler (scaling.autoscaler_status); such a role's
    desired count is its Deployment's replicas (its HPA's choice), not spec.<role>.replicas.
    """
    if failure is None and error is not None:
        failure = Failure(Reason.INVALID_SPEC, error.message)
    states = _states(spec, observed, pods or {}, nodes, now)
    scalers = autoscalers or {}
    details = role_details or {}
    conds = [_role_condition(comp, states[comp], details.get(comp)) for comp in COMPONENTS]
    conds.append(_warmup_condition(spec, states))
    conds.append(_profile_condition(profile, failure))
    conds += _progress_conditions(states, failure)
    ready, phase = _ready_condition(states, failure)
    if notes:
        ready["message"] += "; " + "; ".join(notes)
    conds.insert(0, ready)
    _stamp(conds, previous, generation, now)

    out: dict[str, Any] = {"phase": str(phase), "conditions": conds}
    if generation is not None:
        out["observedGeneration"] = generation
    for comp in COMPONENTS:
        out[comp] = _counts(name, comp, states[comp], scalers.get(comp))
    port = spec.router.service.port if spec is not None else None
    if port is not None:
        out["endpoint"] = endpoint_url(name, namespace, port)
    if profile is not None:
        out["profile"] = profile.status()
    return out


def _counts(name: str, comp: str, s: RoleState, scaler: Mapping[str, Any] | None) -> dict[str, Any]:
    """status.<component>: its counts, the scale subresource's selector, its autoscaler's report if any."""
    out: dict[str, Any] = {
        "replicas": s.replicas,
        "readyReplicas": s.ready,
        "updatedReplicas": s.updated,
        "summary": f"{s.ready}/{s.desired}",
        "selector": selector_string(name, comp),
    }
    if scaler is not None:
        out["autoscaler"] = dict(scaler)
    return out


def _states(
    spec: HybridPDDeploymentSpec | None,
    observed: Mapping[str, Mapping[str, Any] | None],
    pods: Mapping[str, Sequence[Mapping[str, Any]]],
    nodes: Collection[str] | None,
    now: str | None = None,
) -> dict[str, RoleState]:
    out: dict[str, RoleState] = {}
    for comp in COMPONENTS:
        dep = observed.get(comp)
        if spec is None:
            desired = int((dep or {}).get("spec", {}).get("replicas") or 0)
        elif comp == contract.COMPONENT_ROUTER:
            desired = spec.router.replicas
        elif spec.role(comp).autoscaling is not None and dep is not None:  # type: ignore[arg-type]
            desired = int((dep.get("spec") or {}).get("replicas") or 0)  # the autoscaler's choice
        else:
            desired = spec.role(comp).replicas  # type: ignore[arg-type]
        out[comp] = role_state(desired, dep, pods.get(comp), nodes, now)  # a component left out: pods not observed
    return out


def _warmup_condition(spec: HybridPDDeploymentSpec | None, states: Mapping[str, RoleState]) -> dict[str, str]:
    engines = [states[r] for r in contract.ROLES]
    if spec is not None and not spec.warmup.enabled:
        return _cond(ConditionType.WARMED_UP, True, Reason.WARMUP_DISABLED, "spec.warmup.enabled is false")
    if all(s.ready_all for s in engines):
        msg = "every engine replica passed its warmup (/readyz)"
        return _cond(ConditionType.WARMED_UP, True, Reason.ALL_ENGINES_WARM, msg)
    waiting = sum(max(s.desired - s.ready, 0) for s in engines)
    msg = f"{waiting} engine replica(s) not warm (not Ready) yet"
    return _cond(ConditionType.WARMED_UP, False, Reason.WARMUP_PENDING, msg)


def _profile_condition(profile: Profile | None, failure: Failure | None) -> dict[str, str]:
    ctype = ConditionType.HYBRID_PROFILE_APPLIED
    if failure is not None and failure.reason == Reason.INVALID_SPEC:
        return _cond(ctype, False, Reason.INVALID_SPEC, failure.message)
    if profile is None:
        return _cond(ctype, None, Reason.UNKNOWN, "the profile was not computed")
    kind = "hybrid Mamba2/attention" if profile.hybrid else "attention-only"
    return _cond(
        ctype,
        True,
        Reason.HYBRID if profile.hybrid else Reason.ATTENTION_ONLY,
        f"{kind} profile for vLLM {profile.vllm_version} (row {profile.row}): {profile.hybrid_reason}",
    )


def _progress_conditions(states: Mapping[str, RoleState], failure: Failure | None) -> list[dict[str, str]]:
    """Progressing and Degraded."""
    rolling = [c for c, s in states.items() if s.rolling]
    if failure is not None and failure.reason == Reason.INVALID_SPEC:
        msg = "the spec is rejected; children are left as they were"
        progressing = _cond(ConditionType.PROGRESSING, False, Reason.INVALID_SPEC, msg)
    elif failure is not None:
        progressing = _cond(ConditionType.PROGRESSING, False, failure.reason, "the last reconcile did not complete")
    elif rolling:
        progressing = _cond(ConditionType.PROGRESSING, True, Reason.ROLLING_OUT, "rolling out: " + ", ".join(rolling))
    else:
        progressing = _cond(ConditionType.PROGRESSING, False, Reason.STABLE, "every component matches the spec")
    problems = [(r, f"{c}: {m}") for c, s in states.items() for r, m in s.problems]
    if failure is not None and failure.reason != Reason.INVALID_SPEC:
        problems.insert(0, (failure.reason, failure.message))
    if problems:
        degraded = _cond(ConditionType.DEGRADED, True, problems[0][0], "; ".join(m for _, m in problems))
    else:
        degraded = _cond(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "no component is failing")
    return [progressing, degraded]


def _ready_condition(states: Mapping[str, RoleState], failure: Failure | None) -> tuple[dict[str, str], Phase]:
    degraded = any(s.problems for s in states.values())
    rolling = any(s.rolling for s in states.values())
    scaled_to_zero = [c for c, s in states.items() if s.desired == 0]
    if failure is not None:
        return _cond(ConditionType.READY, False, failure.reason, failure.message), Phase.FAILED
    if scaled_to_zero:
        msg = "scaled to 0: " + ", ".join(scaled_to_zero) + "; nothing serves"
        phase = Phase.DEGRADED if degraded else (Phase.PROGRESSING if rolling else Phase.PENDING)
        return _cond(ConditionType.READY, False, Reason.SCALED_TO_ZERO, msg), phase
    if all(s.ready_all for s in states.values()):
        msg = "prefill, decode and router are ready"
        return _cond(ConditionType.READY, True, Reason.ALL_COMPONENTS_READY, msg), Phase.READY
    not_ready = [f"{COMPONENT_CONDITION[c]}=False" for c, s in states.items() if not s.ready_all]
    msg = "waiting for " + ", ".join(not_ready)
    phase = Phase.DEGRADED if degraded else Phase.PROGRESSING
    return _cond(ConditionType.READY, False, Reason.COMPONENTS_NOT_READY, msg), phase


def _stamp(
    conds: list[dict[str, Any]], previous: Sequence[Mapping[str, Any]], generation: int | None, now: str | None
) -> None:
    """Keep lastTransitionTime while a condition's status is unchanged; observedGeneration on every condition."""
    prev = {c.get("type"): c for c in previous}
    for c in conds:
        p = prev.get(c["type"])
        if p is not None and p.get("status") == c["status"] and p.get("lastTransitionTime"):
            c["lastTransitionTime"] = p["lastTransitionTime"]
        elif now is not None:
            c["lastTransitionTime"] = now
        if generation is not None:
            c["observedGeneration"] = generation


def transitions(
    previous: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """The Events a status change deserves (type, reason, message): Ready turning True, a new failure (reason or
    message changed), Degraded turning True or changing its reason. Nothing when nothing changed (pure)."""
    prev = {c.get("type"): c for c in previous}
    cur = {c.get("type"): c for c in current}
    out: list[tuple[str, str, str]] = []
    ready, was = cur.get(ConditionType.READY) or {}, prev.get(ConditionType.READY) or {}
    if ready.get("reason") in FAILURE_REASONS:
        if (was.get("reason"), was.get("message")) != (ready.get("reason"), ready.get("message")):
            out.append(("Warning", str(ready["reason"]), str(ready.get("message", ""))))
        return out
    if ready.get("status") == "True" and was.get("status") != "True":
        out.append(("Normal", str(ready["reason"]), str(ready.get("message", ""))))
    deg, was_deg = cur.get(ConditionType.DEGRADED) or {}, prev.get(ConditionType.DEGRADED) or {}
    new_problem = (was_deg.get("status"), was_deg.get("reason")) != ("True", deg.get("reason"))
    if deg.get("status") == "True" and deg.get("reason") in ROLE_PROBLEM_REASONS and new_problem:
        out.append(("Warning", str(deg["reason"]), str(deg.get("message", ""))))
    return out
