"""Prefill/decode Deployments, their headless Services and PodDisruptionBudgets, one set per generation (pure).

`engine_pod_template` is what a generation is made of (its hash is the generation's id, hpd_operator.generations);
the per-generation builders add the generation's labels, names and selectors to it and point decode's pair check at
its own generation's prefill Service."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from hpd_operator.api.models import HybridPDDeployment, ResourceRequirements
from hpd_operator.api.names import (
    kv_reporter_name,
    prefill_service_host,
    role_name,
    selector_labels,
    serving_selector,
)
from hpd_operator.api.paircheck import pair_check
from hpd_operator.api.processns import engine_ports
from hpd_operator.builders.common import (
    POD_SECURITY_DEFAULTS,
    Manifest,
    container_security_context,
    deep_merge,
    host_namespaces,
    labels,
    metadata,
)
from hpd_operator.generations import Generation
from hpd_operator.modelinfo import HOME_SIZE_LIMIT_GIB, TMP_SIZE_LIMIT_GIB, disk_plan
from hpd_operator.profile import gemm_warmup_seconds
from hpd_operator.profile_launch import drain_grace_seconds
from hpd_operator.profile_model import Profile
from hpd_runtime import contract

GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER_NAME = "vllm"
LAUNCH_COMMAND = ["python3", "-m", "hpd_runtime", "launch", "--"]
"""The image's ENTRYPOINT, written out so the pod spec shows exactly what runs."""
RUN_AS_USER = contract.IMAGE_UID
"""The UID our images run as (images/*/Dockerfile `ARG UID`)."""

MODEL_LOAD_ALLOWANCE_SECONDS = 1800
"""Weights download/load + torch.compile + CUDA graphs before the warmup starts (a 30B FP8 model from HF, cold)."""
STARTUP_PERIOD_SECONDS = 10

DEFAULT_REQUESTS: dict[str, str] = {"cpu": "4", "memory": "32Gi"}
"""CPU/memory requests of an engine pod unless spec.<role>.resources.requests names them: the API server, the
tokenizer and the NIXL/UCX threads need a few cores, and a model's host-side copy while loading needs memory; with
no request the scheduler would pack engines onto a node whose CPU or memory is already taken. No default limits:
a memory limit OOM-kills a loading model, a CPU limit throttles the API server."""
SHM_SIZE_LIMIT = "16Gi"
"""/dev/shm (memory-backed emptyDir) cap: NCCL's shared-memory transport between TP ranks and PyTorch's IPC need a
few GiB; unbounded, a runaway writer could fill the node's memory. Override the `dshm` volume in podTemplate."""

SHM_VOLUME = "dshm"
CACHE_VOLUME = "cache"
MODEL_VOLUME = "model"
TMP_VOLUME = "tmp"
HOME_VOLUME = "home"
EPHEMERAL_STORAGE = "ephemeral-storage"


def startup_failure_threshold(warmup_timeout_seconds: int, gemm_warmup_seconds: int = 0) -> int:
    """failureThreshold x period covers model load + the GEMM sweep inside vLLM's startup + the warmup budget."""
    total = warmup_timeout_seconds + gemm_warmup_seconds + MODEL_LOAD_ALLOWANCE_SECONDS
    return math.ceil(total / STARTUP_PERIOD_SECONDS)


def _resources(
    res: ResourceRequirements | None, tp: int, devices: tuple[tuple[str, int], ...] = (), ephemeral: str | None = None
) -> dict[str, Any]:
    """The user's resources, the GPUs for TP and the fabric's devices (extended resources: limits only, which the
    apiserver copies into requests), and `ephemeral`: the ephemeral-storage request of the pod's emptyDirs on the
    node's disk (modelinfo.disk_plan) unless the user names ephemeral-storage, so the scheduler places the weights'
    download on a node with room for it."""
    limits: dict[str, Any] = dict(res.limits or {}) if res else {}
    requests: dict[str, Any] = dict(res.requests or {}) if res else {}
    limits.setdefault(GPU_RESOURCE, tp)
    for name, count in devices:
        limits.setdefault(name, count)
    if GPU_RESOURCE in requests:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE]
    for k, v in DEFAULT_REQUESTS.items():
        if k not in limits:  # a limit alone implies the same request; never request more than the limit
            requests.setdefault(k, v)
    if ephemeral is not None and EPHEMERAL_STORAGE not in limits:
        requests.setdefault(EPHEMERAL_STORAGE, ephemeral)
    return {"limits": limits, "requests": requests}


