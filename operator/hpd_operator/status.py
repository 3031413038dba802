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

import datetime
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpd_operator.api.models import HybridPDDeploymentSpec
from hpd_operator.api.names import endpoint_url, selector_string
from hpd_operator.api.paircheck import pair_check
from hpd_operator.conditions import (
    COMPONENT_CONDITION,
    FAILURE_REASONS,
    FALLBACK_REASONS,
    ROLE_PROBLEM_REASONS,
    ConditionType,
    Failure,
    Phase,
    Reason,
)
from hpd_operator.errors import SpecError
from hpd_operator.generations import LiveGeneration, Plan, RolloutView
from hpd_operator.profile_model import Profile
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
    surges: bool = False
    """The router: its Deployment surges (maxUnavailable 0), so while it rolls (a generation switch, a router
    update) its Ready pods of either template serve: Ready when as many pods as desired are Ready, whichever
    template they run; the roll itself shows in `rolling` (Progressing)."""
    group_size: int = 1
    """Pods per replica: > 1 for a role whose replicas span nodes (a LeaderWorkerSet; the counts are groups)."""

    @property
    def workload(self) -> str:
        return "LeaderWorkerSet" if self.group_size > 1 else "Deployment"

    @property
    def unit(self) -> str:
        """What the counts in a message count."""
        return f"replicas (groups of {self.group_size} pods)" if self.group_size > 1 else "replicas"

    @property
    def ready_all(self) -> bool:
        if self.surges:
            return self.exists and self.ready >= self.desired
        return self.exists and self.caught_up and self.ready >= self.desired and self.updated >= self.desired

    @property
    def rolling(self) -> bool:
        settled = self.caught_up and self.updated >= self.desired
        return not self.ready_all or self.replicas > self.desired or not settled


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


def parse_time(value: object) -> datetime.datetime | None:
    """An RFC 3339 time of the apiserver (`2026-12-01T10:00:00Z`), None when absent or malformed."""
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
    t0, t1 = parse_time(md.get("creationTimestamp")), parse_time(now)
    return None if t0 is None or t1 is None else max((t1 - t0).total_seconds(), 0.0)


def next_pod_check(
    pods: Iterable[Mapping[str, Any]], now: str | None, after: float = NOT_SCHEDULED_AFTER
) -> float | None:
    """Seconds until the next unbound, unjudged pod has waited `after` seconds (no event announces that moment)."""
    waits = [after - a for p in pods if (a := unlooked_age(p, now)) is not None]
    waits = [w for w in waits if w > 0]
    return min(waits) + 1.0 if waits else None


