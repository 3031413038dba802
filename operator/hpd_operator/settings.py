"""All operator settings, in one place: the CLI's knobs (`OperatorConfig`) and kopf's settings (one startup handler).

Decisions:
- Standalone (no peering): the operator runs as ONE replica (chart: replicas 1, strategy Recreate, as kopf's
  deployment doc says). Peering would need its CRD installed and buys nothing for a single replica; a second
  operator by mistake is harmless anyway because every write is an idempotent server-side apply.
- Ports: kopf's liveness endpoint on 8080 (/healthz; STYLE item 12), Prometheus metrics on 9090. Distinct so
  the liveness probe never depends on the metrics server. 0 disables either (tests pick free ports).
- Event-driven reconcile (handlers.py): watches on the CRs, their children, pods and nodes feed a cache and a work
  queue; `workers` threads (default 4) converge the queued CRs. Only what differs is written (a desired-hash
  annotation per child, a drift test on managedFields/generation, status only when it changed), so an idle
  operator writes nothing and reads nothing but its watch streams.
- A slow safety resync (`resync_seconds`, default 300 s) re-queues every cached CR: it repairs what no event
  announces (a child's drift the drift test cannot see, a lost update) and costs no request when nothing changed.
  It is an asyncio task, not a kopf timer: kopf puts a finalizer on every object with a timer, and a finalizer
  would block `kubectl delete` while the operator is down.
- No runtime scanning (`settings.scanning.disabled`): kopf would otherwise list+watch CustomResourceDefinitions
  (and, when it watches named namespaces, Namespaces) cluster-wide to notice CRDs and namespaces appearing later.
  The operator serves one CRD that its chart installs before it, and watches exactly the namespaces it is given,
  so the scan buys nothing and would cost a cluster-scoped grant even in the chart's `rbac.scope: namespace`.
  A CRD installed after the operator starts needs an operator restart.
- Default images (`vllm_image`, `router_image`): what a CR that leaves `spec.image` / `spec.router.image` out
  runs (the chart's `images.*` values); the CRD carries no default for them (models.OPERATOR_DEFAULT).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import kopf

from hpd_operator.api import constants as c
from hpd_runtime import contract

LIVENESS_PORT_DEFAULT = 8080
METRICS_PORT_DEFAULT = 9090
RESYNC_SECONDS_DEFAULT = 300.0
WORKERS_DEFAULT = 4
RECHECK_SECONDS_DEFAULT = 10.0
NOT_SCHEDULED_SECONDS_DEFAULT = 60.0
MAX_BACKOFF_SECONDS_DEFAULT = 60.0


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    """Empty = cluster-wide."""
    metrics_port: int = METRICS_PORT_DEFAULT
    liveness_port: int = LIVENESS_PORT_DEFAULT
    resync_seconds: float = RESYNC_SECONDS_DEFAULT
    workers: int = WORKERS_DEFAULT
    """Reconcile worker threads (CRs converged at once)."""
    recheck_seconds: float = RECHECK_SECONDS_DEFAULT
    not_scheduled_seconds: float = NOT_SCHEDULED_SECONDS_DEFAULT
    """How long a pod may wait for any scheduler's first verdict before its role is Degraded (NotScheduled)."""
    """How often a CR whose child name is held by an object the operator does not watch (no managed-by label) is
    re-queued to look again (no event announces that object's deletion)."""
    max_backoff_seconds: float = MAX_BACKOFF_SECONDS_DEFAULT
    """The cap of a CR's retry backoff (0.5 s doubling): a CR that does not converge is retried at least this often.
    Tests lower it to watch several capped retry periods in seconds instead of minutes."""
    vllm_image: str = c.VLLM_IMAGE_TEMPLATE
    vllm_image_digests: tuple[tuple[str, str], ...] = ()
    """(vLLM version, sha256:...) pairs: the default image of that version runs pinned (`--vllm-image-digest`)."""
    router_image: str = c.DEFAULT_ROUTER_IMAGE
    pod_monitor_labels: tuple[tuple[str, str], ...] = ()
    """Labels on every CR's PodMonitors (the chart's podMonitors.labels, e.g. release: kube-prometheus-stack)."""


class NoDiffBase(kopf.DiffBaseStorage):
    """No "last-handled" essence: kopf builds one (a deep copy of the body) on every watch event for its
    on.create/update/field handlers; the operator has none (index and event handlers only), so nothing is built,
    read or stored, which saves a copy of every event's object."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return cast("kopf.BodyEssence", {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup(id="settings")
def configure_kopf(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our own annotations (not kopf.zalando.org/*) for handler progress, were kopf ever to write it (it does not:
    # index and event handlers only). Annotations, not status: status has a structural schema and would prune them.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=contract.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.persistence.finalizer = f"{contract.GROUP}/finalizer"  # never added: we register no delete handler
    # Watches must end server-side or they can hang silently on a dead connection (kopf #698; dask's values).
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 30
    # One event handler call per watch event: "Handler ... succeeded" for each would flood the log (--verbose shows it).
    if not logging.getLogger("kopf").isEnabledFor(logging.DEBUG):
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # Only warnings from logs become Events; our Normal Events are posted explicitly (kopf.event).
    settings.posting.level = logging.WARNING
    # No CRD/namespace scanning: see the module docstring (keeps RBAC namespaced in `rbac.scope: namespace`).
    settings.scanning.disabled = True
    # Standalone: see the module docstring.
    settings.peering.standalone = True
    # Transient errors: retry with backoff, not in a tight loop.
    settings.execution.max_workers = 8
    settings.networking.request_timeout = 60
