"""Pure: what we observe (the role Deployments) -> the CR's status (conditions, counts, endpoint, profile, rollout).

What Ready means: the endpoint can serve a request now. Every role has >= 1 desired replica, every desired replica
of every role is updated and Ready (engine pods only turn Ready after the runtime's warmup), and the Deployments
have caught up with their spec. A role scaled to 0 is reported `<Role>Ready=True, reason=ScaledToZero`, but the
CR is then `Ready=False, reason=ScaledToZero`: nothing can answer on the endpoint.

Generations (hpd_operator.generations, docs/rollouts.md): the engine conditions, counts and Ready describe the
generation the router routes to (what serves); while another generation comes up, each role condition also says
how far it is and why its pods are not Ready, Progressing says where the rollout stands (Degraded carries the new
generation's scheduling or rollout problems), and status.rollout lists every generation.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpd_operator.api.models import HybridPDDeploymentSpec
from hpd_operator.api.names import endpoint_url, selector_string
from hpd_operator.api.paircheck import pair_check
from hpd_operator.api.processns import data_path_note, pairs
from hpd_operator.conditions import (
    COMPONENT_CONDITION,
    FAILURE_REASONS,
    FALLBACK_REASONS,
    ROLE_PROBLEM_REASONS,
    ConditionType,
    Failure,
    Phase,
    Reason,
    condition,
    problem_text,
)
from hpd_operator.generations import RolloutView
from hpd_operator.profile_model import Profile
from hpd_operator.rolestate import NOT_SCHEDULED_AFTER, RoleState, role_state
from hpd_operator.rollout import Rollout
from hpd_runtime import contract

COMPONENTS: tuple[str, ...] = (*contract.ROLES, contract.COMPONENT_ROUTER)


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
            return condition(
                name, False, s.problems[0][0], f"the {comp} {s.workload} does not exist; {problem_text(s.problems)}"
            )
        return condition(name, False, Reason.MISSING, f"the {comp} {s.workload} does not exist yet")
    if s.desired == 0:
        return condition(name, True, Reason.SCALED_TO_ZERO, f"{comp} is scaled to 0 replicas")
    if s.ready_all:
        extra = f"; {problem_text(s.problems)}" if s.problems else ""
        return condition(name, True, Reason.ALL_REPLICAS_READY, f"{s.ready}/{s.desired} {comp} {s.unit} ready{extra}")
    if s.problems:
        msg = f"{s.ready}/{s.desired} {comp} {s.unit} ready; {problem_text(s.problems)}"
        return condition(name, False, s.problems[0][0], msg)
    msg = f"{s.ready}/{s.desired} {comp} {s.unit} ready, {s.updated} updated"
    return condition(name, False, Reason.REPLICAS_NOT_READY, msg)


@dataclass(frozen=True)
class Observation:
    """Everything one status is computed from: the CR, what one reconcile found and what runs now."""

    name: str
    namespace: str
    spec: HybridPDDeploymentSpec | None
    """None when the spec cannot be parsed (`failure` says why)."""
    observed: Mapping[str, Mapping[str, Any] | None]
    """prefill/decode/router -> the live workload of the routed generation (None: absent)."""
    generation: int | None
    profile: Profile | None = None
    failure: Failure | None = None
    """Why this reconcile could not converge (InvalidSpec, ApplyFailed, OwnershipConflict, ReconcileError, ...)."""
    pods: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
    """The live pods of each component (a component left out: its pods were not observed)."""
    nodes: Collection[str] | None = None
    """The names of the existing nodes (None: unknown)."""
    notes: Sequence[str] = ()
    """Extra messages for Ready (e.g. a PodMonitor skipped)."""
    previous: Sequence[Mapping[str, Any]] = ()
    """The conditions stored before: with `now`, lastTransitionTime stays put across unchanged statuses."""
    now: str | None = None
    """The caller owns the clock."""
    role_details: Mapping[str, str] | None = None
    """Role -> why its pods are not Ready (their probe output, hpd_operator.podevents), appended while not Ready."""
    not_scheduled_after: float = NOT_SCHEDULED_AFTER
    rollout: RolloutView | None = None
    """The CR's generations (the routed one is what `observed`, `pods` and `role_details` stand for)."""
    autoscalers: Mapping[str, Mapping[str, Any]] | None = None
    """Each autoscaling role's status.<role>.autoscaler (scaling.autoscaler_status)."""
    kv_path: Mapping[str, Any] | None = None
    """The newest KV path report of a Ready decode pod (podevents.kv_path): status.kvPath."""
    prefills_checked: tuple[int, int] | None = None
    """(Ready prefill pods of the routed generation every reporting Ready decode lists as pair-checked, Ready prefill
    pods), from the decodes' reports (podevents.verified_prefills); None when no report lists its peers."""
    fallback: tuple[Reason, str, str] | None = None
    """Degraded mode (hpd_operator.builders.fallback): reason, message, status.serving."""


