"""Generations of a CR's engines and the rollout between them (pure: no I/O, no clock). docs/rollouts.md says why.

A generation is one set of prefill + decode pods built from the same engine pod templates. Its id is a hash of
both templates (`builders.generation_hash`): any change that reaches what the engines run (image, vLLM version,
model, TP, block size, flags, env, kvTransfer, warmup, resources, scheduling) is a new generation; replicas, the
router, monitoring and network policy are not in the templates, so they never start one. Each generation has its
own Deployments and headless Services, `<cr>-prefill-<hash>` / `<cr>-decode-<hash>`, whose selectors and pods
carry `hybridpd.io/generation=<hash>`, and a sequence number (`hybridpd.io/generation-number`) for people. A role
whose replica spans nodes (docs/multi-node.md) is one LeaderWorkerSet per generation instead of a Deployment, named,
labelled and gated the same way (its counts are groups: a group is Ready when its leader is); its leader and worker
templates and the group size are what its share of the hash is computed from, so a shape change is a new generation.

The router (`<cr>-router`, one Deployment behind the `<cr>` Service) routes to one generation at a time: its
discovery selectors name that generation's hash, and its pods carry it as a label. `plan_rollout` decides, from
what runs:

- `desired`: the generation the spec asks for (created when missing, with the next number);
- `route`: the generation the router is told to select. It moves to `desired` only once that generation is Ready
  (every desired prefill and decode replica Ready: a decode pod is Ready only after its pair check passed against
  every Ready prefill of its own generation). Until then the router keeps the generation it has.
- `keep`: what must stay as it is: `desired`, `route`, and every generation that a router pod still selects (an old
  router pod finishing its in-flight requests during the router's rolling update). Any other generation is removed:
  drained (it served, and no router pod selects it any more) or cancelled (it never served: the spec moved on or
  went back).

A generation that is kept but not desired is never re-applied: its children stay exactly as they were built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpd_operator.conditions import Reason
from hpd_runtime import contract

HASH_LENGTH = 8
"""Hex digits of a generation's id: child names stay short (`<cr>-prefill-1a2b3c4d`); a CR holds two or three
generations at a time, so collisions are not a concern."""

Manifest = dict[str, Any]
GROUP_KIND = "LeaderWorkerSet"


@dataclass(frozen=True)
class Generation:
    """One generation's identity: the hash of its engine pod templates and its sequence number."""

    hash: str
    number: int
    groups: frozenset[str] = field(default=frozenset(), compare=False)
    """Roles that run as LeaderWorkerSet groups in this generation (replicas that span nodes): the router's discovery
    and the role's headless Service select their leaders only. Known from the spec for the generation it asks for,
    from the live workloads for any other; not part of the identity (the hash already is)."""

    def labels(self) -> dict[str, str]:
        return {contract.LABEL_GENERATION: self.hash, contract.LABEL_GENERATION_NUMBER: str(self.number)}


