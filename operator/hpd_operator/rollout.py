"""Pure: where a rollout between generations stands (docs/rollouts.md), beside hpd_operator.generations, which plans
it. `Rollout.of` computes every generation's role states (the serving one, the one the spec asks for, the ones
draining); the status asks it for the serving generation's states, the conditions' additions and status.rollout."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from hpd_operator.api.models import HybridPDDeploymentSpec
from hpd_operator.conditions import (
    COMPONENT_CONDITION,
    ConditionType,
    Failure,
    Reason,
    clip,
    condition,
    problem_text,
    truth,
)
from hpd_operator.generations import LiveGeneration, Plan, RolloutView
from hpd_operator.rolestate import NOT_SCHEDULED_AFTER, RoleState, role_state
from hpd_runtime import contract


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
    if spec.replicas_autoscaling(role) is not None and g is not None and role in g.deployments:
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
class Rollout:
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
    ) -> Rollout:
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
            note += f"; {problem_text(t.problems)}"
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
                c.update(condition(ConditionType(c["type"]), truth(c["status"]), Reason(c["reason"]),
                               f"{c['message']}; {self.target_note(role)}"))  # fmt: skip
        if failure is not None:
            if self.refused:  # the failure's reason stays; the message says which generation and what still serves
                by_type[str(ConditionType.PROGRESSING)]["message"] = clip(self.message())
            return
        state = self.state
        if state != "Complete":
            reason = {"Starting": Reason.GENERATION_STARTING, "Blocked": Reason.GENERATION_BLOCKED,
                      "Switching": Reason.TRAFFIC_SWITCHING}[state]  # fmt: skip
            by_type[str(ConditionType.PROGRESSING)].update(
                condition(ConditionType.PROGRESSING, state != "Blocked", reason, self.message())
            )
        problems = self.target_problems()
        degraded = by_type[str(ConditionType.DEGRADED)]
        if problems and degraded["status"] != "True":
            degraded.update(condition(ConditionType.DEGRADED, True, problems[0][0], "; ".join(m for _, m in problems)))
        elif problems:
            degraded.update(condition(ConditionType.DEGRADED, True, Reason(degraded["reason"]),
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
        # The routed generation with every desired replica Ready serves now (generations.plan_rollout's own rule),
        # as this very status reports it: not only from the next reconcile on, which read the pods before the writes.
        serves = h == self.plan.route.hash and all(t[r].ready_all for r in contract.ROLES)
        out: dict[str, Any] = {"number": self.number(h), "hash": h, "state": state,
                               "served": h in self.plan.served or serves}  # fmt: skip
        out.update({r: f"{t[r].ready}/{t[r].desired}" for r in contract.ROLES})
        why = [problem_text(t[r].problems) for r in contract.ROLES if t[r].problems]
        why += [d for r in contract.ROLES if not t[r].ready_all and (d := self.view.details.get((h, r)))]
        if why:
            out["message"] = clip("; ".join(why), 4096)
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
            "message": clip(self.message(), 4096),
            "servingGeneration": plan.route.number,
            "servingHash": plan.route.hash,
            "targetGeneration": plan.desired.number,
            "targetHash": plan.desired.hash,
            "latestGeneration": max(plan.latest, self.view.live.latest_number()),
            "generations": sorted((self._entry(h) for h in self.all), key=lambda e: (e["number"], e["hash"])),
        }