def pod_problems(
    pods: Sequence[Mapping[str, Any]],
    nodes: Collection[str] | None,
    now: str | None = None,
    not_scheduled_after: float = NOT_SCHEDULED_AFTER,
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
        if age is not None and age >= not_scheduled_after:
            sched = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
            out.append((Reason.NOT_SCHEDULED, f"pod {md.get('name')} has waited {age:.0f} s and no scheduler has "
                        f"looked at it: is the scheduler {sched!r} running (podTemplate.spec.schedulerName)?"))  # fmt: skip
        node = (pod.get("spec") or {}).get("nodeName")
        if node and nodes is not None and node not in nodes:
            out.append((Reason.NODE_LOST, f"pod {md.get('name')} is bound to node {node}, which no longer exists"))
            lost_ready += _pod_ready(pod)
    return out, lost_ready


def ready_count(st: Mapping[str, Any], pods: Sequence[Mapping[str, Any]] | None, groups: bool = False) -> int:
    """The Deployment's (LeaderWorkerSet's: `groups`) readyReplicas, but never more than the Ready pods (group
    leaders) seen (`pods` None: not observed). The controller lowers its count only after a pod is gone: a status
    computed from the pod's delete event in between would count the deleted pod as Ready (seen: Ready=True with no
    decode pod Ready after a node loss)."""
    ready = int(st.get("readyReplicas") or 0)
    if pods is None:
        return ready
    if groups:
        pods = [p for p in pods if _labels(p).get(contract.LABEL_GROUP_ROLE) == contract.GROUP_LEADER]
    seen = sum(1 for p in pods if _pod_ready(p) and not (p.get("metadata") or {}).get("deletionTimestamp"))
    return min(ready, seen)


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def group_size(workload: Mapping[str, Any] | None) -> int:
    """Pods per replica of a LeaderWorkerSet (1 for a Deployment or nothing)."""
    if workload is None or workload.get("kind") != "LeaderWorkerSet":
        return 1
    return int(((workload.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size") or 1)


def role_state(
    desired: int,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]] | None = None,
    nodes: Collection[str] | None = None,
    now: str | None = None,
    *,
    not_scheduled_after: float = NOT_SCHEDULED_AFTER,
    surges: bool = False,
    expected_group_size: int = 1,
) -> RoleState:
    """The role from its Deployment or LeaderWorkerSet (`deployment`; counts are then groups, not pods) and its
    pods; `expected_group_size`: the spec's pods per replica, for a workload that does not exist yet."""
    problems, lost_ready = pod_problems(pods or (), nodes, now, not_scheduled_after)
    if deployment is None:
        return RoleState(desired, 0, 0, 0, 0, False, False, tuple(problems), surges, expected_group_size)
    md, sp, st = deployment.get("metadata", {}), deployment.get("spec", {}), deployment.get("status") or {}
    caught_up = st.get("observedGeneration", 0) >= md.get("generation", 1) and sp.get("replicas", 1) == desired
    size = group_size(deployment)
    ready = max(ready_count(st, pods, groups=size > 1) - lost_ready, 0)
    return RoleState(
        desired=desired,
        replicas=int(st.get("replicas") or 0),
        ready=ready,
        updated=int(st.get("updatedReplicas") or 0),
        available=int(st.get("availableReplicas") or 0) if size == 1 else ready,
        exists=True,
        caught_up=caught_up,
        problems=tuple(_deployment_problems(st) + problems),
        surges=surges,
        group_size=size,
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
                name, False, s.problems[0][0], f"the {comp} {s.workload} does not exist; {_problem_text(s.problems)}"
            )
        return _cond(name, False, Reason.MISSING, f"the {comp} {s.workload} does not exist yet")
    if s.desired == 0:
        return _cond(name, True, Reason.SCALED_TO_ZERO, f"{comp} is scaled to 0 replicas")
    if s.ready_all:
        extra = f"; {_problem_text(s.problems)}" if s.problems else ""
        return _cond(name, True, Reason.ALL_REPLICAS_READY, f"{s.ready}/{s.desired} {comp} {s.unit} ready{extra}")
    if s.problems:
        msg = f"{s.ready}/{s.desired} {comp} {s.unit} ready; {_problem_text(s.problems)}"
        return _cond(name, False, s.problems[0][0], msg)
    msg = f"{s.ready}/{s.desired} {comp} {s.unit} ready, {s.updated} updated"
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
    not_scheduled_after: float = NOT_SCHEDULED_AFTER,
    rollout: RolloutView | None = None,
    autoscalers: Mapping[str, Mapping[str, Any]] | None = None,
    kv_path: Mapping[str, Any] | None = None,
    fallback: tuple[Reason, str, str] | None = None,
) -> dict[str, Any]:
    """The whole `status` (camelCase) for one CR.

    `observed` maps prefill/decode/router to the live Deployment (None if absent), `pods` to the live pods of each
    component, `nodes` is the set of existing node names (None = unknown). `spec` is None when the spec cannot be
    parsed; then `error` says why. `failure` is why this reconcile could not converge (InvalidSpec, ApplyFailed,
    OwnershipConflict, ReconcileError); `error` is shorthand for an InvalidSpec failure. `notes` are extra messages
    (e.g. a PodMonitor skipped). `previous` conditions and `now` keep lastTransitionTime stable across unchanged
    statuses (the caller owns the clock). `role_details` maps a role to why its pods are not Ready (their probe
    output, hpd_operator.podevents); it is appended to that role's condition message while the role is not Ready.
    `rollout`: the CR's generations (the one the router routes to is what `observed`, `pods` and `role_details`
    stand for). `autoscalers`: each autoscaling role's status.<role>.autoscaler (scaling.autoscaler_status)."""
    failure = failure if failure is not None or error is None else Failure(Reason.INVALID_SPEC, error.message)
    wait = not_scheduled_after
    gens = _Generations.of(spec, rollout, nodes, now, wait, failure=failure) if rollout is not None else None
    states = _states(spec, observed, pods or {}, nodes, now, not_scheduled_after=wait)
    details = dict(role_details or {})
    if gens is not None:
        states.update(gens.serving)
        details.update(gens.serving_details)
    conds = [_role_condition(comp, states[comp], details.get(comp)) for comp in COMPONENTS]
    conds.append(_warmup_condition(spec, states))
    conds.append(_data_path_condition(spec, states["decode"], details.get("decode"), kv_path))
    conds.append(_profile_condition(profile, failure))
    conds += _progress_conditions(states, failure, fallback)
    if gens is not None:
        gens.annotate(conds, failure)
    ready, phase = _ready_condition(states, failure, fallback)
    if notes:
        ready["message"] += "; " + "; ".join(notes)
    conds.insert(0, ready)
    _stamp(conds, previous, generation, now)

    out: dict[str, Any] = {"phase": str(phase), "conditions": conds, **_serving(spec, failure, fallback)}
    if generation is not None:
        out["observedGeneration"] = generation
    for comp in COMPONENTS:
        out[comp] = _component_status(name, comp, states[comp], gens, (autoscalers or {}).get(comp))
    return _rest(out, name=name, namespace=namespace, spec=spec, profile=profile, gens=gens, kv_path=kv_path)


def _rest(
    out: dict[str, Any],
    *,
    name: str,
    namespace: str,
    spec: HybridPDDeploymentSpec | None,
    profile: Profile | None,
    gens: _Generations | None,
    kv_path: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The endpoint, the profile, the rollout and status.kvPath (`kv_path`: the newest KV path report of a Ready
    decode pod, podevents.kv_path)."""
    if kv_path:
        out["kvPath"] = dict(kv_path)
    port = spec.router.service.port if spec is not None else None
    if port is not None:
        out["endpoint"] = endpoint_url(name, namespace, port)
    if profile is not None:
        out["profile"] = profile.status()
    if gens is not None:
        out["rollout"] = gens.status()
    return out


def _component_status(
    name: str, comp: str, s: RoleState, gens: _Generations | None, scaler: Mapping[str, Any] | None = None
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


# --- generations -----------------------------------------------------------------------------------------------------
def generation_desired(
    spec: HybridPDDeploymentSpec | None, g: LiveGeneration | None, desired_hash: str
) -> dict[str, int]:
    """Desired replicas per role of a generation: the spec's for the generation it asks for, the generation's own
    Deployments' for any other (it is left as it was built)."""
    if spec is not None and (g is None or g.hash == desired_hash):
        return {r: _spec_replicas(spec, g, r) for r in contract.ROLES}
    return {r: g.replicas(r) if g is not None else 0 for r in contract.ROLES}


def _spec_replicas(spec: HybridPDDeploymentSpec, g: LiveGeneration | None, role: contract.Role) -> int:
    """What the spec asks of a role of its own generation: spec.<role>.replicas, or for an autoscaling role the count
    its Deployment runs (its HPA's choice; while the generation is not serving yet, the serving generation's count the
    operator starts it at: docs/autoscaling.md)."""
    if spec.role(role).autoscaling is not None and g is not None and role in g.deployments:
        return g.replicas(role)
    return spec.role(role).replicas


def generation_states(
    g: LiveGeneration | None,
    desired: Mapping[str, int],
    nodes: Collection[str] | None,
    now: str | None,
    *,
    not_scheduled_after: float = NOT_SCHEDULED_AFTER,
    sizes: Mapping[str, int] | None = None,
) -> dict[str, RoleState]:
    """Each role's state in generation `g` (its Deployment or LeaderWorkerSet and its pods); `sizes`: pods per
    replica as the spec has them, for a workload that does not exist yet."""
    return {
        r: role_state(
            desired[r],
            g.deployments.get(r) if g else None,
            g.pods[r] if g else [],
            nodes,
            now,
            not_scheduled_after=not_scheduled_after,
            expected_group_size=(sizes or {}).get(r, 1),
        )
        for r in contract.ROLES
    }


def generation_ready(
    g: LiveGeneration, desired: Mapping[str, int], nodes: Collection[str] | None = None, now: str | None = None
) -> bool:
    """Every desired replica of both roles Ready (a decode pod is Ready only after its pair check against its own
    generation's prefill pods): the generation may take traffic."""
    return all(s.ready_all for s in generation_states(g, desired, nodes, now).values())


def generation_answering(
    g: LiveGeneration, desired: Mapping[str, int], nodes: Collection[str] | None = None, now: str | None = None
) -> bool:
    """At least one Ready pod of each role: the generation can answer a request now (vllm-router's readiness)."""
    return all(s.ready > 0 for s in generation_states(g, desired, nodes, now).values())


GPU_RESOURCE = "nvidia.com/gpu"


def _gpus(spec: HybridPDDeploymentSpec | None, replicas: Mapping[str, int]) -> int:
    """GPUs one generation asks for: per replica the role's GPU limit times its pods (a replica that spans nodes has
    one pod per node), else its TP x PP size; times its desired replicas."""
    if spec is None:
        return 0
    total = 0
    for r in contract.ROLES:
        rs = spec.role(r)
        limit = (rs.resources.limits or {}).get(GPU_RESOURCE) if rs.resources is not None else None
        per_pod = int(limit) if isinstance(limit, int | str) and str(limit).isdigit() else None
        total += replicas[r] * (per_pod * rs.nodes_per_replica if per_pod is not None else rs.gpus_per_replica)
    return total


@dataclass(frozen=True)
class _Generations:
    """The role states of every generation and where the rollout stands (see the module doc)."""

    spec: HybridPDDeploymentSpec | None
    view: RolloutView
    all: dict[str, dict[str, RoleState]]
    """Generation hash -> role -> state: every live generation, and the planned ones even before they exist."""
    failure: Failure | None = None
    """Why this reconcile did not converge: while the desired generation's workloads do not exist, it is Blocked
    by this (the apiserver's refusal, LeaderWorkerSet missing), not Starting or Serving."""

    @classmethod
    def of(
        cls,
        spec: HybridPDDeploymentSpec | None,
        view: RolloutView,
        nodes: Collection[str] | None,
        now: str | None,
        not_scheduled_after: float = NOT_SCHEDULED_AFTER,
        *,
        failure: Failure | None = None,
    ) -> _Generations:
        want, wait = view.plan.desired.hash, not_scheduled_after
        sizes: dict[str, int] | None = None
        if spec is not None:
            sizes = {r: spec.role(r).nodes_per_replica for r in contract.ROLES}

        def states_of(h: str, g: LiveGeneration | None) -> dict[str, RoleState]:
            return generation_states(g, generation_desired(spec, g, want), nodes, now, not_scheduled_after=wait,
                                     sizes=sizes if h == want else None)  # fmt: skip

        states = {h: states_of(h, g) for h, g in view.live.generations.items()}
        for gen in (view.plan.desired, view.plan.route):
            if gen.hash not in states:
                states[gen.hash] = states_of(gen.hash, None)
        return cls(spec, view, states, failure)

    @property
    def plan(self) -> Plan:
        return self.view.plan

    @property
    def serving(self) -> dict[str, RoleState]:
        return self.all[self.plan.route.hash]

    @property
    def serving_details(self) -> dict[str, str]:
        return {r: d for r in contract.ROLES if (d := self.view.details.get((self.plan.route.hash, r)))}

    @property
    def draining(self) -> list[str]:
        return sorted(set(self.view.live.generations) - {self.plan.desired.hash, self.plan.route.hash})

    def number(self, h: str) -> int:
        for gen in (self.plan.desired, self.plan.route):
            if gen.hash == h:
                return gen.number
        g = self.view.live.generations.get(h)
        return g.number or 0 if g is not None else 0

    def name(self, h: str) -> str:
        return f"generation {self.number(h)} ({h})"

    @property
    def refused(self) -> bool:
        """The desired generation lacks a workload of a role and this reconcile failed (not on the spec itself): the
        apiserver refused it, or LeaderWorkerSet is not installed. Nothing of it runs, so it neither serves nor starts."""
        if self.failure is None or self.failure.reason == Reason.INVALID_SPEC:
            return False
        g = self.view.live.generations.get(self.plan.desired.hash)
        return g is None or any(r not in g.deployments for r in contract.ROLES)

    def target_problems(self) -> list[tuple[Reason, str]]:
        if not self.plan.rolling:
            return []
        t, name = self.all[self.plan.desired.hash], self.name(self.plan.desired.hash)
        return [(r, f"{name} {role}: {m}") for role in contract.ROLES for r, m in t[role].problems]

    @property
    def state(self) -> str:
        if self.refused:
            return "Blocked"
        if not self.plan.rolling:
            others = set(self.view.live.generations) - {self.plan.desired.hash}
            return "Switching" if others else "Complete"
        return "Blocked" if self.target_problems() else "Starting"

    def target_note(self, role: str) -> str:
        """What the role condition says about the generation coming up."""
        h = self.plan.desired.hash
        t = self.all[h][role]
        note = f"{self.name(h)} (not serving yet): {t.ready}/{t.desired} {role} {t.unit} ready"
        if t.problems:
            note += f"; {_problem_text(t.problems)}"
        detail = self.view.details.get((h, role))
        if detail and not t.ready_all:
            note += f"; {detail}"
        return note

    def _desired(self, h: str) -> dict[str, int]:
        return {r: self.all[h][r].desired for r in contract.ROLES}

    def _progress(self, h: str) -> str:
        t = self.all[h]
        return ", ".join(f"{r} {t[r].ready}/{t[r].desired}" for r in contract.ROLES) + " Ready"

    def message(self) -> str:
        plan, state = self.plan, self.state
        target, serving = self.name(plan.desired.hash), self.name(plan.route.hash)
        if state == "Complete":
            return f"{serving} serves"
        if state == "Switching":
            old = ", ".join(self.name(h) for h in self.draining)
            return (f"traffic moved to {serving}; {old} drains: the router pods that still select it finish their "
                    "in-flight requests (spec.router.drainSeconds), then it is removed")  # fmt: skip
        if state == "Starting":
            return (f"{target} is starting beside {serving}, which keeps all traffic until every desired replica of "
                    f"the new one is Ready (a decode pod only after its pair check against the new prefill pods): "
                    f"{self._progress(plan.desired.hash)}")  # fmt: skip
        if self.refused and self.failure is not None:
            live = self.plan.rolling and self.plan.route.hash in self.view.live.generations
            after = f"{serving} keeps serving" if live else "nothing serves yet"
            return f"{target} cannot be created: {self.failure.message}; {after}"
        problems = "; ".join(m for _, m in self.target_problems())
        gpus = _gpus(self.spec, self._desired(plan.desired.hash))
        return (f"{target} cannot come up: {problems}; {serving} keeps serving. A rollout starts the new generation "
                f"beside the serving one, so it needs room for {gpus} more GPUs: free them or add nodes, "
                "or put the spec back to cancel it")  # fmt: skip

    def annotate(self, conds: list[dict[str, str]], failure: Failure | None) -> None:
        """Role conditions gain the new generation's progress and probe reasons; Progressing says where the rollout
        stands; Degraded also carries the new generation's problems (the serving one may be fine)."""
        by_type = {c["type"]: c for c in conds}
        if self.plan.rolling:
            for role in contract.ROLES:
                c = by_type[str(COMPONENT_CONDITION[role])]
                c.update(_cond(ConditionType(c["type"]), _truth(c["status"]), Reason(c["reason"]),
                               f"{c['message']}; {self.target_note(role)}"))  # fmt: skip
        if failure is not None:
            if self.refused:  # the failure's reason stays; the message says which generation and what still serves
                by_type[str(ConditionType.PROGRESSING)]["message"] = _clip(self.message())
            return
        state = self.state
        if state != "Complete":
            reason = {"Starting": Reason.GENERATION_STARTING, "Blocked": Reason.GENERATION_BLOCKED,
                      "Switching": Reason.TRAFFIC_SWITCHING}[state]  # fmt: skip
            by_type[str(ConditionType.PROGRESSING)].update(
                _cond(ConditionType.PROGRESSING, state != "Blocked", reason, self.message())
            )
        problems = self.target_problems()
        degraded = by_type[str(ConditionType.DEGRADED)]
        if problems and degraded["status"] != "True":
            degraded.update(_cond(ConditionType.DEGRADED, True, problems[0][0], "; ".join(m for _, m in problems)))
        elif problems:
            degraded.update(_cond(ConditionType.DEGRADED, True, Reason(degraded["reason"]),
                                  degraded["message"] + "; " + "; ".join(m for _, m in problems)))  # fmt: skip

    def _entry(self, h: str) -> dict[str, Any]:
        t = self.all[h]
        if h == self.plan.desired.hash and self.refused:
            state = "Blocked"
        elif h == self.plan.route.hash:
            state = "Serving"
        elif h == self.plan.desired.hash:
            state = "Blocked" if self.target_problems() else "Starting"
        else:
            state = "Draining"
        out: dict[str, Any] = {"number": self.number(h), "hash": h, "state": state, "served": h in self.plan.served}
        out.update({r: f"{t[r].ready}/{t[r].desired}" for r in contract.ROLES})
        why = [_problem_text(t[r].problems) for r in contract.ROLES if t[r].problems]
        why += [d for r in contract.ROLES if not t[r].ready_all and (d := self.view.details.get((h, r)))]
        if why:
            out["message"] = _clip("; ".join(why), 4096)
        return out

    def status(self) -> dict[str, Any]:
        """status.rollout (camelCase)."""
        plan, state = self.plan, self.state
        if state == "Complete":
            summary = "complete"
        elif state == "Switching":
            summary = "draining gen " + ",".join(str(self.number(h)) for h in self.draining)
        else:
            t = self.all[plan.desired.hash]
            want = sum(t[r].desired for r in contract.ROLES)
            done = sum(min(t[r].ready, t[r].desired) for r in contract.ROLES)
            summary = f"gen {plan.desired.number}: " + ("blocked" if state == "Blocked" else f"{done}/{want} ready")
        return {
            "state": state,
            "summary": summary,
            "message": _clip(self.message(), 4096),
            "servingGeneration": plan.route.number,
            "servingHash": plan.route.hash,
            "targetGeneration": plan.desired.number,
            "targetHash": plan.desired.hash,
            "latestGeneration": max(plan.latest, self.view.live.latest_number()),
            "generations": sorted((self._entry(h) for h in self.all), key=lambda e: (e["number"], e["hash"])),
        }


def _truth(status: str) -> bool | None:
    return None if status == "Unknown" else status == "True"


def _clip(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        elif spec.role(comp).autoscaling is not None and dep is not None:  # type: ignore[arg-type]
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
        return _cond(ConditionType.WARMED_UP, True, Reason.WARMUP_DISABLED, "spec.warmup.enabled is false")
    if all(s.ready_all for s in engines):
        msg = "every engine replica passed its warmup (/readyz)"
        return _cond(ConditionType.WARMED_UP, True, Reason.ALL_ENGINES_WARM, msg)
    waiting = sum(max(s.desired - s.ready, 0) for s in engines)
    msg = f"{waiting} engine replica(s) not warm (not Ready) yet"
    return _cond(ConditionType.WARMED_UP, False, Reason.WARMUP_PENDING, msg)


def _data_path_condition(
    spec: HybridPDDeploymentSpec | None, decode: RoleState, detail: str | None, kv: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """Whether P->D is proven now. Decode is Ready only after its pair check with every Ready prefill and stays Ready
    only while its canary passes, so Ready decode replicas are the proof. `kv`: the newest KV path report of a Ready
    decode (status.kvPath); below the fabric's floor the condition stays True with reason KVPathBelowFloor (a Warning
    Event on the transition): the path answers correctly, slowly."""
    ctype = ConditionType.DATA_PATH_VERIFIED
    if spec is None:
        return _cond(ctype, None, Reason.UNKNOWN, "the spec is not valid")
    check, fabric = pair_check(spec.warmup), spec.kv_transfer
    if not check.on:
        return _cond(ctype, None, Reason.PAIR_CHECK_DISABLED, "spec.warmup.pairCheck (or warmup) is off: P->D is "
                     "not verified before traffic")  # fmt: skip
    canary = check.canary
    if decode.desired > 0 and decode.ready_all:
        measured = f"pod {kv['pod']}: {kv.get('message')}" if kv else "decode's /readyz names the measured rate"
        msg = (f"{decode.ready}/{decode.desired} decode replica(s) verified P->D with every Ready prefill; {canary}; "
               f"KV over fabric {fabric.fabric} ({measured})")  # fmt: skip
        slow = bool(kv and kv.get("belowFloor"))
        return _cond(ctype, True, Reason.KV_PATH_BELOW_FLOOR if slow else Reason.DATA_PATH_VERIFIED, msg)
    msg = f"{decode.ready}/{decode.desired} decode replica(s) verified P->D; {canary}"
    return _cond(ctype, False, Reason.DATA_PATH_UNVERIFIED, msg + (f": {detail}" if detail else ""))


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
    if fallback is not None and failure is None:
        reason, message, _ = fallback
        degraded = _cond(ConditionType.DEGRADED, True, reason, "; ".join([message, *(m for _, m in problems)]))
    elif problems:
        degraded = _cond(ConditionType.DEGRADED, True, problems[0][0], "; ".join(m for _, m in problems))
    else:
        degraded = _cond(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "no component is failing")
    return [progressing, degraded]


def _ready_condition(
    states: Mapping[str, RoleState], failure: Failure | None, fallback: tuple[Reason, str, str] | None = None
) -> tuple[dict[str, str], Phase]:
    """Ready and the phase (Degraded while degraded mode serves colocated: `fallback`)."""
    degraded = any(s.problems for s in states.values()) or fallback is not None
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