def hash_templates(templates: Mapping[str, Any]) -> str:
    """The generation id of a set of engine pod templates (role -> template, without any generation in them)."""
    text = json.dumps(templates, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def generation_of(obj: Mapping[str, Any]) -> str | None:
    """The generation an object belongs to (engines) or routes to (router), from its label."""
    value = _labels(obj).get(contract.LABEL_GENERATION)
    return str(value) if value else None


def number_of(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(_labels(obj).get(contract.LABEL_GENERATION_NUMBER) or "")
    except ValueError:
        return None


def component_of(obj: Mapping[str, Any]) -> str | None:
    value = _labels(obj).get(contract.LABEL_COMPONENT)
    return str(value) if value else None


def _owned(obj: Mapping[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


# --- what runs -----------------------------------------------------------------------------------------------------
WORKLOAD_KINDS = frozenset({"Deployment", GROUP_KIND})
"""What runs a role's replicas: a Deployment (one pod per replica) or a LeaderWorkerSet (a group of pods)."""


@dataclass
class LiveGeneration:
    """One generation as it runs: its engine workloads (by role: a Deployment, or a LeaderWorkerSet for a role whose
    replica spans nodes) and their pods (a group's leader and workers alike)."""

    hash: str
    number: int | None = None
    deployments: dict[str, Manifest] = field(default_factory=dict)
    pods: dict[str, list[Manifest]] = field(default_factory=lambda: {r: [] for r in contract.ROLES})

    def replicas(self, role: str) -> int:
        """The role's desired replicas as its Deployment (LeaderWorkerSet: groups) has them (0 when it is missing)."""
        dep = self.deployments.get(role) or {}
        return int((dep.get("spec") or {}).get("replicas") or 0)

    @property
    def groups(self) -> frozenset[str]:
        """Roles that run as LeaderWorkerSet groups in this generation."""
        return frozenset(r for r, d in self.deployments.items() if d.get("kind") == GROUP_KIND)


@dataclass
class Live:
    """A CR's generations as the cache holds them, and the router's view of them."""

    generations: dict[str, LiveGeneration] = field(default_factory=dict)
    router: Manifest | None = None
    """The router Deployment (owned by the CR), if it exists."""
    router_pods: list[Manifest] = field(default_factory=list)

    @property
    def router_target(self) -> str | None:
        """The generation the router Deployment is told to select (None: no router, or one from before generations)."""
        return generation_of(self.router) if self.router is not None else None

    @property
    def routed_by_pods(self) -> set[str]:
        """Generations a router pod still selects, terminating pods included (they finish their requests)."""
        return {g for p in self.router_pods if (g := generation_of(p)) is not None}

    def latest_number(self) -> int:
        return max((g.number for g in self.generations.values() if g.number is not None), default=0)


def observe(children: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], uid: str) -> Live:
    """Group what a CR owns by generation: engine Deployments and LeaderWorkerSets by their generation label (owned
    by `uid`), engine pods by theirs, the router Deployment and the router pods. Engine objects without a generation
    label (made by an operator before generations) belong to no generation: the reconcile prunes them as stale."""
    live = Live()
    for obj in children:
        if obj.get("kind") not in WORKLOAD_KINDS or not _owned(obj, uid):
            continue
        comp, gen = component_of(obj), generation_of(obj)
        if comp == contract.COMPONENT_ROUTER and obj.get("kind") == "Deployment":
            live.router = dict(obj)
        elif comp in (*contract.ROLES, contract.COMPONENT_PAIR) and gen is not None:
            g = live.generations.setdefault(gen, LiveGeneration(gen))
            for role in roles_of(comp):
                g.deployments[role] = dict(obj)
            g.number = number_of(obj) if g.number is None else g.number
    for pod in pods:
        comp, gen = component_of(pod), generation_of(pod)
        if comp == contract.COMPONENT_ROUTER:
            live.router_pods.append(dict(pod))
        elif gen is not None and gen in live.generations:
            for role in roles_of(comp):
                live.generations[gen].pods[role].append(dict(pod))
    return live


def roles_of(component: str | None) -> tuple[contract.Role, ...]:
    """The engine roles an object of `component` runs: its role, or both for a pair pod and its Deployment
    (spec.kvTransfer.processNamespace Pair: each pod one prefill and one decode), so every role's counts, readiness and
    rollout read the pair pods as they read a role's own pods (a pair pod is Ready only whole)."""
    if component == contract.COMPONENT_PAIR:
        return contract.ROLES
    return tuple(r for r in contract.ROLES if r == component)


# --- the plan ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    desired: Generation
    """The generation the spec asks for."""
    route: Generation
    """The generation the router selects after this reconcile."""
    keep: frozenset[str]
    """Generations whose children stay (desired, route, and those router pods still select)."""
    latest: int
    """The highest generation number assigned so far (status.rollout.latestGeneration)."""
    served: frozenset[str] = frozenset()
    """Generations that took traffic with every desired replica Ready at least once (status.rollout.generations[]
    .served): they are protected even while they are down for a moment."""

    @property
    def rolling(self) -> bool:
        return self.route.hash != self.desired.hash


def fresh_plan(desired_hash: str, groups: Iterable[str] = ()) -> Plan:
    """The plan of a CR with nothing running yet (and of `render`): generation 1, routed at once. `groups`: the roles
    the spec runs as LeaderWorkerSet groups."""
    gen = Generation(desired_hash, 1, frozenset(groups))
    return Plan(desired=gen, route=gen, keep=frozenset({desired_hash}), latest=1)


def plan_rollout(  # noqa: PLR0913 - the plan's facts, each from another observation; keyword-only past the 4th
    desired_hash: str,
    live: Live,
    ready: Mapping[str, bool],
    latest: int = 0,
    *,
    answering: Mapping[str, bool] | None = None,
    served: Iterable[str] = (),
    groups: Iterable[str] = (),
) -> Plan:
    """Which generation the spec wants, which one the router selects, which ones stay (see the module doc).

    `ready`: generation hash -> every desired replica of both roles Ready (status.generation_ready decides it).
    `answering`: generation hash -> at least one Ready pod of each role (it can answer a request now).
    `latest`: the highest number the CR's status recorded, so numbers never repeat after a generation is gone.
    A number is taken (counted in `Plan.latest`) only once the desired generation has a workload that runs: while
    the apiserver refuses it (a bad env entry, a site admission policy, LeaderWorkerSet not installed), every
    reconcile gives it the same number, so nothing derived from it (the router's and the Services' labels, the
    status) changes and the refusal backs off like any other error instead of writing a new number each time.
    `served`: the generations the status recorded as having served.
    `groups`: the roles the spec runs as LeaderWorkerSet groups (those of the desired generation).

    Only a generation that serves or served is protected (kept until the new one is Ready, and its draining
    router pods waited for): one that never became Ready and cannot answer now (a first deploy with bad flags) holds
    GPUs for nothing, so a new spec replaces it at once instead of waiting for room beside it."""
    top = max(latest, live.latest_number())
    existing = live.generations.get(desired_hash)
    taken = existing.number if existing is not None else None
    number = taken if taken is not None else top + 1
    desired = Generation(desired_hash, number, frozenset(groups))
    target = live.router_target
    has_served = {h for h in served if h in live.generations}
    if target is not None and ready.get(target):
        has_served.add(target)  # the router routes to it and it is Ready: it serves
    protected = has_served | {h for h in live.generations if ready.get(h) or (answering or {}).get(h)}
    route = _route(desired, live, ready, protected)
    keep = {desired.hash, route.hash} | (live.routed_by_pods & protected)
    return Plan(desired, route, frozenset(keep), max(top, number) if taken is not None else top, frozenset(has_served))


def _route(desired: Generation, live: Live, ready: Mapping[str, bool], protected: set[str]) -> Generation:
    if ready.get(desired.hash):
        return desired  # the new generation proved itself: traffic moves (or stays) there
    current = live.generations.get(live.router_target or "")
    if current is not None and (current.hash in protected or current.hash == desired.hash):
        return _identity(current, desired)  # keep serving what serves until the new one is Ready
    # No router, one that selects a generation that is gone (deleted by hand, or an operator from before
    # generations) or one that never served: the newest protected generation, else the desired one.
    standing = [g for h, g in live.generations.items() if h in protected and h != desired.hash]
    if standing:
        return _identity(max(standing, key=lambda g: g.number or 0), desired)
    return desired


def _identity(g: LiveGeneration, desired: Generation) -> Generation:
    if g.hash == desired.hash:
        return desired
    return Generation(g.hash, g.number or 0, g.groups)


def kept(obj: Mapping[str, Any], plan: Plan) -> bool:
    """Whether a child of another generation than the desired one must stay (prune leaves it alone). The desired
    generation's children are pruned like any other (its PodDisruptionBudget after a scale-down to 1). An autoscaler
    is never kept: only the generation the router routes to has one (builders.autoscaling), so a draining
    generation's HorizontalPodAutoscaler goes at the switch and the generation stays at the count it had."""
    gen = generation_of(obj)
    if obj.get("kind") == "HorizontalPodAutoscaler":
        return False
    comp = component_of(obj)
    return gen is not None and gen != plan.desired.hash and gen in plan.keep and bool(roles_of(comp))


@dataclass(frozen=True)
class RolloutView:
    """What status.compute_status needs to report generations: what runs (after this reconcile's writes), the plan,
    and why pods of each generation are not Ready ((generation hash, role) -> the newest probe reason)."""

    live: Live
    plan: Plan
    details: Mapping[tuple[str, str], str] = field(default_factory=dict)


# --- one Event per transition ----------------------------------------------------------------------------------------
def rollout_transitions(
    previous: Mapping[str, Any] | None, current: Mapping[str, Any] | None
) -> list[tuple[str, str, str]]:
    """The Events a change of status.rollout deserves (type, reason, message): a new generation started beside a
    serving one, traffic moved, a generation drained and was removed, or one was cancelled before it served.
    Nothing for a CR's first status or when nothing changed (pure)."""
    if not previous or not current:
        return []
    before = {g["hash"]: g for g in previous.get("generations") or []}
    after = {g["hash"]: g for g in current.get("generations") or []}
    out: list[tuple[str, str, str]] = []
    target, serving = current.get("targetHash"), current.get("servingHash")
    if target and target != serving and target not in before:
        out.append(("Normal", str(Reason.GENERATION_STARTED), f"{_gen(current, target)} started beside {_gen(current, serving)}, "
                    "which keeps all traffic until the new one is Ready"))  # fmt: skip
    was = previous.get("servingHash")
    if was and serving and serving != was:
        out.append(("Normal", str(Reason.TRAFFIC_SWITCHED), f"traffic moved from {_gen(previous, was)} to "
                    f"{_gen(current, serving)} (its decode pods passed their pair check against its own prefill pods); "
                    f"{_gen(previous, was)} drains"))  # fmt: skip
    for h, g in before.items():
        if h in after:
            continue
        if g.get("served"):
            out.append(("Normal", str(Reason.GENERATION_REMOVED), f"{_gen(previous, h)} drained and was removed"))
        else:
            why = "the spec went back to it" if h != target and target == serving else "the spec moved on"
            out.append(("Normal", str(Reason.GENERATION_CANCELLED), f"{_gen(previous, h)} was removed before it served: {why} "
                        f"({_gen(current, target)})"))  # fmt: skip
    return out


def _gen(rollout: Mapping[str, Any], h: str | None) -> str:
    """`generation N (hash)` as a rollout status names it."""
    for g in rollout.get("generations") or []:
        if g.get("hash") == h:
            return f"generation {g.get('number')} ({h})"
    if h is not None and h == rollout.get("targetHash"):
        return f"generation {rollout.get('targetGeneration')} ({h})"
    if h is not None and h == rollout.get("servingHash"):
        return f"generation {rollout.get('servingGeneration')} ({h})"
    return f"generation {h}"


def hold_plan(live: Live, served: Iterable[str] = ()) -> Plan | None:
    """The plan when the spec cannot be built (invalid): nothing moves. The router's generation (else the newest) is
    reported as serving, the newest one as the target (the last valid spec's). None when no generation runs."""
    if not live.generations:
        return None
    newest = max(live.generations.values(), key=lambda g: g.number or 0)
    current = live.generations.get(live.router_target or "") or newest
    route = Generation(current.hash, current.number or 0, current.groups)
    desired = Generation(newest.hash, newest.number or 0, newest.groups)
    known = frozenset(set(served) & set(live.generations))
    return Plan(desired, route, frozenset(live.generations), live.latest_number(), known)
