"""The router: vllm-router in vLLM NIXL P/D mode with Kubernetes discovery, its RBAC and the `<cr>` Service.

The router routes to one generation (hpd_operator.generations): both discovery selectors name its hash, and its pods
carry it as a label. Moving traffic to a new generation changes the selectors, so the Deployment rolls: a new router
pod starts and discovers only the new generation's Ready pods; once it is Ready (vllm-router's /readiness needs a
prefill and a decode) the old router pod is taken out of the Service's endpoints, waits PRESTOP_SECONDS for that to
reach every node, and gets SIGTERM: vllm-router then stops accepting and finishes its in-flight requests (graceful
shutdown) within spec.router.drainSeconds. No router pod ever selects two generations.

In P/D mode the router pod has a second container, the retry proxy (HAProxy, images/router/retry.cfg): it holds the
endpoint port and sends a request the router failed before answering (a crashed prefill or decode still in its
choice) to the router again, spec.router.retries times; vllm-router 0.1.17 retries nothing in P/D mode."""

from __future__ import annotations

from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import endpoint_service_name, router_name, selector_labels, serving_selector
from hpd_operator.api.processns import pairs
from hpd_operator.builders.common import POD_SECURITY_DEFAULTS, Manifest, container_security_context, labels, metadata
from hpd_operator.builders.fallback import Fallback
from hpd_operator.generations import Generation
from hpd_runtime import contract

CONTAINER_NAME = "router"
COMMAND = ["vllm-router"]
RUN_AS_USER = contract.IMAGE_UID
DEFAULT_REQUESTS: dict[str, str] = {"cpu": "250m", "memory": "128Mi"}
DEFAULT_LIMITS: dict[str, str] = {"memory": "512Mi"}
"""The router's resources unless spec.router.resources names them (per resource: a user's cpu or memory, request or
limit, replaces both defaults of that resource). With none the router pod was BestEffort: the first pod the kubelet
evicts under memory pressure, and the CR's only entry point. Sized from vllm-router 0.1.17 (PyPI wheel) measured on
loopback in P/D mode against stand-in engines (12 KB prompts, 1 KB answers): RSS 79 MiB idle, 95 MiB after 3000
requests at 64 concurrent, 137 MiB peak at 256 concurrent; 1.7 ms of CPU per request. The request holds the idle
process plus a moderate load; the limit (3.7x the peak) leaves room for long prompts, which the router buffers. No
CPU limit: throttling the router adds latency to every request."""
PRESTOP_SECONDS = 5
"""A replaced router pod keeps serving this long before its SIGTERM: the time for its removal from the Service's
endpoints to reach kube-proxy (or the cloud load balancer) everywhere, so no new connection meets a closed port."""


def _selector_args(cr_name: str, role: str, gen: Generation) -> list[str]:
    """The pods that serve a role's API in `gen`: every pod, or the leaders of replicas that span nodes (in that
    generation: a generation that still serves may have another shape than the spec's)."""
    sel = serving_selector(cr_name, role, gen.hash, role in gen.groups)
    return [f"{k}={v}" for k, v in sel.items()]


def _pair_discovery_args(cr: HybridPDDeployment, gen: Generation) -> list[str]:
    """Pair pods (spec.kvTransfer.processNamespace Pair): vllm-router's regular mode over the pair pods of `gen`, each
    a worker at its in-pod router's port (builders.pair), which pairs the pod's own prefill and decode. Not P/D mode:
    that picks prefill and decode independently and would pair halves of two pods (two PID namespaces: tcp
    emulation). In regular mode the router's retries and circuit breaker act on a failed pair pod."""
    sel = selector_labels(cr.metadata.name, contract.COMPONENT_PAIR, gen.hash)
    return [
        "--policy",
        cr.spec.router.policy,
        "--service-discovery",
        "--service-discovery-port",
        str(contract.PAIR_ROUTER_PORT),
        "--selector",
        *[f"{k}={v}" for k, v in sel.items()],
    ]


def retrying(cr: HybridPDDeployment) -> bool:
    """The router pod runs the retry proxy: P/D mode (pair pods' regular mode retries on its own) and retries > 0."""
    return not pairs(cr.spec.kv_transfer) and cr.spec.router.retries > 0


