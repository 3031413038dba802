"""The router: vllm-router in vLLM NIXL P/D mode with Kubernetes discovery, its RBAC and the `<cr>` Service.

The router routes to one generation (hpd_operator.generations): both discovery selectors name its hash, and its pods
carry it as a label. Moving traffic to a new generation changes the selectors, so the Deployment rolls: a new router
pod starts and discovers only the new generation's Ready pods; once it is Ready (vllm-router's /readiness needs a
prefill and a decode) the old router pod is taken out of the Service's endpoints, waits PRESTOP_SECONDS for that to
reach every node, and gets SIGTERM: vllm-router then stops accepting and finishes its in-flight requests (graceful
shutdown) within spec.router.drainSeconds. No router pod ever selects two generations."""

from __future__ import annotations

from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import endpoint_service_name, router_name, selector_labels
from hpd_operator.builders.common import POD_SECURITY_DEFAULTS, Manifest, container_security_context, labels, metadata
from hpd_operator.generations import Generation
from hpd_runtime import contract

CONTAINER_NAME = "router"
COMMAND = ["vllm-router"]
RUN_AS_USER = 1000
PRESTOP_SECONDS = 5
"""A replaced router pod keeps serving this long before its SIGTERM: the time for its removal from the Service's
endpoints to reach kube-proxy (or the cloud load balancer) everywhere, so no new connection meets a closed port."""


def _selector_args(cr_name: str, role: str, generation: str) -> list[str]:
    return [f"{k}={v}" for k, v in selector_labels(cr_name, role, generation).items()]


def router_args(cr: HybridPDDeployment, gen: Generation) -> list[str]:
    """vllm-router 0.1.17 flags (read from `vllm-router --help` of the wheel); discovery selects `gen` only."""
    name, ns = cr.metadata.name, cr.metadata.namespace
    args = [
        "--host",
        "0.0.0.0",
        "--port",
        str(contract.ROUTER_PORT),
        "--vllm-pd-disaggregation",
        "--kv-connector",
        "nixl",
        "--policy",
        cr.spec.router.policy,
        "--service-discovery",
        # The parser's default is 80: always set it.
        "--service-discovery-port",
        str(contract.VLLM_PORT),
        "--prefill-selector",
        *_selector_args(name, "prefill", gen.hash),
        "--decode-selector",
        *_selector_args(name, "decode", gen.hash),
    ]
    if ns:
        args += ["--service-discovery-namespace", ns]
    args += [
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(contract.ROUTER_METRICS_PORT),
        "--health-check-endpoint",
        contract.PATH_VLLM_HEALTH,
    ]
    return args


def _router_container(cr: HybridPDDeployment, gen: Generation) -> dict[str, Any]:
    r = cr.spec.router
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": r.image,
        "command": list(COMMAND),
        "args": router_args(cr, gen),
        "ports": [
            {"name": contract.PORT_NAME_HTTP, "containerPort": contract.ROUTER_PORT, "protocol": "TCP"},
            {
                "name": contract.PORT_NAME_ROUTER_METRICS,
                "containerPort": contract.ROUTER_METRICS_PORT,
                "protocol": "TCP",
            },
        ],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": contract.PORT_NAME_HTTP}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/liveness", "port": contract.PORT_NAME_HTTP},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": container_security_context(RUN_AS_USER, readOnlyRootFilesystem=True),
        # kubelet's own sleep (Kubernetes >= 1.30): no shell needed in the image
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }
    if r.resources is not None:
        res: dict[str, Any] = {}
        if r.resources.limits:
            res["limits"] = dict(r.resources.limits)
        if r.resources.requests:
            res["requests"] = dict(r.resources.requests)
        container["resources"] = res
    return container


def build_router_deployment(cr: HybridPDDeployment, gen: Generation) -> Manifest:
    """The router Deployment routing to `gen` (its selector stays instance + component: Deployment selectors are
    immutable; the generation is in the pods' labels and the discovery args)."""
    name, ns, r = cr.metadata.name, cr.metadata.namespace, cr.spec.router
    comp = contract.COMPONENT_ROUTER
    container = _router_container(cr, gen)
    md = metadata(name, ns, router_name(name), comp)
    md["labels"].update(gen.labels())
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": md,
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": selector_labels(name, comp)},
            # A new router pod must be Ready (it discovered a prefill and a decode of its generation) before an old
            # one is taken away: the endpoint never loses capacity while traffic moves between generations.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {**labels(name, comp), **gen.labels()}},
                "spec": {
                    "serviceAccountName": router_name(name),
                    # PRESTOP_SECONDS, then vllm-router's graceful shutdown finishes the requests in flight
                    "terminationGracePeriodSeconds": PRESTOP_SECONDS + r.drain_seconds,
                    # the router's Kubernetes discovery watches pods with this token (engines get none)
                    "automountServiceAccountToken": True,
                    **POD_SECURITY_DEFAULTS,
                    "containers": [container],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS_USER,
                        "runAsGroup": RUN_AS_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                },
            },
        },
    }


def build_router_service(cr: HybridPDDeployment) -> Manifest:
    name, ns, svc = cr.metadata.name, cr.metadata.namespace, cr.spec.router.service
    comp = contract.COMPONENT_ROUTER
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, ns, endpoint_service_name(name), comp),
        "spec": {
            "type": svc.type,
            "selector": selector_labels(name, comp),
            "ports": [
                {
                    "name": contract.PORT_NAME_HTTP,
                    "port": svc.port,
                    "targetPort": contract.PORT_NAME_HTTP,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_router_rbac(cr: HybridPDDeployment) -> list[Manifest]:
    """ServiceAccount + Role (get/list/watch pods: the discovery watch) + RoleBinding."""
    name, ns = cr.metadata.name, cr.metadata.namespace
    comp = contract.COMPONENT_ROUTER
    rn = router_name(name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(name, ns, rn, comp)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(name, ns, rn, comp),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(name, ns, rn, comp),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": rn},
            "subjects": [{"kind": "ServiceAccount", "name": rn, **({"namespace": ns} if ns else {})}],
        },
    ]
