"""Pair pods (spec.kvTransfer.processNamespace Pair), pure: one Deployment of pods that each hold one prefill engine,
one decode engine and an in-pod router, in one PID namespace of the pod's own (docs/kv-topologies.md).

Why a pod, and why a router inside it: UCX's cuda_ipc opens the peer's CUDA IPC handle only within one PID namespace
(two pods on one node fall back to TCP emulation, 0.47 GB/s on an H200; two containers of one pod with
`shareProcessNamespace: true` kept cuda_ipc, 23.9 GB/s). vllm-router in P/D mode picks a prefill and a decode
independently, so a request could pair the prefill of pod A with the decode of pod B: two PID namespaces again. The
in-pod router pairs only the pod's own engines (static URLs on 127.0.0.1, the NIXL connector as the CR's router uses
it), and the CR's router balances over the pair pods' in-pod routers in vllm-router's regular mode (builders.router):
one endpoint, its health checks, circuit breaker, retries and metrics stay.

The pod: each engine container is what the role's own pod would run (its resources and GPUs, args, env, probes, the
warmup gate; the role's podTemplate merged in), renamed `prefill` / `decode`; decode's ports are its own
(hpd_operator.api.processns.engine_ports: the containers share the pod's network namespace); decode's pair check asks
the pod's own prefill on 127.0.0.1 (the profile). Pod-level fields are merged from both roles' templates: volumes by
name (both engines share /dev/shm, the cache, /tmp and HOME of the pod), nodeSelector and tolerations added together
(validation refuses a nodeSelector key with two values and two different affinities), the rest decode's over
prefill's. hostPID, hostIPC and hostNetwork stay false: Pod Security restricted admits the pod.

Only decode reports the KV path with the kv-reporter ServiceAccount's token: the pod does not automount it (every
container would get it); a projected token volume is mounted into the decode container alone, where the runtime looks
for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import kv_reporter_name, selector_labels
from hpd_operator.builders.common import Manifest, container_security_context, deep_merge, labels
from hpd_operator.builders.engine import (
    CONTAINER_NAME,
    EPHEMERAL_STORAGE,
    STARTUP_PERIOD_SECONDS,
    engine_pod_template,
    generation_metadata,
    reports_kv_path,
    startup_failure_threshold,
)
from hpd_operator.builders.router import PRESTOP_SECONDS, RUN_AS_USER, failover_args, router_resources
from hpd_operator.generations import Generation
from hpd_operator.profile import gemm_warmup_seconds
from hpd_operator.profile_model import Profile
from hpd_runtime import contract

PREFILL_CONTAINER = "prefill"
DECODE_CONTAINER = "decode"
ROUTER_CONTAINER = "router"
ROUTER_COMMAND = ["vllm-router"]
WORKER_STARTUP_CHECK_SECONDS = 5
"""How often the in-pod router asks its engines' /health while it waits for them at start (vllm-router's default is
30 s: the pod would turn Ready up to 30 s after its engines)."""
TOKEN_VOLUME = "kv-reporter-token"
TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the runtime reads the ServiceAccount token and CA (hpd_runtime.kube_events), as an automounted token lies."""
TOKEN_EXPIRATION_SECONDS = 3607
"""The kubelet's own default for an automounted token (it refreshes it at 80% of its life)."""
DECODE_PORT_NAMES: dict[str, str] = {
    contract.PORT_NAME_HTTP: contract.PORT_NAME_DECODE_HTTP,
    contract.PORT_NAME_RUNTIME: contract.PORT_NAME_DECODE_RUNTIME,
    contract.PORT_NAME_SIDE_CHANNEL: contract.PORT_NAME_DECODE_SIDE_CHANNEL,
}
"""Port names are unique within a pod: decode's get their own (prefill keeps the role pods' names)."""


def _engine(template: Mapping[str, Any]) -> dict[str, Any]:
    return dict(next(c for c in template["spec"]["containers"] if c.get("name") == CONTAINER_NAME))


def _decode_container(cr: HybridPDDeployment, container: Mapping[str, Any], reports: bool) -> dict[str, Any]:
    """Decode's engine container in a pair pod: its ports renamed, its liveness probe on its own runtime port, the
    kv-reporter token mounted here alone when it reports the KV path, and no ephemeral-storage request of its own
    unless spec.decode.resources names one: the pod's emptyDirs (the weights' download among them) are shared, and
    prefill's container already requests them (a second request would ask the node for twice the disk)."""
    out = dict(container, name=DECODE_CONTAINER)
    res = cr.spec.decode.resources
    if res is None or EPHEMERAL_STORAGE not in {**(res.requests or {}), **(res.limits or {})}:
        requests = {k: v for k, v in container["resources"]["requests"].items() if k != EPHEMERAL_STORAGE}
        out["resources"] = {**container["resources"], "requests": requests}
    out["ports"] = [{**p, "name": DECODE_PORT_NAMES.get(p["name"], p["name"])} for p in container["ports"]]
    probe = dict(container["livenessProbe"])
    if "httpGet" in probe:
        probe["httpGet"] = {**probe["httpGet"], "port": contract.PORT_NAME_DECODE_RUNTIME}
    out["livenessProbe"] = probe
    if reports:
        mount = {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT, "readOnly": True}
        out["volumeMounts"] = [*container.get("volumeMounts", []), mount]
    return out


def _token_volume() -> dict[str, Any]:
    """What the kubelet would automount, as a volume for one container: the token, the cluster CA, the namespace."""
    return {
        "name": TOKEN_VOLUME,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]
        },
    }