def compute_status(obs: Observation) -> dict[str, Any]:
    """The whole `status` (camelCase) for one CR, from one observation (pure)."""
    spec, failure, fallback = obs.spec, obs.failure, obs.fallback
    gens = None
    if obs.rollout is not None:
        gens = Rollout.of(spec, obs.rollout, obs.nodes, obs.now, obs.not_scheduled_after, failure=failure)
    states = _states(
        spec, obs.observed, obs.pods or {}, obs.nodes, obs.now, not_scheduled_after=obs.not_scheduled_after
    )
    details = dict(obs.role_details or {})
    if gens is not None:
        states.update(gens.serving)
        details.update(gens.serving_details)
    conds = [_role_condition(comp, states[comp], details.get(comp)) for comp in COMPONENTS]
    conds.append(_warmup_condition(spec, states))
    conds.append(_data_path_condition(spec, states["decode"], details.get("decode"), obs.kv_path, obs.prefills_checked))
    conds.append(_profile_condition(obs.profile, failure))
    conds += _progress_conditions(states, failure, fallback)
    if gens is not None:
        gens.annotate(conds, failure)
    ready, phase = _ready_condition(states, failure, fallback)
    if obs.notes:
        ready["message"] += "; " + "; ".join(obs.notes)
    conds.insert(0, ready)
    _stamp(conds, obs.previous, obs.generation, obs.now)

    out: dict[str, Any] = {"phase": str(phase), "conditions": conds, **_serving(spec, failure, fallback)}
    if obs.generation is not None:
        out["observedGeneration"] = obs.generation
    paired = obs.spec is not None and pairs(obs.spec.kv_transfer)
    for comp in COMPONENTS:
        out[comp] = _component_status(obs.name, comp, states[comp], gens, (obs.autoscalers or {}).get(comp))
        if paired and comp in contract.ROLES:  # the scale subresource's selector: the pods that run the role
            out[comp]["selector"] = selector_string(obs.name, contract.COMPONENT_PAIR)
    return _rest(out, obs, gens)


def _rest(out: dict[str, Any], obs: Observation, gens: Rollout | None) -> dict[str, Any]:
    """The endpoint, the profile, the rollout and status.kvPath."""
    if obs.kv_path:
        out["kvPath"] = dict(obs.kv_path)
    port = obs.spec.router.service.port if obs.spec is not None else None
    if port is not None:
        out["endpoint"] = endpoint_url(obs.name, obs.namespace, port)
    if obs.profile is not None:
        out["profile"] = obs.profile.status()
    if gens is not None:
        out["rollout"] = gens.status()
    return out