def _plain(model: BaseModel) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return out


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": contract.PORT_NAME_RUNTIME},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def _exec_probe(period: int, failures: int) -> dict[str, Any]:
    """`python3 -m hpd_runtime probe`: the runtime's /readyz, with its reason printed. The kubelet puts a failing
    exec probe's output into the pod's `Unhealthy` Event, which the operator copies into the role condition
    (hpd_operator.podevents): "P->D output differs from local ..." reaches `kubectl describe hpd` without any
    credentials in the engine pod. (An httpGet probe's Event carries only the status code.)"""
    return {
        "exec": {"command": list(contract.PROBE_COMMAND)},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 10,
    }


def engine_pod_template(
    cr: HybridPDDeployment, profile: Profile, role: contract.Role, group_role: contract.GroupRole | None = None
) -> dict[str, Any]:
    """The pod template of a role without any generation in it (what the generation hash is computed from): of its
    Deployment, or (`group_role`) of the leader or the workers of its LeaderWorkerSet, which differ only in the
    group-role label and env and the workers' `--headless`."""
    name, rs = cr.metadata.name, cr.spec.role(role)
    own = labels(name, role) | ({contract.LABEL_GROUP_ROLE: group_role} if group_role else {})
    spec = _engine_pod_spec(cr, profile, role, group_role)
    template: dict[str, Any] = {"metadata": {"labels": dict(own)}, "spec": spec}
    if rs.pod_template is not None:
        # Only the fields the PodTemplate model admits can be here (the operator-owned and host-level ones are
        # refused by the schema's CEL and again by validation.py), so the merge cannot replace command/args/probes.
        template = deep_merge(template, _plain(rs.pod_template))
        # Our labels win: the selector and the router's discovery depend on them.
        template["metadata"]["labels"] = {**template["metadata"].get("labels", {}), **own}
    return template


def engine_group_templates(cr: HybridPDDeployment, profile: Profile, role: contract.Role) -> dict[str, Any]:
    """What a role whose replica spans nodes runs, without any generation in it: the group size and the leader's and
    the workers' pod templates (its LeaderWorkerSet's leaderWorkerTemplate is built from these)."""
    return {
        "size": profile.role(role).nodes,
        "leaderTemplate": engine_pod_template(cr, profile, role, contract.GROUP_LEADER),
        "workerTemplate": engine_pod_template(cr, profile, role, contract.GROUP_WORKER),
    }


def role_templates(cr: HybridPDDeployment, profile: Profile) -> dict[str, Any]:
    """What the spec's generation is made of when each role runs in pods of its own, built once per reconcile: per
    role its pod template, or for a role whose replica spans nodes its group size and leader and worker templates
    (engine_group_templates). The generation's hash is taken over exactly these (builders.generation_hash), and its
    workloads are built from them; pair pods have their own template instead (builders.pair)."""
    return {
        role: engine_group_templates(cr, profile, role)
        if profile.role(role).multi_node
        else engine_pod_template(cr, profile, role)
        for role in contract.ROLES
    }


def in_generation(template: Mapping[str, Any], cr: HybridPDDeployment, gen: Generation) -> dict[str, Any]:
    """The template of one generation: its labels on the pods, and decode's HPD_PREFILL_SERVICE (the profile names the
    role's Service without a generation) pointed at this generation's prefill Service, so the pair check and the
    re-checks after Ready only ever see prefill pods of the same generation."""
    md = {**template["metadata"], "labels": {**template["metadata"]["labels"], **gen.labels()}}
    spec = dict(template["spec"])
    host = prefill_service_host(cr.metadata.name, cr.metadata.namespace, gen.hash)
    spec["containers"] = [
        {**c, "env": [{**e, "value": host} if e.get("name") == contract.ENV_PREFILL_SERVICE else e for e in c["env"]]}
        if c.get("name") == CONTAINER_NAME
        else c
        for c in spec["containers"]
    ]
    return {**template, "metadata": md, "spec": spec}