def router_args(cr: HybridPDDeployment) -> list[str]:
    """vllm-router 0.1.17 flags (its wheel's `vllm-router --help`): P/D mode over the pod's own prefill and decode on
    127.0.0.1, with the NIXL connector and the health checks of the CR's router (builders.router.failover_args). It
    listens only once both engines answer /health, and waits for them as long as their startup probe allows."""
    prefill = f"http://{contract.PAIR_LOOPBACK}:{contract.VLLM_PORT}"
    decode = f"http://{contract.PAIR_LOOPBACK}:{contract.PAIR_DECODE_VLLM_PORT}"
    w = cr.spec.warmup
    startup = startup_failure_threshold(w.timeout_seconds, gemm_warmup_seconds(w)) * STARTUP_PERIOD_SECONDS
    return [
        "--host",
        "0.0.0.0",
        "--port",
        str(contract.PAIR_ROUTER_PORT),
        "--vllm-pd-disaggregation",
        "--kv-connector",
        "nixl",
        "--prefill",
        prefill,
        "--decode",
        decode,
        "--policy",
        "round_robin",
        "--worker-startup-timeout-secs",
        str(startup),
        "--worker-startup-check-interval",
        str(WORKER_STARTUP_CHECK_SECONDS),
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(contract.PAIR_ROUTER_METRICS_PORT),
        "--health-check-endpoint",
        contract.PATH_VLLM_HEALTH,
        *failover_args(),
    ]


def _router_container(cr: HybridPDDeployment) -> dict[str, Any]:
    """The in-pod router: the CR's router image, Ready (`/readiness`) while both engines answer its health checks.
    It opens its port only once both engines are healthy, so a startup probe as long as the engines' covers the
    wait before liveness counts."""
    w = cr.spec.warmup
    startup = startup_failure_threshold(w.timeout_seconds, gemm_warmup_seconds(w))
    port = contract.PORT_NAME_PAIR_ROUTER

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures}

    return {
        "name": ROUTER_CONTAINER,
        "image": cr.spec.router.image,
        "command": list(ROUTER_COMMAND),
        "args": router_args(cr),
        "ports": [
            {"name": port, "containerPort": contract.PAIR_ROUTER_PORT, "protocol": "TCP"},
            {
                "name": contract.PORT_NAME_ROUTER_METRICS,
                "containerPort": contract.PAIR_ROUTER_METRICS_PORT,
                "protocol": "TCP",
            },
        ],
        "startupProbe": probe("/liveness", STARTUP_PERIOD_SECONDS, startup),
        "readinessProbe": probe("/readiness", 5, 3),
        "livenessProbe": probe("/liveness", 10, 6),
        "resources": router_resources(cr),
        "securityContext": container_security_context(RUN_AS_USER, readOnlyRootFilesystem=True),
        # the CR's router drops a leaving pair pod at its deletion; meanwhile requests still arriving are paired
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }


def _pod_spec(cr: HybridPDDeployment, prefill: Mapping[str, Any], decode: Mapping[str, Any]) -> dict[str, Any]:
    """The pair pod's spec from both roles' pod specs (see the module doc for the merge)."""
    reports = reports_kv_path(cr, "decode", None)
    pod: dict[str, Any] = deep_merge(dict(prefill), {k: v for k, v in decode.items() if k != "tolerations"})
    tolerations = list(prefill.get("tolerations") or [])
    tolerations += [t for t in decode.get("tolerations") or [] if t not in tolerations]
    if tolerations:
        pod["tolerations"] = tolerations
    pod["containers"] = [
        dict(_engine({"spec": prefill}), name=PREFILL_CONTAINER),
        _decode_container(cr, _engine({"spec": decode}), reports),
        _router_container(cr),
    ]
    pod["shareProcessNamespace"] = True
    pod["automountServiceAccountToken"] = False
    if reports:
        pod["serviceAccountName"] = kv_reporter_name(cr.metadata.name)
        pod["volumes"] = [*pod.get("volumes", []), _token_volume()]
    return pod


def pair_pod_template(cr: HybridPDDeployment, profile: Profile) -> dict[str, Any]:
    """The pair pod's template without any generation in it (what the generation hash is computed from)."""
    p = engine_pod_template(cr, profile, "prefill")
    d = engine_pod_template(cr, profile, "decode")
    merged_labels = {**p["metadata"]["labels"], **d["metadata"]["labels"]}
    merged_labels.pop(contract.LABEL_ROLE, None)  # the pod holds both roles: its component says so
    md: dict[str, Any] = {"labels": {**merged_labels, **labels(cr.metadata.name, contract.COMPONENT_PAIR)}}
    annotations = {**(p["metadata"].get("annotations") or {}), **(d["metadata"].get("annotations") or {})}
    if annotations:
        md["annotations"] = annotations
    return {"metadata": md, "spec": _pod_spec(cr, p["spec"], d["spec"])}


def build_pair_pdb(cr: HybridPDDeployment, gen: Generation) -> Manifest | None:
    """One voluntary disruption at a time (a pair pod: one prefill and one decode), only with >= 2 pair pods (or
    decode's autoscaling up to >= 2), as a role's own PodDisruptionBudget."""
    rs = cr.spec.decode
    most = rs.autoscaling.max_replicas if rs.autoscaling is not None else rs.replicas
    if most < 2:
        return None
    comp = contract.COMPONENT_PAIR
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": generation_metadata(cr, comp, gen),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(cr.metadata.name, comp, gen.hash)}},
    }
