"""Pure: what we observe (the role Deployments) -> the CR's status (conditions, counts, endpoint, profile).

What Ready means: the endpoint can serve a request now. Every role has >= 1 desired replica, every desired replica
of every role is updated and Ready (engine pods only turn Ready after the runtime's warmup), and the Deployments
have caught up with their spec. A role scaled to 0 is reported `<Role>Ready=True, reason=ScaledToZero`, but the
CR is then `Ready=False, reason=ScaledToZero`: nothing can answer on the endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpd_operator.api.models import HybridPDDeploymentSpec
from hpd_operator.builders import endpoint_url, selector_string
from hpd_operator.errors import SpecError
from hpd_operator.profile import Profile
from hpd_runtime import contract

COMPONENTS: tuple[str, ...] = (*contract.ROLES, contract.COMPONENT_ROUTER)
_COND_NAME = {"prefill": "PrefillReady", "decode": "DecodeReady", contract.COMPONENT_ROUTER: "RouterReady"}


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
    failure: str | None
    """Why the rollout is stuck (ProgressDeadlineExceeded, ReplicaFailure), if it is."""

    @property
    def ready_all(self) -> bool:
        return self.exists and self.caught_up and self.ready >= self.desired and self.updated >= self.desired

    @property
    def rolling(self) -> bool:
        return not self.ready_all or self.replicas > self.desired


def role_state(desired: int, deployment: Mapping[str, Any] | None) -> RoleState:
    if deployment is None:
        return RoleState(desired, 0, 0, 0, 0, False, False, None)
    md, sp, st = deployment.get("metadata", {}), deployment.get("spec", {}), deployment.get("status") or {}
    caught_up = st.get("observedGeneration", 0) >= md.get("generation", 1) and sp.get("replicas", 1) == desired
    failure = None
    for c in st.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("status") == "False":
            failure = f"{c.get('reason')}: {c.get('message', '')}"
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            failure = f"{c.get('reason')}: {c.get('message', '')}"
    return RoleState(
        desired=desired,
        replicas=int(st.get("replicas") or 0),
        ready=int(st.get("readyReplicas") or 0),
        updated=int(st.get("updatedReplicas") or 0),
        available=int(st.get("availableReplicas") or 0),
        exists=True,
        caught_up=caught_up,
        failure=failure,
    )


def _cond(ctype: str, ok: bool | None, reason: str, message: str) -> dict[str, str]:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    return {"type": ctype, "status": status, "reason": reason, "message": message}


def _role_condition(comp: str, s: RoleState, detail: str | None = None) -> dict[str, str]:
    """`detail`: why a pod of the role is not Ready, from its probe Events (hpd_operator.podevents)."""
    cond = _role_condition_plain(comp, s)
    if detail and cond["status"] != "True":
        cond["message"] += f"; {detail}"
    return cond


def _role_condition_plain(comp: str, s: RoleState) -> dict[str, str]:
    name = _COND_NAME[comp]
    if not s.exists:
        return _cond(name, False, "Missing", f"the {comp} Deployment does not exist yet")
    if s.desired == 0:
        return _cond(name, True, "ScaledToZero", f"{comp} is scaled to 0 replicas")
    if s.ready_all:
        return _cond(name, True, "AllReplicasReady", f"{s.ready}/{s.desired} {comp} replicas ready")
    if s.failure:
        return _cond(name, False, "RolloutFailed", f"{s.ready}/{s.desired} {comp} replicas ready; {s.failure}")
    return _cond(name, False, "ReplicasNotReady", f"{s.ready}/{s.desired} {comp} replicas ready, {s.updated} updated")


def compute_status(
    *,
    name: str,
    namespace: str,
    spec: HybridPDDeploymentSpec | None,
    observed: Mapping[str, Mapping[str, Any] | None],
    generation: int | None,
    profile: Profile | None = None,
    error: SpecError | None = None,
    notes: Sequence[str] = (),
    previous: Sequence[Mapping[str, Any]] = (),
    now: str | None = None,
    role_details: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The whole `status` (camelCase) for one CR.

    `observed` maps prefill/decode/router to the live Deployment (None if absent). `spec` is None when the spec
    cannot be parsed; then `error` says why. `notes` are extra messages (e.g. a PodMonitor skipped). `previous`
    conditions and `now` keep lastTransitionTime stable across unchanged statuses (the caller owns the clock).
    `role_details` maps a role to why its pods are not Ready (their probe output, hpd_operator.podevents); it is
    appended to that role's condition message while the role is not Ready.
    """
    desired: dict[str, int] = {}
    for comp in COMPONENTS:
        if spec is not None:
            desired[comp] = spec.router.replicas if comp == contract.COMPONENT_ROUTER else spec.role(comp).replicas  # type: ignore[arg-type]
        else:
            dep = observed.get(comp)
            desired[comp] = int((dep or {}).get("spec", {}).get("replicas") or 0)
    states = {comp: role_state(desired[comp], observed.get(comp)) for comp in COMPONENTS}

    details = role_details or {}
    conds = [_role_condition(comp, states[comp], details.get(comp)) for comp in COMPONENTS]
    engines = [states[r] for r in contract.ROLES]
    warm_on = spec.warmup.enabled if spec is not None else True
    if not warm_on:
        conds.append(_cond("WarmedUp", True, "WarmupDisabled", "spec.warmup.enabled is false"))
    elif all(s.ready_all for s in engines):
        conds.append(_cond("WarmedUp", True, "AllEnginesWarm", "every engine replica passed its warmup (/readyz)"))
    else:
        waiting = sum(max(s.desired - s.ready, 0) for s in engines)
        conds.append(_cond("WarmedUp", False, "WarmupPending", f"{waiting} engine replica(s) not warm (not Ready) yet"))

    if error is not None:
        conds.append(_cond("HybridProfileApplied", False, "InvalidSpec", error.message))
    elif profile is not None:
        kind = "hybrid Mamba2/attention" if profile.hybrid else "attention-only"
        conds.append(
            _cond(
                "HybridProfileApplied",
                True,
                "Hybrid" if profile.hybrid else "AttentionOnly",
                f"{kind} profile for vLLM {profile.vllm_version} (row {profile.row}): {profile.hybrid_reason}",
            )
        )
    else:
        conds.append(_cond("HybridProfileApplied", None, "Unknown", "the profile was not computed"))

    failures = [f"{c}: {s.failure}" for c, s in states.items() if s.failure]
    rolling = [c for c, s in states.items() if s.rolling]
    degraded = bool(failures)
    if error is not None:
        conds.append(_cond("Progressing", False, "InvalidSpec", "the spec is rejected; children are left as they were"))
    elif rolling:
        conds.append(_cond("Progressing", True, "RollingOut", "rolling out: " + ", ".join(rolling)))
    else:
        conds.append(_cond("Progressing", False, "Stable", "every component matches the spec"))
    if degraded:
        conds.append(_cond("Degraded", True, "RolloutFailed", "; ".join(failures)))
    else:
        conds.append(_cond("Degraded", False, "AsExpected", "no component is failing"))

    scaled_to_zero = [c for c in COMPONENTS if desired[c] == 0]
    if error is not None:
        ready = _cond("Ready", False, "InvalidSpec", error.message)
        phase = "Failed"
    elif scaled_to_zero:
        ready = _cond("Ready", False, "ScaledToZero", "scaled to 0: " + ", ".join(scaled_to_zero) + "; nothing serves")
        phase = "Degraded" if degraded else ("Progressing" if rolling else "Pending")
    elif all(s.ready_all for s in states.values()):
        ready = _cond("Ready", True, "AllComponentsReady", "prefill, decode and router are ready")
        phase = "Ready"
    else:
        not_ready = [
            f"{_COND_NAME[c]}={'True' if s.ready_all else 'False'}" for c, s in states.items() if not s.ready_all
        ]
        ready = _cond("Ready", False, "ComponentsNotReady", "waiting for " + ", ".join(not_ready))
        phase = "Degraded" if degraded else "Progressing"
    if notes:
        ready["message"] += "; " + "; ".join(notes)
    conds.insert(0, ready)

    prev = {c.get("type"): c for c in previous}
    for c in conds:
        p = prev.get(c["type"])
        if p is not None and p.get("status") == c["status"] and p.get("lastTransitionTime"):
            c["lastTransitionTime"] = p["lastTransitionTime"]
        elif now is not None:
            c["lastTransitionTime"] = now
        if generation is not None:
            c["observedGeneration"] = generation  # type: ignore[assignment]

    out: dict[str, Any] = {"phase": phase, "conditions": conds}
    if generation is not None:
        out["observedGeneration"] = generation
    for comp in COMPONENTS:
        s = states[comp]
        out[comp] = {
            "replicas": s.replicas,
            "readyReplicas": s.ready,
            "updatedReplicas": s.updated,
            "summary": f"{s.ready}/{s.desired}",
            "selector": selector_string(name, comp),
        }
    port = spec.router.service.port if spec is not None else None
    if port is not None:
        out["endpoint"] = endpoint_url(name, namespace, port)
    if profile is not None:
        out["profile"] = profile.status()
    return out
