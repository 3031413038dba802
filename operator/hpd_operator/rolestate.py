"""Pure: one role's state from its workload (a Deployment, or a LeaderWorkerSet whose counts are groups) and its
pods: counts, whether it is Ready and rolling, and why it fails (a stuck rollout, an unschedulable pod, a pod no
scheduler looked at, a pod on a lost node). The status and the rollout both read roles through it."""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpd_operator.conditions import Reason
from hpd_runtime import contract


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


def role_state(  # noqa: PLR0913 - the workload and its pods, plus keyword-only knobs with defaults
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