def _component_status(
    name: str, comp: str, s: RoleState, gens: Rollout | None, scaler: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Counts of what serves; with generations, `replicas` counts the role's pods of every generation and
    `updatedReplicas` those of the spec's generation (as a Deployment's status does during a rolling update); an
    autoscaling role's report of its autoscaler (the serving generation's HPA)."""
    replicas, updated = s.replicas, s.updated
    if gens is not None and comp in contract.ROLES:
        replicas = sum(states[comp].replicas for states in gens.all.values())
        target = gens.all.get(gens.plan.desired.hash)
        updated = target[comp].updated if target is not None else 0
    out: dict[str, Any] = {
        "replicas": replicas,
        "readyReplicas": s.ready,
        "updatedReplicas": updated,
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
    *,
    not_scheduled_after: float = NOT_SCHEDULED_AFTER,
) -> dict[str, RoleState]:
    out: dict[str, RoleState] = {}
    for comp in COMPONENTS:
        dep = observed.get(comp)
        size = 1
        if spec is None:
            desired = int((dep or {}).get("spec", {}).get("replicas") or 0)
        elif comp == contract.COMPONENT_ROUTER:
            desired = spec.router.replicas
        elif spec.replicas_autoscaling(comp) is not None and dep is not None:  # type: ignore[arg-type]
            desired = int((dep.get("spec") or {}).get("replicas") or 0)  # the autoscaler's choice
        else:
            desired = spec.role(comp).replicas  # type: ignore[arg-type]
            size = spec.role(comp).nodes_per_replica  # type: ignore[arg-type]
        # a component left out of `pods`: its pods were not observed
        out[comp] = role_state(
            desired,
            dep,
            pods.get(comp),
            nodes,
            now,
            not_scheduled_after=not_scheduled_after,
            surges=comp == contract.COMPONENT_ROUTER,
            expected_group_size=size,
        )
    return out


def _warmup_condition(spec: HybridPDDeploymentSpec | None, states: Mapping[str, RoleState]) -> dict[str, str]:
    engines = [states[r] for r in contract.ROLES]
    if spec is not None and not spec.warmup.enabled:
        return condition(ConditionType.WARMED_UP, True, Reason.WARMUP_DISABLED, "spec.warmup.enabled is false")
    if all(s.ready_all for s in engines):
        msg = "every engine replica passed its warmup (/readyz)"
        return condition(ConditionType.WARMED_UP, True, Reason.ALL_ENGINES_WARM, msg)
    waiting = sum(max(s.desired - s.ready, 0) for s in engines)
    msg = f"{waiting} engine replica(s) not warm (not Ready) yet"
    return condition(ConditionType.WARMED_UP, False, Reason.WARMUP_PENDING, msg)


def _data_path_condition(
    spec: HybridPDDeploymentSpec | None,
    decode: RoleState,
    detail: str | None,
    kv: Mapping[str, Any] | None = None,
    prefills: tuple[int, int] | None = None,
) -> dict[str, str]:
    """Whether P->D is proven now. Decode is Ready only after its pair check with every Ready prefill and stays Ready
    only while its canary passes, so Ready decode replicas are the proof. `kv`: the newest KV path report of a Ready
    decode (status.kvPath); below the fabric's floor the condition stays True with reason KVPathBelowFloor (a Warning
    Event on the transition): the path answers correctly, slowly. `prefills`: (verified, Ready) prefill pods from the
    decodes' reports: a prefill that turned Ready after decode did is checked at decode's next re-check, and until
    then the message counts them instead of claiming every Ready prefill (the status stays True)."""
    ctype = ConditionType.DATA_PATH_VERIFIED
    if spec is None:
        return condition(ctype, None, Reason.UNKNOWN, "the spec is not valid")
    check, fabric = pair_check(spec.warmup), spec.kv_transfer
    if not check.on:
        return condition(ctype, None, Reason.PAIR_CHECK_DISABLED, "spec.warmup.pairCheck (or warmup) is off: P->D is "
                     "not verified before traffic")  # fmt: skip
    canary = check.canary
    if decode.desired > 0 and decode.ready_all:
        measured = f"pod {kv['pod']}: {kv.get('message')}" if kv else "decode's /readyz names the measured rate"
        paired = pairs(fabric)
        with_ = "the prefill of its own pair pod" if paired else "every Ready prefill"
        if prefills is not None and prefills[0] < prefills[1]:
            what = "pair pods' prefills" if paired else "Ready prefill pods"
            with_ = f"{prefills[0]} of {prefills[1]} {what} (the rest at decode's next re-check)"
        msg = (f"{decode.ready}/{decode.desired} decode replica(s) verified P->D with {with_}; {canary}; "
               f"KV over fabric {fabric.fabric} ({measured})")  # fmt: skip
        if note := data_path_note(fabric):
            msg += f"; {note}"
        slow = bool(kv and kv.get("belowFloor"))
        return condition(ctype, True, Reason.KV_PATH_BELOW_FLOOR if slow else Reason.DATA_PATH_VERIFIED, msg)
    msg = f"{decode.ready}/{decode.desired} decode replica(s) verified P->D; {canary}"
    return condition(ctype, False, Reason.DATA_PATH_UNVERIFIED, msg + (f": {detail}" if detail else ""))


def _profile_condition(profile: Profile | None, failure: Failure | None) -> dict[str, str]:
    ctype = ConditionType.HYBRID_PROFILE_APPLIED
    if failure is not None and failure.reason == Reason.INVALID_SPEC:
        return condition(ctype, False, Reason.INVALID_SPEC, failure.message)
    if profile is None:
        return condition(ctype, None, Reason.UNKNOWN, "the profile was not computed")
    kind = "hybrid Mamba2/attention" if profile.hybrid else "attention-only"
    return condition(
        ctype,
        True,
        Reason.HYBRID if profile.hybrid else Reason.ATTENTION_ONLY,
        f"{kind} profile for vLLM {profile.vllm_version} (row {profile.row}): {profile.hybrid_reason}",
    )


def _serving(
    spec: HybridPDDeploymentSpec | None, failure: Failure | None, fallback: tuple[Reason, str, str] | None
) -> dict[str, str]:
    """status.serving: `router`, or degraded mode's `colocated on <role>` (`fallback`: reason, message, serving)."""
    if spec is None or failure is not None:
        return {}
    return {"serving": fallback[2] if fallback is not None else "router"}