def progress_deadline_seconds(cr: HybridPDDeployment) -> int:
    """The Deployment's progressDeadlineSeconds: the startup probe's whole budget (model load, GEMM sweep, warmup)
    and a minute, so Kubernetes reports a generation that never becomes available (ProgressDeadlineExceeded: the
    rollout is stuck) only after its pods had all the time they are allowed."""
    w = cr.spec.warmup
    return startup_failure_threshold(w.timeout_seconds, gemm_warmup_seconds(w)) * STARTUP_PERIOD_SECONDS + 60


def engine_replicas(cr: HybridPDDeployment, role: contract.Role, serving: bool, start: int | None = None) -> int | None:
    """The replicas the operator writes into a role's Deployment of the spec's generation (None: it leaves the field
    out). A role that does not autoscale: spec.<role>.replicas. An autoscaling role's HPA owns the field once the
    generation serves (`serving`); a generation that does not serve yet starts at `start`, the count the serving
    generation runs (scaling.start_replicas), so the switch does not drop capacity; its own HPA takes over when
    traffic moves to it (docs/autoscaling.md)."""
    rs = cr.spec.role(role)
    if rs.autoscaling is None:
        return rs.replicas
    if serving:
        return None
    return start if start is not None else rs.replicas


def build_engine_deployment(
    cr: HybridPDDeployment, template: Mapping[str, Any], role: str, gen: Generation, replicas: int | None
) -> Manifest:
    """The role's Deployment of one generation from its pod template (engine_templates); `replicas` None leaves the
    field out (an autoscaling role: its HPA owns it, so no apply of the operator ever resets what the autoscaler
    chose)."""
    name = cr.metadata.name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": generation_metadata(cr, role, gen),
        "spec": {
            **({"replicas": replicas} if replicas is not None else {}),
            "selector": {"matchLabels": selector_labels(name, role, gen.hash)},
            # A generation's template never changes (a changed template is a new generation); the strategy only
            # matters for a pod replaced in place. GPUs are the scarce resource: never surge, one at a time.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "progressDeadlineSeconds": progress_deadline_seconds(cr),
            "template": in_generation(template, cr, gen),
        },
    }


def _engine_pod_spec(
    cr: HybridPDDeployment, profile: Profile, role: contract.Role, group_role: contract.GroupRole | None
) -> dict[str, Any]:
    rs = cr.spec.role(role)
    volumes, mounts = _engine_volumes(cr)
    reports = reports_kv_path(cr, role, group_role)
    pod_spec: dict[str, Any] = {
        # vLLM never calls the Kubernetes API. Only a decode that runs the pair check (a group's leader) gets a
        # token, of a ServiceAccount that may only create Events and patch its CR's KV report Lease
        # (build_kv_reporter_rbac).
        **({"serviceAccountName": kv_reporter_name(cr.metadata.name)} if reports else {}),
        "automountServiceAccountToken": reports,
        **POD_SECURITY_DEFAULTS,
        **host_namespaces(profile.role(role).host_pid),
        "containers": [_engine_container(cr, profile, role, mounts, group_role)],
        "volumes": volumes,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The preStop drain, then vLLM's --shutdown-timeout (hpd_runtime.drain), then a margin.
        "terminationGracePeriodSeconds": drain_grace_seconds(cr.spec.drain_timeout_seconds),
    }
    if rs.node_selector:
        pod_spec["nodeSelector"] = dict(rs.node_selector)
    if rs.tolerations:
        pod_spec["tolerations"] = [_plain(t) for t in rs.tolerations]
    if rs.affinity is not None:
        pod_spec["affinity"] = _plain(rs.affinity)
    return pod_spec


