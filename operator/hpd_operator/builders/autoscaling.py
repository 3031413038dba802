"""A HorizontalPodAutoscaler (autoscaling/v2) per autoscaling role of the serving generation, on external metrics
(pure).

The HPA scales the role's Deployment of the generation the router routes to (`<cr>-<role>-<hash>`, named like it)
through its scale subresource; that Deployment, as the operator applies it, leaves `spec.replicas` out
(builders.engine), so the HPA's writes are the only ones (docs/autoscaling.md). A generation that does not serve yet
has no HPA (it runs the serving generation's counts); at the switch its own HPA is created and the old one's pruned. Each signal is an
external metric (api.signals: served by a metrics adapter, e.g. prometheus-adapter with the chart's rules file)
selected by this CR's and role's series labels, held at its per-replica average target. min/max come from
`scaling.compute_bounds` (the user's range, narrowed by spec.ratio where it must).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpd_operator.api.models import AutoscalingSpec, HybridPDDeployment
from hpd_operator.api.names import role_name
from hpd_operator.api.processns import pairs
from hpd_operator.api.signals import SIGNALS, selector
from hpd_operator.builders.common import Manifest
from hpd_operator.builders.engine import generation_metadata
from hpd_operator.generations import Generation
from hpd_operator.scaling import Bounds, signals_of
from hpd_runtime import contract

HPA_API = "autoscaling/v2"


def _quantity(x: float) -> str:
    """A target as a Kubernetes quantity: integers as is, fractions in milli-units (0.7 -> 700m)."""
    if float(x).is_integer():
        return str(int(x))
    return f"{round(x * 1000)}m"


def _metrics(cr: HybridPDDeployment, role: contract.Role, a: AutoscalingSpec) -> list[dict[str, Any]]:
    return [
        {
            "type": "External",
            "external": {
                "metric": {"name": SIGNALS[name].metric, "selector": {"matchLabels": selector(cr.metadata.name, role)}},
                "target": {"type": "AverageValue", "averageValue": _quantity(target)},
            },
        }
        for name, target in signals_of(role, a)
    ]


def _behavior(a: AutoscalingSpec) -> dict[str, Any]:
    """Up: as fast as the signal asks (after its window). Down: after its window, one pod per period, each drained."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": a.scale_up_stabilization_seconds,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 15},
                {"type": "Pods", "value": 4, "periodSeconds": 15},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": a.scale_down_stabilization_seconds,
            "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": a.scale_down_period_seconds}],
        },
    }


def build_autoscaler(cr: HybridPDDeployment, role: contract.Role, bounds: Bounds, gen: Generation) -> Manifest:
    """The HPA of one role of generation `gen` (the serving one), named like the Deployment it scales: with pair pods
    decode's HPA scales the pair Deployment (`<cr>-pair-<gen>`) on decode's signals."""
    a = cr.spec.role(role).autoscaling
    assert a is not None
    target = contract.COMPONENT_PAIR if pairs(cr.spec.kv_transfer) else role
    name = role_name(cr.metadata.name, target, gen.hash)
    return {
        "apiVersion": HPA_API,
        "kind": "HorizontalPodAutoscaler",
        "metadata": generation_metadata(cr, target, gen),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": bounds.min_replicas,
            "maxReplicas": bounds.max_replicas,
            "metrics": _metrics(cr, role, a),
            "behavior": _behavior(a),
        },
    }


def default_bounds(cr: HybridPDDeployment) -> dict[str, Bounds]:
    """Each autoscaling role's own range (what `render` shows: no observed state, no ratio narrowing)."""
    out: dict[str, Bounds] = {}
    for role in contract.ROLES:
        a = cr.spec.role(role).autoscaling
        if a is not None:
            out[role] = Bounds(a.min_replicas, a.max_replicas)
    return out


def build_autoscalers(
    cr: HybridPDDeployment, gen: Generation, bounds: Mapping[str, Bounds] | None = None
) -> list[Manifest]:
    """One HPA per autoscaling role of generation `gen` (the serving one); `bounds` from scaling.compute_bounds
    (default: the user's ranges)."""
    have = dict(bounds) if bounds is not None else default_bounds(cr)
    defaults = default_bounds(cr)
    return [
        build_autoscaler(cr, role, have.get(role) or defaults[role], gen)
        for role in contract.ROLES
        if cr.spec.role(role).autoscaling is not None
    ]