def router_port(cr: HybridPDDeployment) -> int:
    """Where vllm-router listens: behind the retry proxy, or on the endpoint port itself."""
    return contract.ROUTER_BACKEND_PORT if retrying(cr) else contract.ROUTER_PORT


def router_args(cr: HybridPDDeployment, gen: Generation) -> list[str]:
    """vllm-router 0.1.17 flags (read from `vllm-router --help` of the wheel); discovery selects `gen` only."""
    name, ns = cr.metadata.name, cr.metadata.namespace
    if pairs(cr.spec.kv_transfer):
        args = ["--host", "0.0.0.0", "--port", str(contract.ROUTER_PORT), *_pair_discovery_args(cr, gen)]
        return args + _common_args(ns)
    args = [
        "--host",
        "0.0.0.0",
        "--port",
        str(router_port(cr)),
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
        *_selector_args(name, "prefill", gen),
        "--decode-selector",
        *_selector_args(name, "decode", gen),
    ]
    return args + _common_args(ns)


def _common_args(ns: str | None) -> list[str]:
    """The discovery namespace, metrics and health checks, in either mode."""
    return [
        *(["--service-discovery-namespace", ns] if ns else []),
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(contract.ROUTER_METRICS_PORT),
        "--health-check-endpoint",
        contract.PATH_VLLM_HEALTH,
        *failover_args(),
    ]


HEALTH_CHECK_INTERVAL_SECONDS = 1
"""vllm-router's health checker: one checker for the whole registry, on this interval (whole seconds; 1 is its
floor). Its Kubernetes discovery already drops a pod that turns NotReady or is being deleted (0.1.17
service_discovery.rs handle_pod_event; router#279 was 0.1.15's), and the engine's container exits with vLLM, so a
crashed engine usually leaves on its pod's NotReady first; the health checker is the backstop for an engine that
hangs with its pod still Ready. The parser's default is 60 s: half the requests failed for minutes against a dead
decode of two. Every second costs one GET /health per engine."""
HEALTH_FAILURE_THRESHOLD = 2
"""Two consecutive failures. vllm-router 0.1.17 applies this and the timeout below only to static --prefill/--decode
workers: workers it discovers get its built-in health config (pd_router.rs add_server passes none: 3 failures, 5 s
timeout). Rendered anyway, so a router that passes them on uses them."""
HEALTH_CHECK_TIMEOUT_SECONDS = 2
"""A hung engine (alive, not answering) counts as failing after 2 s; vLLM's /health only asks its engine client
whether the engine core died (no request queue in between), so a busy engine answers well within this."""


def failover_args() -> list[str]:
    """The health-check flags that make a dead prefill or decode leave the router's choice within seconds (see
    HEALTH_CHECK_INTERVAL_SECONDS); the success threshold stays at its default (2 checks to come back)."""
    return [
        "--health-check-interval-secs",
        str(HEALTH_CHECK_INTERVAL_SECONDS),
        "--health-failure-threshold",
        str(HEALTH_FAILURE_THRESHOLD),
        "--health-check-timeout-secs",
        str(HEALTH_CHECK_TIMEOUT_SECONDS),
    ]


RETRY_CONTAINER_NAME = "retry"
RETRY_COMMAND = ["dumb-init", "--rewrite", "15:10", "haproxy", "-db", "-f", contract.ROUTER_RETRY_CONFIG]
"""HAProxy in the foreground under dumb-init, which turns the kubelet's SIGTERM into SIGUSR1: HAProxy's graceful stop
(stop listening, finish the requests in flight); on SIGTERM itself HAProxy would cut them."""
RETRY_REQUESTS: dict[str, str] = {"cpu": "100m", "memory": "64Mi"}
RETRY_LIMITS: dict[str, str] = {"memory": "1Gi"}
"""The retry proxy's resources (spec.router.resources is the router container's). Idle HAProxy is about 10 MiB; each
request in flight holds up to two 256 KiB buffers (retry.cfg tune.bufsize) and maxconn is 2048. No CPU limit, as for
the router."""


