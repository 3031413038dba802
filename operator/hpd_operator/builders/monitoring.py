"""PodMonitors (Prometheus Operator) for the engines and the router, when spec.monitoring.podMonitor."""

from __future__ import annotations

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.builders.common import Manifest, instance_label, metadata, short_name
from hpd_runtime import contract

PODMONITOR_API = "monitoring.coreos.com/v1"


def build_pod_monitors(cr: HybridPDDeployment) -> list[Manifest]:
    if not cr.spec.monitoring.pod_monitor:
        return []
    name, ns, interval = cr.metadata.name, cr.metadata.namespace, cr.spec.monitoring.interval
    engines: Manifest = {
        "apiVersion": PODMONITOR_API,
        "kind": "PodMonitor",
        "metadata": metadata(name, ns, short_name(name, "engines"), "engines"),
        "spec": {
            "selector": {
                "matchLabels": {contract.LABEL_INSTANCE: instance_label(name)},
                "matchExpressions": [
                    {"key": contract.LABEL_COMPONENT, "operator": "In", "values": list(contract.ROLES)}
                ],
            },
            "podMetricsEndpoints": [
                {"port": contract.PORT_NAME_HTTP, "path": contract.PATH_METRICS, "interval": interval},
                {"port": contract.PORT_NAME_RUNTIME, "path": contract.PATH_METRICS, "interval": interval},
            ],
        },
    }
    router: Manifest = {
        "apiVersion": PODMONITOR_API,
        "kind": "PodMonitor",
        "metadata": metadata(name, ns, short_name(name, contract.COMPONENT_ROUTER), contract.COMPONENT_ROUTER),
        "spec": {
            "selector": {
                "matchLabels": {
                    contract.LABEL_INSTANCE: instance_label(name),
                    contract.LABEL_COMPONENT: contract.COMPONENT_ROUTER,
                }
            },
            "podMetricsEndpoints": [
                {"port": contract.PORT_NAME_ROUTER_METRICS, "path": contract.PATH_METRICS, "interval": interval}
            ],
        },
    }
    return [engines, router]
