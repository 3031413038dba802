"""Prometheus metrics of the operator (served by `run --metrics-port`). The table in docs/monitoring.md lists them.

Reconcile metrics carry controller-runtime's names and labels (`controller_runtime_reconcile_total{controller,
result}`, `controller_runtime_reconcile_time_seconds`, `..._reconcile_errors_total`,
`..._terminal_reconcile_errors_total`, `..._active_workers`), so dashboards and alerts written for Go operators
work unchanged; everything specific to this operator is `hpd_operator_*`. Per-CR series carry `namespace` and
`hybridpddeployment` (the CR's name; kube-state-metrics names the label after the kind) and `role` (prefill/decode/router, the same values the PodMonitors put on the
engines' and router's series); the operator's ServiceMonitor therefore sets `honorLabels: true`.

Handlers record at three points only: `reconcile()` around one converge (told the run's failure reason, if any),
`record_status()` after a status computation, `forget()` when a CR is deleted (plus the API-error and
applied/pruned counters beside the calls).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hpd_operator.conditions import Phase, Reason
from hpd_operator.rolestate import parse_time
from hpd_runtime import contract

CONTROLLER = "hybridpddeployment"
"""The `controller` label value (controller-runtime uses the lower-cased kind)."""
PHASES = tuple(str(p) for p in Phase)
TERMINAL_REASONS = frozenset({Reason.INVALID_SPEC, Reason.APPLY_FAILED, Reason.OWNERSHIP_CONFLICT})
"""Failures that wait for someone to act (the CR's status names the field, the refused child or the object holding
a name): counted as errors and as terminal errors. The operator still retries them with capped backoff (a 403 goes
away when RBAC is granted or discovery catches up), so "terminal" classifies the error for alerts, it does not stop
retries. Reason.RECONCILE_ERROR (a bug, or input no check foresaw) and exceptions are plain errors."""
ROLES = (*contract.ROLES, contract.COMPONENT_ROUTER)

# controller-runtime's reconcile histogram buckets (pkg/internal/controller/metrics/metrics.go).
_RECONCILE_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    *(1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60),
)

RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total",
    "Total number of reconciliations per controller and result (success, error).",
    ["controller", "result"],
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total", "Total number of reconciliation errors per controller.", ["controller"]
)
TERMINAL_RECONCILE_ERRORS = Counter(
    "controller_runtime_terminal_reconcile_errors_total",
    "Reconciliation errors that wait for someone to act (InvalidSpec, ApplyFailed, OwnershipConflict in the CR's "
    "status); retried with capped backoff all the same.",
    ["controller"],
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller.",
    ["controller"],
    buckets=_RECONCILE_BUCKETS,
)
ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers", "Number of currently used workers per controller.", ["controller"]
)
OBJECTS_APPLIED = Counter(
    "hpd_operator_objects_applied_total",
    "Child objects server-side applied, by kind and outcome (created, updated, unchanged).",
    ["kind", "action"],
)
OWNER_REFERENCES_DEFERRED = Counter(
    "hpd_operator_owner_references_deferred_total",
    "Children written without blockOwnerDeletion because the apiserver could not resolve the CR's kind yet (a CRD "
    "created moments before); completed on a retry.",
    ["kind"],
)
REPLICAS_HANDED_OFF = Counter(
    "hpd_operator_replicas_handed_off_total",
    "Deployments whose spec.replicas the operator handed to their autoscaler (a role that started to autoscale), "
    "by role: the value stays, the operator stops owning it.",
    ["role"],
)
OBJECTS_PRUNED = Counter("hpd_operator_objects_pruned_total", "Stale child objects deleted, by kind.", ["kind"])
API_ERRORS = Counter(
    "hpd_operator_api_errors_total",
    "Failed Kubernetes API calls of the operator, by operation (apply, status, event, reconcile) and HTTP code.",
    ["operation", "code"],
)
# The per-CR gauges (kube-state-metrics style) are built at scrape time from one small record per CR (`_PerCR`):
# a labelled prometheus_client child costs ~0.7 KiB and a CR has 12 of them (8.5 KiB per CR, 8 MiB at 1,000 CRs),
# and the totals by phase need no recount over every CR after each reconcile.
_CRS_BY_PHASE = ("hpd_operator_hybridpddeployments", "HybridPDDeployments by status phase.")
_CR_PHASE = (
    "hpd_operator_hybridpddeployment_status_phase",
    "1 for the CR's current status phase, 0 for the others (kube-state-metrics style).",
)
_DESIRED_REPLICAS = ("hpd_operator_desired_replicas", "Replicas the spec asks for, per CR and role.")
_READY_REPLICAS = (
    "hpd_operator_ready_replicas",
    "Ready replicas per CR and role (engines are Ready only after their warmup).",
)
_AT_MAX = (
    "hpd_operator_autoscaler_at_max",
    "1 while an autoscaling role runs at the maximum in force (its maxReplicas, or lower where spec.ratio holds it), "
    "per CR and role.",
)
_SIGNAL_RATIO = (
    "hpd_operator_autoscaler_signal_ratio",
    "An autoscaling role's signal per replica over its target, as its HPA last read it (above 1: it wants more "
    "replicas), per CR, role and signal.",
)
_SERVING_COLOCATED = (
    "hpd_operator_serving_colocated",
    "1 while the CR's endpoint serves colocated on one role (degraded mode: no Ready pod of the other role), per "
    "CR and the role it serves on; 0 while it serves through the router.",
)
_TIME_TO_READY = (
    "hpd_operator_time_to_ready_seconds",
    "Seconds from the CR's creation to its (latest) Ready=True transition; absent while never Ready.",
)


@dataclass(frozen=True)
class _PerCR:
    phase: str
    desired: tuple[int, ...]
    """Per ROLES."""
    ready: tuple[int, ...]
    time_to_ready: float | None
    scalers: tuple[tuple[str, bool, tuple[tuple[str, float], ...]], ...] = ()
    """(role, at its maximum, ((signal, value / target), ...)) per autoscaling role."""
    colocated_on: str | None = None
    """Degraded mode: the role the endpoint serves on (status.serving `colocated on <role>`); None: the router."""


class _PerCRCollector(Collector):
    """The per-CR series: one record per CR, replaced by each status computation (record_status), dropped with the
    CR (forget); a prometheus_client collector in its process-wide registry, like the metrics above."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[tuple[str, str], _PerCR] = {}

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            records = list(self.records.items())
        by_phase = GaugeMetricFamily(*_CRS_BY_PHASE, labels=["phase"])
        counts = collections.Counter(r.phase for _, r in records)
        for p in PHASES:
            by_phase.add_metric([p], counts[p])
        cr_labels = ["namespace", "hybridpddeployment"]
        phase = GaugeMetricFamily(*_CR_PHASE, labels=[*cr_labels, "phase"])
        desired = GaugeMetricFamily(*_DESIRED_REPLICAS, labels=[*cr_labels, "role"])
        ready = GaugeMetricFamily(*_READY_REPLICAS, labels=[*cr_labels, "role"])
        took = GaugeMetricFamily(*_TIME_TO_READY, labels=cr_labels)
        at_max = GaugeMetricFamily(*_AT_MAX, labels=[*cr_labels, "role"])
        ratio = GaugeMetricFamily(*_SIGNAL_RATIO, labels=[*cr_labels, "role", "signal"])
        colocated = GaugeMetricFamily(*_SERVING_COLOCATED, labels=[*cr_labels, "role"])
        for (ns, name), r in records:
            for role in ROLES:
                colocated.add_metric([ns, name, role], 1 if r.colocated_on == role else 0)
            for role, top, signals in r.scalers:
                at_max.add_metric([ns, name, role], 1 if top else 0)
                for signal, value in signals:
                    ratio.add_metric([ns, name, role, signal], value)
            for p in PHASES:
                phase.add_metric([ns, name, p], 1 if p == r.phase else 0)
            for role, d, n in zip(ROLES, r.desired, r.ready, strict=True):
                desired.add_metric([ns, name, role], d)
                ready.add_metric([ns, name, role], n)
            if r.time_to_ready is not None:
                took.add_metric([ns, name], r.time_to_ready)
        yield from (by_phase, phase, desired, ready, took, at_max, ratio, colocated)