def _retry_container(cr: HybridPDDeployment) -> dict[str, Any]:
    """The retry proxy on the endpoint port, in front of vllm-router on ROUTER_BACKEND_PORT (same image)."""

    def health() -> dict[str, Any]:
        return {"httpGet": {"path": contract.PATH_RETRY_HEALTH, "port": contract.PORT_NAME_HTTP}}

    return {
        "name": RETRY_CONTAINER_NAME,
        "image": cr.spec.router.image,
        "command": list(RETRY_COMMAND),
        "env": [
            {"name": contract.ENV_RETRY_PORT, "value": str(contract.ROUTER_PORT)},
            {"name": contract.ENV_RETRY_ROUTER_PORT, "value": str(contract.ROUTER_BACKEND_PORT)},
            {"name": contract.ENV_RETRY_HOLD_PORT, "value": str(contract.ROUTER_RETRY_HOLD_PORT)},
            {"name": contract.ENV_RETRIES, "value": str(cr.spec.router.retries)},
        ],
        "ports": [{"name": contract.PORT_NAME_HTTP, "containerPort": contract.ROUTER_PORT, "protocol": "TCP"}],
        "readinessProbe": {**health(), "periodSeconds": 5},
        "livenessProbe": {**health(), "periodSeconds": 10, "failureThreshold": 6},
        "securityContext": container_security_context(RUN_AS_USER, readOnlyRootFilesystem=True),
        # as the router's: out of the Service's endpoints everywhere before it stops listening
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "resources": {"limits": dict(RETRY_LIMITS), "requests": dict(RETRY_REQUESTS)},
    }


def _router_container(cr: HybridPDDeployment, gen: Generation) -> dict[str, Any]:
    r = cr.spec.router
    # behind the retry proxy the router's API port has its own name: `http` (the Service's target) is the proxy's
    api_port = contract.PORT_NAME_ROUTER_BACKEND if retrying(cr) else contract.PORT_NAME_HTTP
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": r.image,
        "command": list(COMMAND),
        "args": router_args(cr, gen),
        "ports": [
            {"name": api_port, "containerPort": router_port(cr), "protocol": "TCP"},
            {
                "name": contract.PORT_NAME_ROUTER_METRICS,
                "containerPort": contract.ROUTER_METRICS_PORT,
                "protocol": "TCP",
            },
        ],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": api_port}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/liveness", "port": api_port},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": container_security_context(RUN_AS_USER, readOnlyRootFilesystem=True),
        # kubelet's own sleep (Kubernetes >= 1.30): no shell needed in the image
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }
    container["resources"] = router_resources(cr)
    return container


def router_resources(cr: HybridPDDeployment) -> dict[str, Any]:
    """spec.router.resources over DEFAULT_REQUESTS/DEFAULT_LIMITS: a resource the user names in either list keeps
    only the user's values (a default request above the user's limit would be refused)."""
    res = cr.spec.router.resources
    limits: dict[str, Any] = dict(res.limits or {}) if res else {}
    requests: dict[str, Any] = dict(res.requests or {}) if res else {}
    named = set(limits) | set(requests)
    for key, value in DEFAULT_REQUESTS.items():
        if key not in named:
            requests[key] = value
    for key, value in DEFAULT_LIMITS.items():
        if key not in named:
            limits[key] = value
    return {"limits": limits, "requests": requests}


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
                    # the router first: its discovery args are what the rollout reads of a router pod
                    "containers": [container, *([_retry_container(cr)] if retrying(cr) else [])],
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


def build_router_pdb(cr: HybridPDDeployment) -> Manifest | None:
    """One voluntary disruption at a time once the router has >= 2 replicas, so a node drain never takes the CR's
    endpoint away; None with one replica (a PDB would block every drain or protect nothing: one router is a single
    point of failure, docs/install.md)."""
    name, ns, r = cr.metadata.name, cr.metadata.namespace, cr.spec.router
    if r.replicas < 2:
        return None
    comp = contract.COMPONENT_ROUTER
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(name, ns, router_name(name), comp),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(name, comp)}},
    }


def build_router_service(cr: HybridPDDeployment, fallback: Fallback | None = None) -> Manifest:
    """`<cr>`, the endpoint: the router pods; in degraded mode (hpd_operator.builders.fallback) the serving role's
    pods of the routed generation, directly (their vLLM port is named like the router's: the targetPort holds)."""
    name, ns, svc = cr.metadata.name, cr.metadata.namespace, cr.spec.router.service
    comp = contract.COMPONENT_ROUTER
    selector = fallback.selector(name) if fallback is not None else selector_labels(name, comp)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, ns, endpoint_service_name(name), comp),
        "spec": {
            "type": svc.type,
            "selector": selector,
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
