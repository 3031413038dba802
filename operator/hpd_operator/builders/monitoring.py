"""PodMonitors (Prometheus Operator) for the engines and the router, when spec.monitoring.podMonitor.

Every scraped series gets `role` (prefill, decode or router: the pod's component label, not a pod-name regex) and
`hybridpddeployment` (the CR's full name, also on the operator's per-CR series), besides the `namespace`, `pod` and
`container` labels the Prometheus Operator adds. The dashboard and the alert rules select on these labels.

Both engine endpoints are on the runtime port: the runtime's own `/metrics` and vLLM's metrics, which the runtime
relays at `/vllm/metrics` (hpd_runtime.readiness), so Prometheus never needs vLLM's API port, which also serves
completions (builders/network.py admits it on the runtime port only). Two endpoints on one port would give their
targets the same `job`, `instance` and `endpoint` labels (the Prometheus Operator sets `endpoint` to the port name)
and their `up` series would collide: the vLLM endpoint's `endpoint` label is relabeled to `vllm`.
"""

from __future__ import annotations

from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import instance_label, short_name
from hpd_operator.api.processns import pairs
from hpd_operator.builders.common import Manifest, metadata
from hpd_runtime import contract

PODMONITOR_API = "monitoring.coreos.com/v1"
ROLE_LABEL = "role"
"""The metric label that carries prefill/decode/router."""
CR_LABEL = "hybridpddeployment"
"""The metric label that carries the owning HybridPDDeployment's name."""
ENDPOINT_LABEL = "endpoint"
"""The Prometheus Operator's per-endpoint target label (the port name unless a relabeling sets it)."""
VLLM_ENDPOINT = "vllm"
"""`endpoint` of the vLLM metrics target (it shares the runtime port with the runtime's own metrics)."""


def _meta_label(pod_label: str) -> str:
    """The Prometheus service-discovery meta label of a pod label (non-alphanumerics become `_`)."""
    return "__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() else "_" for ch in pod_label)


def relabelings(cr_name: str) -> list[dict[str, Any]]:
    """Pod label app.kubernetes.io/component -> `role`; the CR name -> `hybridpddeployment`."""
    return [
        {"action": "replace", "sourceLabels": [_meta_label(contract.LABEL_COMPONENT)], "targetLabel": ROLE_LABEL},
        {"action": "replace", "targetLabel": CR_LABEL, "replacement": cr_name},
    ]


PAIR_ROUTER_ROLE = "pair-router"
"""`role` of a pair pod's in-pod router's series (the CR's router keeps `router`)."""


def _endpoint(
    cr: HybridPDDeployment,
    port: str,
    path: str = contract.PATH_METRICS,
    endpoint_label: str | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    """One scrape endpoint; `role`: the series' role when the pod's component does not say it (a pair pod holds
    both engines and a router: each endpoint names its own)."""
    relabel = relabelings(cr.metadata.name)
    if role is not None:
        relabel.append({"action": "replace", "targetLabel": ROLE_LABEL, "replacement": role})
    if endpoint_label is not None:
        relabel.append({"action": "replace", "targetLabel": ENDPOINT_LABEL, "replacement": endpoint_label})
    return {"port": port, "path": path, "interval": cr.spec.monitoring.interval, "relabelings": relabel}


def _pod_monitor(cr: HybridPDDeployment, suffix: str, component: str, spec: dict[str, Any]) -> Manifest:
    md = metadata(cr.metadata.name, cr.metadata.namespace, short_name(cr.metadata.name, suffix), component)
    md["labels"] = {**cr.spec.monitoring.labels, **md["labels"]}
    return {"apiVersion": PODMONITOR_API, "kind": "PodMonitor", "metadata": md, "spec": spec}


def _pair_endpoints(cr: HybridPDDeployment) -> list[dict[str, Any]]:
    """A pair pod's endpoints: each engine's as a role pod's (prefill on `runtime`, decode on `decode-runtime`, each
    series labelled with its role), and the in-pod router's metrics (role `pair-router`)."""
    out = []
    for role, port in (("prefill", contract.PORT_NAME_RUNTIME), ("decode", contract.PORT_NAME_DECODE_RUNTIME)):
        out.append(_endpoint(cr, port, contract.PATH_VLLM_METRICS, VLLM_ENDPOINT, role=role))
        out.append(_endpoint(cr, port, role=role))
    out.append(_endpoint(cr, contract.PORT_NAME_ROUTER_METRICS, role=PAIR_ROUTER_ROLE))
    return out


def build_pod_monitors(cr: HybridPDDeployment) -> list[Manifest]:
    if not cr.spec.monitoring.pod_monitor:
        return []
    inst = instance_label(cr.metadata.name)
    match: list[dict[str, Any]] = [{"key": contract.LABEL_COMPONENT, "operator": "In", "values": list(contract.ROLES)}]
    if any(cr.spec.role(r).multi_node for r in contract.ROLES):
        # the workers of a replica that spans nodes serve no vLLM API (its metrics are the leader's)
        match.append({"key": contract.LABEL_GROUP_ROLE, "operator": "NotIn", "values": [contract.GROUP_WORKER]})
    endpoints = [
        _endpoint(cr, contract.PORT_NAME_RUNTIME, contract.PATH_VLLM_METRICS, VLLM_ENDPOINT),
        _endpoint(cr, contract.PORT_NAME_RUNTIME),
    ]
    if pairs(cr.spec.kv_transfer):
        match = [{"key": contract.LABEL_COMPONENT, "operator": "In", "values": [contract.COMPONENT_PAIR]}]
        endpoints = _pair_endpoints(cr)
    engines = _pod_monitor(
        cr,
        "engines",
        "engines",
        {
            "selector": {"matchLabels": {contract.LABEL_INSTANCE: inst}, "matchExpressions": match},
            "podMetricsEndpoints": endpoints,
        },
    )
    router = _pod_monitor(
        cr,
        contract.COMPONENT_ROUTER,
        contract.COMPONENT_ROUTER,
        {
            "selector": {
                "matchLabels": {contract.LABEL_INSTANCE: inst, contract.LABEL_COMPONENT: contract.COMPONENT_ROUTER}
            },
            "podMetricsEndpoints": [_endpoint(cr, contract.PORT_NAME_ROUTER_METRICS)],
        },
    )
    return [engines, router]