PER_CR = _PerCRCollector()
REGISTRY.register(PER_CR)

# controller-runtime's work queue metrics (pkg/metrics/workqueue.go), label `name` = the queue (the controller).
_QUEUE_BUCKETS = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)
WORKQUEUE_DEPTH = Gauge("workqueue_depth", "Current depth of workqueue.", ["name"])
WORKQUEUE_ADDS = Counter("workqueue_adds_total", "Total number of adds handled by workqueue.", ["name"])
WORKQUEUE_RETRIES = Counter("workqueue_retries_total", "Total number of retries handled by workqueue.", ["name"])
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested.",
    ["name"],
    buckets=_QUEUE_BUCKETS,
)
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes.",
    ["name"],
    buckets=_QUEUE_BUCKETS,
)
API_REQUESTS = Counter(
    "hpd_operator_api_requests_total",
    "Kubernetes API requests of the operator's reconcile client, by HTTP method (kopf's watch streams not included).",
    ["method"],
)
OBSERVED_OBJECTS = Gauge(
    "hpd_operator_cached_objects",
    "Objects in the operator's watch cache, by kind of entry (crs, children, pods).",
    ["cache"],
)


class Outcome:
    """What one reconcile ended in; `failed(reason)` records a failure the run reported in the CR's status,
    `requeue` a run without failure that is retried with backoff (`retry`) or looked at again later (`after`)."""

    def __init__(self) -> None:
        self.failure: Reason | None = None
        self.result = "success"

    def failed(self, reason: Reason | None) -> None:
        self.failure = reason

    def requeue(self, *, retry: bool, after: bool) -> None:
        self.result = "requeue" if retry else "requeue_after" if after else "success"


