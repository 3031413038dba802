"""NetworkPolicies per CR (spec.networkPolicy), pure.

Engines (`<cr>-engines`): ingress from the router pods on the vLLM API port, from the engines of the same CR on
any port (the API for the pair check, the NIXL side channel, and UCX, which listens on ephemeral ports over TCP;
RDMA traffic bypasses NetworkPolicy anyway), and from Prometheus on the runtime port only: vLLM's API port serves
completions to anyone who reaches it, and Prometheus' peer is a label any tenant can put on a pod (in any namespace
by default), so vLLM's own metrics are scraped where the runtime relays them (`/vllm/metrics`, GET only).
With restrictEgress: egress only to DNS, the same CR's engines and HTTPS.
Router (`<cr>-router`): ingress from anyone on the endpoint port (it is the endpoint), from Prometheus on its
metrics port; egress open (it watches pods through the apiserver, which no pod selector can name).
Kubelet probes come from the node, which the common network plugins always admit.
"""

from __future__ import annotations

from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import instance_label, selector_labels, short_name
from hpd_operator.api.processns import pairs
from hpd_operator.builders.common import Manifest, metadata
from hpd_runtime import contract

NETWORK_POLICY_API = "networking.k8s.io/v1"
DNS_PORT = 53
HTTPS_PORT = 443


def engines_selector(cr_name: str, paired: bool = False) -> dict[str, Any]:
    """The CR's engine pods: its role pods, or its pair pods (`paired`: spec.kvTransfer.processNamespace Pair)."""
    values = [contract.COMPONENT_PAIR] if paired else list(contract.ROLES)
    return {
        "matchLabels": {contract.LABEL_INSTANCE: instance_label(cr_name)},
        "matchExpressions": [{"key": contract.LABEL_COMPONENT, "operator": "In", "values": values}],
    }


def _engine_ports(cr: HybridPDDeployment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(what the CR's router may reach, what Prometheus may reach) on the engine pods, by port name: vLLM's API and the
    runtime's; a pair pod's router takes the API's place, and Prometheus also reaches decode's runtime and the in-pod
    router's metrics."""
    if pairs(cr.spec.kv_transfer):
        scraped = (contract.PORT_NAME_RUNTIME, contract.PORT_NAME_DECODE_RUNTIME, contract.PORT_NAME_ROUTER_METRICS)
        return _tcp(contract.PORT_NAME_PAIR_ROUTER), _tcp(*scraped)
    return _tcp(contract.PORT_NAME_HTTP), _tcp(contract.PORT_NAME_RUNTIME)


def _prometheus_peer(cr: HybridPDDeployment) -> dict[str, Any]:
    p = cr.spec.network_policy.prometheus
    return {"namespaceSelector": dict(p.namespace_selector), "podSelector": dict(p.pod_selector)}


def _tcp(*ports: int | str) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def build_engines_network_policy(cr: HybridPDDeployment) -> Manifest:
    name, ns = cr.metadata.name, cr.metadata.namespace
    paired = pairs(cr.spec.kv_transfer)
    engines = {"podSelector": engines_selector(name, paired)}
    routed, scraped = _engine_ports(cr)
    spec: dict[str, Any] = {
        "podSelector": engines_selector(name, paired),
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [{"podSelector": {"matchLabels": selector_labels(name, contract.COMPONENT_ROUTER)}}],
                "ports": routed,
            },
            {"from": [engines]},
            {"from": [_prometheus_peer(cr)], "ports": scraped},
        ],
    }
    if cr.spec.network_policy.restrict_egress:
        spec["policyTypes"].append("Egress")
        spec["egress"] = [
            {"ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]},
            {"to": [engines]},
            {"ports": _tcp(HTTPS_PORT)},
        ]
    return {
        "apiVersion": NETWORK_POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": metadata(name, ns, short_name(name, "engines"), "engines"),
        "spec": spec,
    }


def build_router_network_policy(cr: HybridPDDeployment) -> Manifest:
    name, ns = cr.metadata.name, cr.metadata.namespace
    comp = contract.COMPONENT_ROUTER
    return {
        "apiVersion": NETWORK_POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": metadata(name, ns, short_name(name, comp), comp),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name, comp)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": _tcp(contract.PORT_NAME_HTTP)},
                {"from": [_prometheus_peer(cr)], "ports": _tcp(contract.PORT_NAME_ROUTER_METRICS)},
            ],
        },
    }


def build_network_policies(cr: HybridPDDeployment) -> list[Manifest]:
    if not cr.spec.network_policy.enabled:
        return []
    return [build_engines_network_policy(cr), build_router_network_policy(cr)]