def _progress_conditions(
    states: Mapping[str, RoleState], failure: Failure | None, fallback: tuple[Reason, str, str] | None = None
) -> list[dict[str, str]]:
    """Progressing and Degraded. `fallback`: degraded mode (hpd_operator.builders.fallback) as (reason, message,
    status.serving) while the endpoint serves colocated: Degraded=True with its reason, the problems after it."""
    rolling = [c for c, s in states.items() if s.rolling]
    if failure is not None and failure.reason == Reason.INVALID_SPEC:
        msg = "the spec is rejected; children are left as they were"
        progressing = condition(ConditionType.PROGRESSING, False, Reason.INVALID_SPEC, msg)
    elif failure is not None:
        progressing = condition(ConditionType.PROGRESSING, False, failure.reason, "the last reconcile did not complete")
    elif rolling:
        progressing = condition(
            ConditionType.PROGRESSING, True, Reason.ROLLING_OUT, "rolling out: " + ", ".join(rolling)
        )
    else:
        progressing = condition(ConditionType.PROGRESSING, False, Reason.STABLE, "every component matches the spec")
    problems = [(r, f"{c}: {m}") for c, s in states.items() for r, m in s.problems]
    if failure is not None and failure.reason != Reason.INVALID_SPEC:
        problems.insert(0, (failure.reason, failure.message))
    if fallback is not None and failure is None:
        reason, message, _ = fallback
        degraded = condition(ConditionType.DEGRADED, True, reason, "; ".join([message, *(m for _, m in problems)]))
    elif problems:
        degraded = condition(ConditionType.DEGRADED, True, problems[0][0], "; ".join(m for _, m in problems))
    else:
        degraded = condition(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "no component is failing")
    return [progressing, degraded]


def _ready_condition(
    states: Mapping[str, RoleState], failure: Failure | None, fallback: tuple[Reason, str, str] | None = None
) -> tuple[dict[str, str], Phase]:
    """Ready and the phase (Degraded while degraded mode serves colocated: `fallback`)."""
    degraded = any(s.problems for s in states.values()) or fallback is not None
    rolling = any(s.rolling for s in states.values())
    scaled_to_zero = [c for c, s in states.items() if s.desired == 0]
    if failure is not None:
        return condition(ConditionType.READY, False, failure.reason, failure.message), Phase.FAILED
    if scaled_to_zero:
        msg = "scaled to 0: " + ", ".join(scaled_to_zero) + "; nothing serves"
        phase = Phase.DEGRADED if degraded else (Phase.PROGRESSING if rolling else Phase.PENDING)
        return condition(ConditionType.READY, False, Reason.SCALED_TO_ZERO, msg), phase
    if all(s.ready_all for s in states.values()):
        msg = "prefill, decode and router are ready"
        return condition(ConditionType.READY, True, Reason.ALL_COMPONENTS_READY, msg), Phase.READY
    not_ready = [f"{COMPONENT_CONDITION[c]}=False" for c, s in states.items() if not s.ready_all]
    msg = "waiting for " + ", ".join(not_ready)
    phase = Phase.DEGRADED if degraded else Phase.PROGRESSING
    return condition(ConditionType.READY, False, Reason.COMPONENTS_NOT_READY, msg), phase


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
    path, was_path = cur.get(ConditionType.DATA_PATH_VERIFIED) or {}, prev.get(ConditionType.DATA_PATH_VERIFIED) or {}
    if path.get("reason") == Reason.KV_PATH_BELOW_FLOOR and was_path.get("reason") != Reason.KV_PATH_BELOW_FLOOR:
        out.append(("Warning", str(path["reason"]), str(path.get("message", ""))))
    deg, was_deg = cur.get(ConditionType.DEGRADED) or {}, prev.get(ConditionType.DEGRADED) or {}
    new_problem = (was_deg.get("status"), was_deg.get("reason")) != ("True", deg.get("reason"))
    if deg.get("status") == "True" and deg.get("reason") in ROLE_PROBLEM_REASONS | FALLBACK_REASONS and new_problem:
        out.append(("Warning", str(deg["reason"]), str(deg.get("message", ""))))
    if was_deg.get("reason") in FALLBACK_REASONS and deg.get("reason") not in FALLBACK_REASONS:
        out.append(("Normal", str(Reason.PD_RESTORED), "serving through the router again: prefill and decode Ready"))
    return out