@contextlib.contextmanager
def reconcile() -> Iterator[Outcome]:
    """Time one reconcile and count its result as controller-runtime does: success, requeue (not converged yet,
    retried with backoff), requeue_after (converged; looked at again later), or error (an exception, or a failure
    reported in the status; the ones in TERMINAL_REASONS are also terminal errors)."""
    start = time.monotonic()
    ACTIVE_WORKERS.labels(CONTROLLER).inc()
    outcome, raised = Outcome(), True
    try:
        yield outcome
        raised = False
    finally:
        ACTIVE_WORKERS.labels(CONTROLLER).dec()
        error = raised or outcome.failure is not None
        RECONCILE_TOTAL.labels(CONTROLLER, "error" if error else outcome.result).inc()
        if error:
            RECONCILE_ERRORS.labels(CONTROLLER).inc()
        if not raised and outcome.failure in TERMINAL_REASONS:
            TERMINAL_RECONCILE_ERRORS.labels(CONTROLLER).inc()
        RECONCILE_TIME.labels(CONTROLLER).observe(time.monotonic() - start)


def api_error(operation: str, code: object) -> None:
    API_ERRORS.labels(operation=operation, code=str(code)).inc()


def time_to_ready(created: object, conditions: list[Mapping[str, Any]]) -> float | None:
    """Pure: seconds from creationTimestamp to the Ready=True condition's lastTransitionTime (None if not Ready)."""
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        return None
    t0, t1 = parse_time(created), parse_time(ready.get("lastTransitionTime"))
    if t0 is None or t1 is None:
        return None
    return max((t1 - t0).total_seconds(), 0.0)


def record_status(namespace: str, name: str, status: Mapping[str, Any], created: object = None) -> None:
    """Per-CR gauges from one computed status (phase, desired/ready per role, time to Ready)."""
    desired, ready = [], []
    for role in ROLES:
        rs = status.get(role) or {}
        ready.append(int(rs.get("readyReplicas") or 0))
        desired.append(int(str(rs.get("summary", "0/0")).split("/")[-1] or 0))
    record = _PerCR(
        phase=str(status.get("phase") or "Pending"),
        desired=tuple(desired),
        ready=tuple(ready),
        time_to_ready=time_to_ready(created, list(status.get("conditions") or [])),
        scalers=scaler_records(status),
        colocated_on=colocated_on(status),
    )
    with PER_CR.lock:
        old = PER_CR.records.get((namespace, name))
        if record.time_to_ready is None and old is not None:  # the latest Ready transition's figure stays
            record = dataclasses.replace(record, time_to_ready=old.time_to_ready)
        PER_CR.records[(namespace, name)] = record


def colocated_on(status: Mapping[str, Any]) -> str | None:
    """Pure: the role a status says the endpoint serves on in degraded mode (status.serving), or None."""
    serving = str(status.get("serving") or "")
    return serving.removeprefix("colocated on ") if serving.startswith("colocated on ") else None


def scaler_records(status: Mapping[str, Any]) -> tuple[tuple[str, bool, tuple[tuple[str, float], ...]], ...]:
    """Pure: per autoscaling role of a status, whether it runs at its maximum and each signal's value / target
    (from status.<role>.autoscaler.signals, `name value/target`)."""
    out = []
    for role in contract.ROLES:
        a = (status.get(role) or {}).get("autoscaler")
        if not a:
            continue
        top = a.get("currentReplicas") is not None and a["currentReplicas"] >= (a.get("maxReplicas") or 0)
        signals = []
        for text in a.get("signals") or []:
            name, _, frac = str(text).partition(" ")
            value, _, target = frac.partition("/")
            try:
                signals.append((name, float(value) / float(target)))
            except (ValueError, ZeroDivisionError):
                continue
        out.append((role, bool(top), tuple(signals)))
    return tuple(out)


def forget(namespace: str, name: str) -> None:
    """Drop every per-CR series of a deleted CR."""
    with PER_CR.lock:
        PER_CR.records.pop((namespace, name), None)


def _initialize() -> None:
    """Export the reconcile series at 0 from startup (as controller-runtime does), so rates and differences work
    before the first error."""
    for result in ("success", "error", "requeue", "requeue_after"):
        RECONCILE_TOTAL.labels(CONTROLLER, result)
    RECONCILE_ERRORS.labels(CONTROLLER)
    TERMINAL_RECONCILE_ERRORS.labels(CONTROLLER)
    RECONCILE_TIME.labels(CONTROLLER)
    ACTIVE_WORKERS.labels(CONTROLLER)
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        API_REQUESTS.labels(method)
    WORKQUEUE_DEPTH.labels(CONTROLLER)
    WORKQUEUE_ADDS.labels(CONTROLLER)
    WORKQUEUE_RETRIES.labels(CONTROLLER)
    WORKQUEUE_QUEUE_DURATION.labels(CONTROLLER)
    WORKQUEUE_WORK_DURATION.labels(CONTROLLER)


_initialize()