def _engine_container(
    cr: HybridPDDeployment,
    profile: Profile,
    role: contract.Role,
    mounts: list[dict[str, Any]],
    group_role: contract.GroupRole | None = None,
) -> dict[str, Any]:
    spec = cr.spec
    rs, rp = spec.role(role), profile.role(role)
    startup_threshold = startup_failure_threshold(spec.warmup.timeout_seconds, gemm_warmup_seconds(spec.warmup))
    args = list(rp.args) + (list(rp.worker_args) if group_role == contract.GROUP_WORKER else [])
    ports = engine_ports(spec.kv_transfer, role)
    return {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "command": list(LAUNCH_COMMAND),
        "args": args,
        "env": _engine_env(cr, profile, role, group_role),
        "ports": [
            {"name": contract.PORT_NAME_HTTP, "containerPort": ports.vllm, "protocol": "TCP"},
            {"name": contract.PORT_NAME_RUNTIME, "containerPort": ports.runtime, "protocol": "TCP"},
            {"name": contract.PORT_NAME_SIDE_CHANNEL, "containerPort": ports.side_channel, "protocol": "TCP"},
        ],
        "resources": _resources(rs.resources, rp.gpus_per_pod, rp.devices, disk_plan(spec).ephemeral_storage),
        "volumeMounts": mounts,
        "startupProbe": _exec_probe(STARTUP_PERIOD_SECONDS, startup_threshold),
        "readinessProbe": _exec_probe(5, 3),
        "livenessProbe": _probe(contract.PATH_LIVEZ, 10, 6),
        # A leaving pod stops new work and finishes what it holds before SIGTERM (hpd_runtime.drain).
        "lifecycle": {"preStop": {"exec": {"command": list(contract.DRAIN_COMMAND)}}},
        # the fabric's capabilities (rdma: IPC_LOCK) are the only ones added; an empty list takes any other back.
        # Read-only root: what vLLM, torch, Triton, FlashInfer and UCX write goes to /cache, /tmp, HOME, /dev/shm.
        "securityContext": container_security_context(
            RUN_AS_USER, capabilities={"drop": ["ALL"], "add": list(rp.capabilities)}, readOnlyRootFilesystem=True
        ),
    }


def _engine_env(
    cr: HybridPDDeployment, profile: Profile, role: contract.Role, group_role: contract.GroupRole | None = None
) -> list[dict[str, Any]]:
    """The profile's env (every HPD_* entry comes from it), a group member's role, then the Hugging Face token."""
    env: list[dict[str, Any]] = profile.role(role).env_k8s()
    if group_role is not None:
        env.append({"name": contract.ENV_GROUP_ROLE, "value": group_role})
    src = cr.spec.model.source
    hf = src.huggingface if src is not None else None
    if hf is not None and hf.token_secret_ref is not None:
        ref = hf.token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def _engine_volumes(cr: HybridPDDeployment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, the vllm container's mounts): /dev/shm, the compile cache (and the Hub's weights, HF_HOME; its
    sizeLimit from modelinfo.disk_plan), /tmp and HOME (the root filesystem is read-only), the model's PVC if it
    comes from one."""
    spec, src = cr.spec, cr.spec.model.source
    mounts: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "mountPath": contract.SHM_MOUNT},
        {"name": CACHE_VOLUME, "mountPath": contract.CACHE_MOUNT},
        {"name": TMP_VOLUME, "mountPath": contract.TMP_MOUNT},
        {"name": HOME_VOLUME, "mountPath": contract.HOME_MOUNT},
    ]
    cache: dict[str, Any]
    disk = disk_plan(spec)
    if disk.cache_size_limit is None and spec.cache.claim_name:
        cache = {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": spec.cache.claim_name}}
    else:
        cache = {"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": disk.cache_size_limit}}
    shm = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE_LIMIT}}
    tmp = {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": f"{TMP_SIZE_LIMIT_GIB}Gi"}}
    home = {"name": HOME_VOLUME, "emptyDir": {"sizeLimit": f"{HOME_SIZE_LIMIT_GIB}Gi"}}
    volumes: list[dict[str, Any]] = [shm, cache, tmp, home]
    if src is not None and src.pvc is not None:
        volumes.append(
            {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": src.pvc.claim_name, "readOnly": True}}
        )
        mounts.append({"name": MODEL_VOLUME, "mountPath": contract.MODEL_MOUNT, "readOnly": True})
    return volumes, mounts


def generation_metadata(cr: HybridPDDeployment, role: str, gen: Generation, name: str | None = None) -> dict[str, Any]:
    """Metadata of one generation's child: `name` (default `<cr>-<role>-<gen>`; `role` may be the pair pods'
    component, contract.COMPONENT_PAIR) and the generation's labels."""
    cr_name = cr.metadata.name
    md = metadata(cr_name, cr.metadata.namespace, name or role_name(cr_name, role, gen.hash), role)
    md["labels"].update(gen.labels())
    return md


