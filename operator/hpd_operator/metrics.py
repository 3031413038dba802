"""Prometheus metrics of the operator (served by `run --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from hpd_operator.conditions import Phase

RECONCILES = Counter("hpd_operator_reconciles_total", "Reconciles by trigger and result", ["trigger", "result"])
RECONCILE_SECONDS = Histogram(
    "hpd_operator_reconcile_duration_seconds",
    "Reconcile duration by result",
    ["result"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CHILDREN_APPLIED = Counter("hpd_operator_children_applied_total", "Child objects applied or pruned", ["kind", "action"])
CRS_BY_PHASE = Gauge("hpd_operator_crs", "HybridPDDeployments by phase", ["phase"])
READY_REPLICAS = Gauge(
    "hpd_operator_ready_replicas", "Ready replicas per CR and component", ["namespace", "name", "component"]
)
DESIRED_REPLICAS = Gauge(
    "hpd_operator_desired_replicas", "Desired replicas per CR and component", ["namespace", "name", "component"]
)
API_ERRORS = Counter("hpd_operator_api_errors_total", "Kubernetes API errors by operation and status", ["op", "status"])

PHASES = tuple(str(p) for p in Phase)
_phase_of: dict[tuple[str, str], str] = {}


def set_phase(namespace: str, name: str, phase: str | None) -> None:
    """Track one CR's phase (None = forget it) and refresh the per-phase gauge."""
    if phase is None:
        _phase_of.pop((namespace, name), None)
    else:
        _phase_of[(namespace, name)] = phase
    for p in PHASES:
        CRS_BY_PHASE.labels(phase=p).set(sum(1 for v in _phase_of.values() if v == p))


def forget(namespace: str, name: str) -> None:
    set_phase(namespace, name, None)
    for comp in ("prefill", "decode", "router"):
        for g in (READY_REPLICAS, DESIRED_REPLICAS):
            try:
                g.remove(namespace, name, comp)
            except KeyError:
                pass
