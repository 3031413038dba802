"""One reconcile of one CR as a typed context: what each step (hpd_operator.reconcile.STEPS) found, in order, and
the failures a step ends the reconcile with."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from hpd_operator import generations
from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import instance_label
from hpd_operator.builders import Manifest
from hpd_operator.builders.fallback import Fallback
from hpd_operator.cache import Cache
from hpd_operator.conditions import Failure, Reason
from hpd_operator.controller import Controller
from hpd_operator.profile_model import Profile
from hpd_operator.scaling import Bounds

Key = tuple[str, str, str]
PODMONITOR = ("monitoring.coreos.com/v1", "PodMonitor")
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")


@dataclass
class Run:
    """One reconcile of one CR: what each step found, in order."""

    ctl: Controller
    body: Mapping[str, Any]
    cr: HybridPDDeployment | None = None
    profile: Profile | None = None
    templates: dict[str, Any] = field(default_factory=dict)
    """The engine templates of the spec's generation (builders.engine_templates): its hash and its workloads."""
    desired: list[Manifest] = field(default_factory=list)
    bounds: dict[str, Bounds] = field(default_factory=dict)
    """Each autoscaling role's HPA min/max (scaling.compute_bounds, from what runs)."""
    hpas: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    """Each role's HPA of the generation the router routes to, as observed before this run's writes."""
    start: dict[str, int] = field(default_factory=dict)
    """The count each autoscaling role's Deployment starts at (scaling.start_replicas: the serving generation's)."""
    ours: dict[Key, Manifest] = field(default_factory=dict)
    conflicts: dict[Key, str] = field(default_factory=dict)
    absent: set[Key] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    actions: dict[Reason, list[str]] = field(default_factory=lambda: defaultdict(list))
    observed: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    nodes: frozenset[str] | None = None
    role_details: dict[str, str] = field(default_factory=dict)
    plan: generations.Plan | None = None
    """Which generation the spec asks for, which one the router routes to, which ones stay (set by `build`)."""
    fallback: Fallback | None = None
    """Degraded mode: the endpoint serves colocated on the role left of the routed generation (set by `build`)."""
    rollout: generations.RolloutView | None = None
    """The generations as observed after the writes (set by `observe`): what the status reports."""
    failure: Failure | None = None
    retry: str | None = None
    """Why this CR must be reconciled again with backoff although no failure is reported (a step that will succeed
    once the apiserver catches up, e.g. `owner_kind_unknown`)."""
    requeue_after: float | None = None
    """Reconcile again after this many seconds (something will change that no event announces)."""

    @property
    def api(self) -> client.ApiClient:
        return self.ctl.api

    @property
    def cache(self) -> Cache:
        return self.ctl.cache

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        return str(self.body["metadata"].get("uid"))

    @property
    def instance(self) -> str:
        return instance_label(self.name)


class TransientError(Exception):
    """The API failed in a way worth retrying (5xx, 429, no connection): no status is written for it."""


class BuildError(Exception):
    """A builder raised on a spec the schema accepted."""