def build_engine_service(cr: HybridPDDeployment, role: contract.Role, gen: Generation) -> Manifest:
    """Headless, one per generation: DNS lists only the generation's Ready pods (publishNotReadyAddresses false);
    the decode pair check relies on it. Of a role whose replicas span nodes, only the leaders (the pods that serve
    vLLM's API)."""
    name = cr.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": generation_metadata(cr, role, gen),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": serving_selector(name, role, gen.hash, cr.spec.role(role).multi_node),
            "ports": [
                {
                    "name": contract.PORT_NAME_HTTP,
                    "port": contract.VLLM_PORT,
                    "targetPort": contract.PORT_NAME_HTTP,
                    "protocol": "TCP",
                },
                {
                    "name": contract.PORT_NAME_SIDE_CHANNEL,
                    "port": cr.spec.kv_transfer.side_channel_port,
                    "targetPort": contract.PORT_NAME_SIDE_CHANNEL,
                    "protocol": "TCP",
                },
            ],
        },
    }


def build_engine_pdb(cr: HybridPDDeployment, role: contract.Role, gen: Generation) -> Manifest | None:
    """One voluntary disruption at a time per generation, only when the role has (or may autoscale to) >= 2 replicas
    (with one, a PDB would either block node drains forever or protect nothing)."""
    rs = cr.spec.role(role)
    most = rs.autoscaling.max_replicas if rs.autoscaling is not None else rs.replicas
    if most < 2:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": generation_metadata(cr, role, gen),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(cr.metadata.name, role, gen.hash)}},
    }


def reports_kv_path(cr: HybridPDDeployment, role: contract.Role, group_role: contract.GroupRole | None) -> bool:
    """Whether this engine pod measures and reports the KV path: a decode that runs the pair check (a group's
    leader, not its workers)."""
    return pair_check(cr.spec.warmup).reports_kv_path(role, group_role)


def build_kv_reporter_rbac(cr: HybridPDDeployment) -> list[Manifest]:
    """What the decode pods report their measured KV path with (hpd_runtime/kube_events.py): a ServiceAccount, a
    Lease of the same name whose annotations `kv.hybridpd.io/<pod uid>` hold each pod's report (the operator sets
    none of them; it reads them into status.kvPath), and a Role that may patch only that Lease and create Events (the same
    report on the pod, for `kubectl describe pod`). None without the pair check. Listed before the workloads that
    use them, so a first deploy never meets "serviceaccount not found"."""
    if not pair_check(cr.spec.warmup).on:
        return []
    name, ns = cr.metadata.name, cr.metadata.namespace
    rn = kv_reporter_name(name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(name, ns, rn, "decode")},
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata(name, ns, rn, "decode")},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(name, ns, rn, "decode"),
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [rn],
                    "verbs": ["get", "patch"],
                },
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(name, ns, rn, "decode"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": rn},
            "subjects": [{"kind": "ServiceAccount", "name": rn, **({"namespace": ns} if ns else {})}],
        },
    ]
