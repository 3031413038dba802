"""Typed spec and status of `HybridPDDeployment` (hybridpd.io/v1alpha1).

camelCase in YAML, snake_case in Python. Attribute docstrings become the CRD's descriptions (crdgen), and
`x-kubernetes-*` extras (CEL rules, preserve-unknown-fields, int-or-string) ride along in `json_schema_extra`.
Parse once: `HybridPDDeployment.model_validate(obj)` or `HybridPDDeploymentSpec.model_validate(body["spec"])`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from hpd_operator.api import constants as c
from hpd_operator.api.processns import ProcessNamespace
from hpd_operator.api.rules import QUANTITY_PATTERN, cel_rules
from hpd_operator.api.signals import SignalName
from hpd_runtime import contract

PRESERVE: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
OPERATOR_DEFAULT: dict[str, Any] = {"x-hpd-operator-default": True}
"""Marks a field whose default comes from the operator's configuration (`run --vllm-image/--router-image`, the
chart's `images.*` values), not from the CRD: crdgen leaves the default out of the CRD, and `with_default_images`
fills an omitted field at parse time. Python callers that parse without the operator get the constant."""


def _operator_defaulted(model: type[BaseModel]) -> set[str]:
    return {
        name
        for name, f in model.model_fields.items()
        if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("x-hpd-operator-default")
    }


def _sub(model: type[BaseModel]) -> Any:
    """A sub-object that is defaulted in the CRD too, with its fields' defaults spelled out (the apiserver checks
    CEL rules against the default itself, without applying nested defaults first). Fields the operator defaults
    (OPERATOR_DEFAULT) stay out of it."""
    default = model().model_dump(by_alias=True, exclude_none=True, mode="json", exclude=_operator_defaulted(model))
    return Field(default_factory=model, json_schema_extra={"default": default})


def _list() -> Any:
    return Field(default_factory=list, json_schema_extra={"default": []})


def _cel(rule: str, message: str, field_path: str | None = None) -> Any:
    out: dict[str, str] = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)],
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]
"""A non-negative Kubernetes quantity (`4`, `64Gi`, `500m`); crdgen lifts the pattern onto the int-or-string node."""
Args = Annotated[
    list[Annotated[str, Field(max_length=c.MAX_ARG_LENGTH)]],
    Field(max_length=c.MAX_EXTRA_ARGS),
]

_VERSION_MESSAGE = (
    f"spec.vllmVersion must be a vLLM release from {c.VLLM_RANGE_TEXT} (e.g. 0.20.0 or 0.33.0): the operator's "
    "version table covers those releases"
)
_CEL_VERSION = c.vllm_version_regex().replace("\\", "\\\\")

_DENIED_ARGS_RULE = _cel(
    f"!self.exists(a, a.matches('{c.denied_flags_regex()}'))",
    "extraArgs may not contain flags the operator owns or forbids: "
    + c.denied_flags_text()
    + " (set the matching spec field instead)",
)


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------
class SecretKeyRef(_Model):
    name: str = Field(min_length=1, max_length=253)
    """Secret name (same namespace)."""
    key: str = Field(default="token", min_length=1, max_length=253)
    """Key in the Secret."""


class PvcModelSource(_Model):
    claim_name: str = Field(min_length=1, max_length=253)
    """PersistentVolumeClaim holding the model files (mounted read-only at /models)."""
    path: str = Field(min_length=1, max_length=1024, pattern=r"^[^/].*$")
    """Model directory inside the claim (relative); vLLM gets `/models/<path>` as --model."""


class HuggingFaceModelSource(_Model):
    repo: str | None = Field(default=None, min_length=1, max_length=253)
    """Hugging Face repo id to load; default: spec.model.name."""
    revision: str | None = Field(default=None, max_length=253)
    """Branch, tag or commit (passed as --revision)."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret with an HF token (HF_TOKEN) for gated models."""


class ModelSource(_Model):
    """Where the weights come from: a PVC or a Hugging Face repo (default: the repo named spec.model.name)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("modelSource")})
    pvc: PvcModelSource | None = None
    huggingface: HuggingFaceModelSource | None = None


class ModelConfigSpec(_Model):
    """The model's config.json numbers the operator checks TP against (vLLM asserts them only at load time).

    Leave unset for models in the operator's built-in table (e.g. nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8)."""

    num_attention_heads: int | None = Field(default=None, ge=1)
    """config.json `num_attention_heads`."""
    num_key_value_heads: int | None = Field(default=None, ge=1)
    """config.json `num_key_value_heads`."""
    mamba_num_heads: int | None = Field(default=None, ge=1)
    """config.json `mamba_num_heads`."""
    mamba_n_groups: int | None = Field(default=None, ge=1)
    """config.json `n_groups` (Mamba2 B/C groups)."""
    hidden_size: int | None = Field(default=None, ge=1)
    """config.json `hidden_size`."""
    ssd_chunk_size: int | None = Field(default=None, ge=1)
    """config.json `chunk_size` / `mamba_chunk_size`; the warmup sends prompts longer than it."""
    hybrid_override_pattern: str | None = Field(default=None, max_length=1024, pattern=r"^[M*\-E]+$")
    """config.json `hybrid_override_pattern` (M = Mamba2, * = attention, - = MLP, E = MoE)."""


class ModelSpec(_Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("model")})
    name: str = Field(min_length=1, max_length=253)
    """Served model name (clients send it as `model`); also the HF repo id unless source says otherwise."""
    source: ModelSource | None = None
    """Where the weights come from; default: the Hugging Face repo spec.model.name."""
    max_model_len: int | None = Field(default=None, ge=16, le=c.MAX_MODEL_LEN)
    """--max-model-len on both roles; default: the model's own. At most 1048576 (Nemotron 3 Nano's 1M context,
    the longest of the supported models); a longer one fails at load or leaves no room for a KV block."""
    dtype: Literal["auto", "bfloat16", "float16", "half", "float32"] = "auto"
    """--dtype on both roles (it is part of the NIXL compatibility hash, so it is one value for both)."""
    hybrid: Literal["auto", "mamba2", "none"] = "auto"
    """`mamba2`: hybrid Mamba2/attention (Nemotron-H). `none`: attention only. `auto`: from config or the
    built-in table; unknown models are treated as mamba2 (those settings are safe for attention-only models)."""
    config: ModelConfigSpec | None = None
    """Model config numbers for the TP checks, when the model is not in the operator's built-in table."""


# ---------------------------------------------------------------------------------------------------------------
# Roles
# ---------------------------------------------------------------------------------------------------------------
class ResourceRequirements(_Model):
    """Container resources; nvidia.com/gpu is set from tensorParallelSize unless given here."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("resources")})
    limits: Annotated[dict[str, Quantity], Field(max_length=c.MAX_RESOURCES)] | None = None
    requests: Annotated[dict[str, Quantity], Field(max_length=c.MAX_RESOURCES)] | None = None


class Toleration(_Model):
    """core/v1 Toleration."""

    key: str | None = Field(default=None, max_length=317)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


_Free = Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE)]
"""A core/v1 object whose inner shape the apiserver checks when the Deployment is applied."""
# Refused fields: declared (with their core/v1 type, which CEL needs) only so that a CEL rule can refuse them by
# name; an undeclared field would be pruned silently by the apiserver.
_NoBool = bool
_NoStr = Annotated[str, Field(max_length=253)]
_NoObj = _Free
_NoList = Annotated[list[_Free], Field(max_length=16)]
_NoStrList = Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=64)]
_NoMap = Annotated[dict[str, str], Field(max_length=64)]


class Affinity(_Model):
    """core/v1 Affinity."""

    node_affinity: _Free | None = None
    pod_affinity: _Free | None = None
    pod_anti_affinity: _Free | None = None


class PodTemplateMetadata(_Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("podMetadata")})
    labels: Annotated[dict[str, Annotated[str, Field(max_length=63)]], Field(max_length=64)] | None = None
    """Extra pod labels (the operator's own labels win)."""
    annotations: Annotated[dict[str, str], Field(max_length=64)] | None = None
    """Extra pod annotations; AppArmor and seccomp annotations are refused (the operator sets the pod's profile)."""


class LocalObjectReference(_Model):
    name: str = Field(min_length=1, max_length=253)


class VolumeProjection(_Model):
    """One source of a projected volume (core/v1 VolumeProjection): secret, configMap, downwardAPI, ... ; a
    serviceAccountToken source is refused (engine pods get no token beyond the operator's). Only the refused source is declared: the
    others are kept as written and checked by the apiserver when the Deployment is applied."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"x-kubernetes-validations": cel_rules("projection")})
    service_account_token: _NoObj | None = None


class ProjectedVolume(_Model):
    """core/v1 ProjectedVolumeSource."""

    model_config = ConfigDict(extra="allow")
    sources: Annotated[list[VolumeProjection], Field(max_length=16)] | None = None


class Volume(_Model):
    """An extra pod volume (core/v1 Volume); hostPath and projected ServiceAccount tokens are refused. A `secret`
    volume, a projected `secret` source and a `csi` volume with `nodePublishSecretRef` put a Secret of the namespace
    into the engine pods through the operator's identity: the chart's ValidatingAdmissionPolicy admits the CR only
    when its author may `get` that Secret (README, "Secrets a CR references")."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("volume")})
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    config_map: _Free | None = None
    secret: _Free | None = None
    empty_dir: _Free | None = None
    persistent_volume_claim: _Free | None = None
    csi: _Free | None = None
    ephemeral: _Free | None = None
    projected: ProjectedVolume | None = None
    downward_api: _Free | None = Field(default=None, alias="downwardAPI")
    host_path: _NoObj | None = None


class ContainerOverride(_Model):
    """Overrides of the `vllm` container, merged by name."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("container")})
    name: str = Field(min_length=1, max_length=63)
    volume_mounts: Annotated[list[_Free], Field(max_length=32)] | None = None
    """Extra mounts (of podTemplate.spec.volumes)."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    image: _NoStr | None = None
    command: _NoStrList | None = None
    args: _NoStrList | None = None
    ports: _NoList | None = None
    env: _NoList | None = None
    env_from: _NoList | None = None
    resources: _NoObj | None = None
    startup_probe: _NoObj | None = None
    readiness_probe: _NoObj | None = None
    liveness_probe: _NoObj | None = None
    security_context: _NoObj | None = None
    lifecycle: _NoObj | None = None
    working_dir: _NoStr | None = None


class PodSpecOverride(_Model):
    """The pod fields a user may set; the rest belong to the operator or are refused."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("podSpec")})
    priority_class_name: str | None = Field(default=None, max_length=253)
    """A PriorityClass of the cluster; the `system-` classes (node- and cluster-critical) are refused."""
    runtime_class_name: str | None = Field(default=None, max_length=253)
    """E.g. `nvidia` where the GPU runtime is not the node default."""
    scheduler_name: str | None = Field(default=None, max_length=253)
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=16)] | None = None
    topology_spread_constraints: Annotated[list[_Free], Field(max_length=16)] | None = None
    termination_grace_period_seconds: int | None = Field(default=None, ge=0, le=86_400)
    dns_policy: Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"] | None = None
    dns_config: _Free | None = None
    enable_service_links: bool | None = None
    volumes: Annotated[list[Volume], Field(max_length=32)] | None = None
    containers: Annotated[list[ContainerOverride], Field(max_length=1)] | None = None
    host_network: _NoBool | None = None
    host_pid: _NoBool | None = Field(default=None, alias="hostPID")
    host_ipc: _NoBool | None = Field(default=None, alias="hostIPC")
    host_users: _NoBool | None = None
    service_account_name: _NoStr | None = None
    service_account: _NoStr | None = None
    automount_service_account_token: _NoBool | None = None
    security_context: _NoObj | None = None
    node_name: _NoStr | None = None
    share_process_namespace: _NoBool | None = None
    init_containers: _NoList | None = None
    ephemeral_containers: _NoList | None = None
    node_selector: _NoMap | None = None
    tolerations: _NoList | None = None
    affinity: _NoObj | None = None


class PodTemplate(_Model):
    metadata: PodTemplateMetadata | None = None
    spec: PodSpecOverride | None = None


class AutoscalingMetric(_Model):
    """One load signal the role follows (hpd_operator.api.signals): the HorizontalPodAutoscaler holds its
    per-replica average at `target`, and with several signals takes the largest replica count any of them asks for."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("autoscalingMetric")})
    signal: SignalName
    """`waitingRequests` (vllm:num_requests_waiting: queued whole prompts, prefill's backlog),
    `promptTokensPerSecond` (rate of vllm:prompt_tokens_total), `kvCacheUsage` (vllm:kv_cache_usage_perc, 0-1) or
    `runningRequests` (vllm:num_requests_running: the running batch)."""
    target: float = Field(ge=0.001, le=1_000_000)
    """The per-replica average to hold: e.g. 4 waiting requests, 0.7 of the KV cache, 32 running requests. At least
    0.001: the HorizontalPodAutoscaler takes a quantity in milli-units, and a smaller target would round to 0, which
    it refuses."""


class AutoscalingSpec(_Model):
    """Scale this role with a HorizontalPodAutoscaler on vLLM's own load signals (external metrics through a
    metrics adapter: docs/autoscaling.md). The autoscaler then owns the Deployment's replica count; spec.<role>.replicas
    is only the size the role starts at."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("autoscaling")})
    min_replicas: int = Field(default=1, ge=1, le=c.MAX_REPLICAS)
    """Fewest replicas (at least 1: scale to zero is not offered, docs/autoscaling.md says why)."""
    max_replicas: int = Field(ge=1, le=c.MAX_REPLICAS)
    """Most replicas (GPUs: maxReplicas x tensorParallelSize)."""
    metrics: Annotated[list[AutoscalingMetric], Field(max_length=4)] = _list()
    """The signals to follow; empty = the role's defaults: prefill waitingRequests 4; decode kvCacheUsage 0.7 and
    runningRequests 32."""
    scale_up_stabilization_seconds: int = Field(default=0, ge=0, le=3600)
    """The HPA scales up to the lowest recommendation of this window (0: at once)."""
    scale_down_stabilization_seconds: int = Field(default=300, ge=0, le=3600)
    """The HPA scales down only to the highest recommendation of this window (load must stay low this long)."""
    scale_down_period_seconds: int = Field(default=60, ge=1, le=1800)
    """Scale down by at most one pod per this many seconds (each leaving pod drains first: docs/autoscaling.md)."""


class RoleSpec(_Model):
    """One engine role (prefill or decode): a Deployment of vLLM pods, or a LeaderWorkerSet when one replica needs
    more GPUs than a node has (gpusPerNode)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("role")})
    replicas: int = Field(default=1, ge=0, le=c.MAX_REPLICAS)
    """Number of replicas: pods, or groups of pods for a replica that spans nodes (gpusPerNode)."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=c.MAX_TENSOR_PARALLEL_SIZE)
    """--tensor-parallel-size; with pipelineParallelSize, the GPUs of one replica. Prefill and decode sizes must
    divide one another."""
    pipeline_parallel_size: int = Field(default=1, ge=1, le=c.MAX_PIPELINE_PARALLEL_SIZE)
    """--pipeline-parallel-size: pipeline stages of one replica (GPUs = tensorParallelSize x pipelineParallelSize).
    NIXL moves KV from a pipeline-parallel prefill only on vLLM 0.27+ and only for attention-only models, and never
    to a pipeline-parallel decode (vLLM refuses the others): decode must keep 1, and a hybrid model spreads a replica
    over nodes with tensorParallelSize instead (docs/multi-node.md)."""
    gpus_per_node: int = Field(default=c.DEFAULT_GPUS_PER_NODE, ge=1, le=c.MAX_GPUS_PER_NODE)
    """GPUs one node gives this role. A replica that needs more (tensorParallelSize x pipelineParallelSize >
    gpusPerNode) spans whole nodes: a LeaderWorkerSet group of TP x PP / gpusPerNode pods with gpusPerNode GPUs
    each (the leader serves the API; the workers run vLLM's headless ranks), so TP x PP must then be a multiple of
    gpusPerNode. Needs LeaderWorkerSet (sigs.k8s.io/lws) installed; a replica that fits a node stays one pod of a
    Deployment."""
    gpu_memory_utilization: float | None = Field(default=None, ge=c.MIN_GPU_MEMORY_UTILIZATION, le=1)
    """--gpu-memory-utilization for this role (0.05 to 1); default: spec.gpuMemoryUtilization."""
    resources: ResourceRequirements | None = None
    node_selector: Annotated[dict[str, str], Field(max_length=64)] | None = None
    tolerations: Annotated[list[Toleration], Field(max_length=64)] | None = None
    """Pod tolerations (core/v1 Toleration)."""
    affinity: Affinity | None = None
    """Pod affinity (core/v1 Affinity)."""
    pod_template: PodTemplate | None = None
    """Overrides merged into the pod template: labels/annotations and the pod fields listed here; the `vllm`
    container only takes volumeMounts and imagePullPolicy (command, args, ports, probes, env and resources are the
    operator's). Host namespaces, hostPath volumes, service accounts and security contexts are refused by name."""
    extra_args: Annotated[Args, Field(json_schema_extra={"x-kubernetes-validations": [_DENIED_ARGS_RULE]})] = _list()
    """Extra `vllm serve` arguments for this role, after spec.extraArgs."""
    autoscaling: AutoscalingSpec | None = None
    """Follow load with a HorizontalPodAutoscaler between minReplicas and maxReplicas (unset: `replicas` pods)."""

    @property
    def gpus_per_replica(self) -> int:
        """tensorParallelSize x pipelineParallelSize: vLLM's world size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def nodes_per_replica(self) -> int:
        """Pods (one per node) of one replica: 1 when it fits one node, else the nodes its GPUs fill."""
        return max(1, -(-self.gpus_per_replica // self.gpus_per_node))

    @property
    def multi_node(self) -> bool:
        """One replica spans nodes: a LeaderWorkerSet group instead of one pod of a Deployment."""
        return self.nodes_per_replica > 1

    @property
    def gpus_per_pod(self) -> int:
        """The GPUs each pod of a replica gets (vLLM's local world size)."""
        return self.gpus_per_replica // self.nodes_per_replica


# ---------------------------------------------------------------------------------------------------------------
# KV transfer, router, warmup, cache, monitoring
# ---------------------------------------------------------------------------------------------------------------
class UcxSpec(_Model):
    tls: str | None = Field(default=None, max_length=256)
    """UCX_TLS, e.g. `rc,ud,sm,cuda_copy,cuda_ipc`; always include cuda_copy for GPU memory."""
    net_devices: str | None = Field(default=None, max_length=256)
    """UCX_NET_DEVICES, e.g. `mlx5_0:1,mlx5_1:1`."""


class RdmaSpec(_Model):
    resource_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    )
    """The RDMA device plugin's extended resource, e.g. `rdma/ib` (k8s-rdma-shared-dev-plugin), `nvidia.com/hostdev`
    (NVIDIA Network Operator, SR-IOV), `rdma/hca_shared_devices_a`."""
    count: int = Field(default=1, ge=1, le=16)
    """Devices per engine pod (one per GPU for rail-optimized nodes)."""


class KvTransferSpec(_Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("kvTransfer")})
    fabric: Literal["tcp", "rdma"] = "tcp"
    """How prefill and decode pods reach each other for KV. `tcp`: any cluster; UCX over the pod network (a hybrid
    model moves its Mamba state, ~100 MB per request at 8B, on every request: P/D pays that at the network's rate).
    `rdma`: GPUDirect RDMA through NICs the pods get from a device plugin (spec.kvTransfer.rdma): each engine pod
    gets the devices and the IPC_LOCK capability, so it no longer meets Pod Security baseline or restricted (the
    namespace must allow privileged pods). Decode measures the rate at Ready (status: DataPathVerified)."""
    rdma: RdmaSpec | None = None
    """The RDMA devices (required with fabric rdma)."""
    floor_gbps: float | None = Field(default=None, ge=0, le=10_000, alias="floorGBps")
    """Below this KV rate (GB/s) decode reports the path as slow (a Warning, not Ready=False); default: 5 for rdma
    (UCX fell back to TCP), none for tcp."""
    side_channel_port: int = Field(default=contract.SIDE_CHANNEL_PORT_DEFAULT, ge=1024, le=65535)
    """NIXL side-channel (ZMQ) base port, VLLM_NIXL_SIDE_CHANNEL_PORT."""
    ucx: UcxSpec | None = None
    """UCX transport env for NIXL."""
    load_failure_policy: Literal["fail", "recompute"] = "fail"
    """What decode does when a KV load fails: finish the request with an error, or recompute the prefill."""
    process_namespace: ProcessNamespace = "Pod"
    """The PID namespace of every engine pod (prefill and decode, a multi-node role's leaders and workers). `Pod`
    (the default): each pod its own; a prefill and a decode on the same node then cannot use UCX's cuda_ipc (it opens
    the peer's CUDA IPC handle only within one PID namespace) and KV moves over UCX's TCP emulation (~0.4 GB/s).
    `Host`, a security trade: every engine pod runs with `hostPID: true`, sees every process of the node (their
    command lines and environment, other tenants' included) and can signal those of its uid; Pod Security baseline
    and restricted refuse it, so the namespace must admit privileged pods. It buys cuda_ipc (10-20 GB/s on an H200)
    between a prefill and a decode that land on the same node, nothing across nodes; it does not place them together
    (spec.<role>.affinity does). Named in status.profile, the DataPathVerified message and a Warning Event
    (SharedHostPIDNamespace) per generation. podTemplate's hostPID stays refused: this field is the only way.
    `Pair`: pair pods. Each pod holds one prefill and one decode engine container (each with its role's resources,
    GPUs, args and env from spec.prefill and spec.decode) and an in-pod router that pairs exactly these two over
    127.0.0.1, with `shareProcessNamespace: true` (one PID namespace of the pod's own; hostPID stays false, Pod
    Security restricted allows it): cuda_ipc between the pod's own prefill and decode (23.9 GB/s on an H200). The
    CR's router then balances over the pair pods (vllm-router's regular mode: its retries and circuit breaker apply).
    Its costs: a fixed 1:1 P:D ratio per pod (spec.prefill.replicas must equal spec.decode.replicas: the number of
    pair pods); both roles' GPUs must fit one node; a rollout, a drain or an eviction takes a prefill and a decode
    together; decode's autoscaling (if set) scales pairs, and prefill's own autoscaling and a replica that spans nodes
    are refused. A pair pod is Ready only when both engines (each behind its own warmup gate; decode's pair check asks
    the pod's own prefill) and its router are; a pod with a dead container leaves the router's pool (degraded mode,
    spec.router.degradedMode, does not apply) (docs/kv-topologies.md)."""


class RouterServiceSpec(_Model):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    port: int = Field(default=c.DEFAULT_ROUTER_SERVICE_PORT, ge=1, le=65535)
    """Service port of the endpoint."""


class RouterSpec(_Model):
    replicas: int = Field(default=1, ge=0, le=c.MAX_REPLICAS)
    image: str = Field(default=c.DEFAULT_ROUTER_IMAGE, min_length=1, max_length=512, json_schema_extra=OPERATOR_DEFAULT)
    """vllm-router image; default: the operator's `--router-image` (chart value `images.router`)."""
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two", "consistent_hash"] = "round_robin"
    """vllm-router load-balancing policy for both stages."""
    service: RouterServiceSpec = _sub(RouterServiceSpec)
    resources: ResourceRequirements | None = None
    drain_seconds: int = Field(default=c.DEFAULT_ROUTER_DRAIN_SECONDS, ge=0, le=86_400)
    """How long a replaced router pod may take to finish the requests it has in flight (its graceful shutdown; the
    pod's terminationGracePeriodSeconds is this plus a few seconds). A rollout removes the old generation's engines
    only after its router pods are gone, so this bounds how long the old generation outlives the switch. Set it to
    the longest request you serve (a long generation can take minutes)."""
    retries: int = Field(default=c.DEFAULT_ROUTER_RETRIES, ge=0, le=c.MAX_ROUTER_RETRIES)
    """How many times the router pod's retry proxy (HAProxy, a second container of the router pod) sends a request
    to vllm-router again when the router failed it before the client saw a byte: a 500 from a prefill or decode that
    crashed and is still in the router's choice (it leaves on its pod's NotReady or its health check, about a second
    later), a 502/503 or a closed connection. vllm-router retries nothing in P/D mode; each retry is a new pick
    (round_robin and random pick another engine; power_of_two, cache_aware and consistent_hash may pick the same
    dead one until it leaves). A retry after a decode failure runs the prefill again, and a request that itself
    crashes an engine is tried 1 + retries times. 0: no proxy, the router serves the endpoint port itself. Ignored
    for pair pods (the router's regular mode retries on its own)."""
    degraded_mode: bool = True
    """While the serving generation has Ready pods of one role and none of the other, the endpoint (the `<cr>`
    Service) selects the Ready role's pods directly: each is a complete vLLM server and runs a request without
    kv_transfer_params end to end (condition Degraded, reason DecodeUnavailable or PrefillUnavailable). Its KV cache
    and batch limits were sized for one role, so it serves fewer requests at once and, on prefill, decodes slowly.
    False: the endpoint stays the router, which answers 503 until both roles are Ready (fail fast)."""


class WarmupSpec(_Model):
    enabled: bool = True
    """Hold pods out of rotation (not Ready) until the kernels are warm."""
    prompt_lengths: Annotated[list[Annotated[int, Field(ge=1)]], Field(max_length=32)] = _list()
    """Token counts of warmup prompts; empty = derived from the SSD chunk size and max model len."""
    concurrency: int = Field(default=c.DEFAULT_WARMUP_CONCURRENCY, ge=1, le=256)
    pair_check: bool = True
    """Decode waits for one real prefill->decode round trip before it reports Ready."""
    timeout_seconds: int = Field(default=c.DEFAULT_WARMUP_TIMEOUT_SECONDS, ge=1, le=86_400)
    canary_seconds: int = Field(default=c.DEFAULT_CANARY_SECONDS, ge=0, le=86_400)
    """After Ready, each decode pod re-proves P->D with every Ready prefill on this period (two prompts,
    logprob-checked, transfer proven, straight to the peers, never through the router); a failure turns that decode
    not Ready with the reason, as at start. 0 = off. Needs pairCheck."""
    every_length: bool = True
    """Before Ready, also run each distinct linear layer (GEMM) of the loaded model once at every row count up to
    vLLM's max_num_batched_tokens (hpd_runtime.gemm_warmup, inside vLLM's startup), so the first request of a prompt
    length no warmup prompt had is as fast as the next: cuBLAS picks its algorithm per row count on first use (+4 to
    +11 ms per new length on an H200). Costs 7-10 s of startup on the bench model, more with larger weights; bounded
    by timeoutSeconds (at most 300 s). Ignored when `enabled` is false."""


class CacheSpec(_Model):
    """Persistent compile/Triton cache, keyed by model x vLLM version x GPU x TP x role."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("cache")})
    type: Literal["emptyDir", "pvc"] = "emptyDir"
    claim_name: str | None = Field(default=None, min_length=1, max_length=253)
    size_limit: Quantity | None = None
    """emptyDir size limit."""


class MonitoringSpec(_Model):
    pod_monitor: bool = False
    """Create PodMonitors (when the Prometheus Operator CRDs exist)."""
    interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$")
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Extra labels on the PodMonitors, e.g. `release: kube-prometheus-stack` (its Prometheus selects on it)."""


class PrometheusPeerSpec(_Model):
    """Which pods may scrape the metrics ports (core/v1 LabelSelectors, as in a NetworkPolicy peer): the engines'
    runtime port (its own metrics and vLLM's, relayed at /vllm/metrics; never vLLM's API port, which serves
    completions) and the router's metrics port. Both serve read-only metrics; to keep even those to your Prometheus,
    name its namespace, e.g. `namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}`."""

    namespace_selector: Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE)] = Field(
        default_factory=dict, json_schema_extra={"default": {}}
    )
    """Namespaces of the scrapers; {} = every namespace (any pod labelled like a scraper reads the metrics)."""
    pod_selector: Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE)] = Field(
        default_factory=lambda: {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        json_schema_extra={"default": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
    )
    """Scraper pods; default: the Prometheus pods of the Prometheus Operator (`app.kubernetes.io/name: prometheus`)."""


class NetworkPolicySpec(_Model):
    """A NetworkPolicy per CR: engines accept the router on the API port, each other on any port (API, NIXL side
    channel, UCX's ephemeral ports) and Prometheus on the runtime port only (vLLM's metrics are relayed there); the
    router accepts clients on its port and Prometheus on its metrics port. Enforced only where the cluster's network
    plugin implements NetworkPolicy."""

    enabled: bool = True
    """Generate the NetworkPolicies (vLLM's API and NIXL's side channel have no authentication)."""
    prometheus: PrometheusPeerSpec = _sub(PrometheusPeerSpec)
    restrict_egress: bool = False
    """Also restrict the engines' egress to DNS, the other engines of this CR and HTTPS (model downloads; a
    NetworkPolicy cannot name a host). Off by default: model sources on other ports or proxies would break."""


class RatioSpec(_Model):
    """Bounds on decode replicas per prefill replica while both roles autoscale: the operator narrows each
    autoscaler's min/max so that neither role runs away from the other (docs/autoscaling.md)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("ratio")})
    min_decode_per_prefill: float | None = Field(default=None, gt=0, le=c.MAX_REPLICAS)
    """At least this many decode replicas per prefill replica (e.g. 1)."""
    max_decode_per_prefill: float | None = Field(default=None, gt=0, le=c.MAX_REPLICAS)
    """At most this many decode replicas per prefill replica (e.g. 4)."""


class EnvVar(_Model):
    name: str = Field(min_length=1, max_length=253)
    value: str | None = Field(default=None, max_length=c.MAX_ENV_VALUE)
    value_from: Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE)] | None = None
    """core/v1 EnvVarSource."""


# ---------------------------------------------------------------------------------------------------------------
# Spec
# ---------------------------------------------------------------------------------------------------------------
class HybridPDDeploymentSpec(_Model):
    """Disaggregated prefill/decode vLLM serving of a hybrid Mamba2/attention model."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": cel_rules("spec")})
    model: ModelSpec
    image: str | None = Field(default=None, min_length=1, max_length=512)
    """vLLM image for both roles (ours: vllm/vllm-openai + nixl + hpd_runtime). Default:
    ghcr.io/hybridpd/vllm-runtime:<spec.vllmVersion>. A tag that names another vLLM version than spec.vllmVersion
    gets a warning (status.profile.warnings and an Event)."""
    vllm_version: str = Field(
        default=c.DEFAULT_VLLM_VERSION,
        max_length=32,
        json_schema_extra={"x-kubernetes-validations": [_cel(f"self.matches('{_CEL_VERSION}')", _VERSION_MESSAGE)]},
    )
    """vLLM version inside the image (e.g. 0.20.0 or 0.33.0); drives the version table, which covers every release
    from 0.20 to 0.33 by rule (status.profile.rules lists the rules that applied)."""
    block_size: int | None = Field(default=None, ge=16, le=4096)
    """--block-size on both roles (multiple of 16). Unset (recommended): no flag, vLLM picks the Mamba-aligned
    attention block size itself, the same on both roles for equal TP. A value below that size is raised by vLLM;
    on vLLM 0.20 such a raised size (128 -> 640 tokens) corrupted P->D output on an H200 (bench/gpu/README.md).
    Required when the TP sizes differ and the larger one replicates the KV heads or the Mamba groups: then set it
    to at least vLLM's size for both TP sizes."""
    gpu_memory_utilization: float | None = Field(default=None, ge=c.MIN_GPU_MEMORY_UTILIZATION, le=1)
    """--gpu-memory-utilization on both roles (0.05 to 1; a role may override it). Below 0.05 no GPU has room for
    the weights and a KV block, and vLLM fails at startup."""
    extra_args: Annotated[Args, Field(json_schema_extra={"x-kubernetes-validations": [_DENIED_ARGS_RULE]})] = _list()
    """Extra `vllm serve` arguments for both roles."""
    env: Annotated[list[EnvVar], Field(max_length=c.MAX_ENV)] = _list()
    """Extra env for both roles' vLLM containers."""
    prefill: RoleSpec = _sub(RoleSpec)
    decode: RoleSpec = _sub(RoleSpec)
    kv_transfer: KvTransferSpec = _sub(KvTransferSpec)
    router: RouterSpec = _sub(RouterSpec)
    warmup: WarmupSpec = _sub(WarmupSpec)
    cache: CacheSpec = _sub(CacheSpec)
    monitoring: MonitoringSpec = _sub(MonitoringSpec)
    network_policy: NetworkPolicySpec = _sub(NetworkPolicySpec)
    ratio: RatioSpec | None = None
    """Bounds on the decode:prefill replica ratio (needs autoscaling on both roles)."""
    drain_timeout_seconds: int = Field(default=contract.DRAIN_TIMEOUT_SECONDS_DEFAULT, ge=0, le=3600)
    """How long a leaving engine pod (scale-down, rollout, eviction) may take to finish its in-flight requests: its
    preStop waits up to this long for them (and, on prefill, for decode to pull the KV it holds), then vLLM gets it
    again as --shutdown-timeout; terminationGracePeriodSeconds = 2 x this + 15. 0: vLLM aborts in-flight requests on
    SIGTERM (its own default)."""

    @model_validator(mode="before")
    @classmethod
    def _image_follows_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("image") is None:
            version = data.get("vllmVersion", data.get("vllm_version", c.DEFAULT_VLLM_VERSION))
            return {**data, "image": c.vllm_image(str(version))}
        return data

    @field_validator("vllm_version")
    @classmethod
    def _version_in_table(cls, v: str) -> str:
        if not re.fullmatch(c.vllm_version_regex(), v):
            raise ValueError(_VERSION_MESSAGE)
        return v

    def role(self, role: contract.Role) -> RoleSpec:
        return self.prefill if role == "prefill" else self.decode

    def replicas_autoscaling(self, role: contract.Role) -> AutoscalingSpec | None:
        """The autoscaling that owns a role's replica count: the role's own; with pair pods (kvTransfer.processNamespace
        Pair) decode's for both roles, since one Deployment of pairs runs them (prefill's own is refused there)."""
        if self.kv_transfer.process_namespace == "Pair":
            return self.decode.autoscaling
        return self.role(role).autoscaling


# ---------------------------------------------------------------------------------------------------------------
# Status
# ---------------------------------------------------------------------------------------------------------------
ConditionType = Literal[
    "Ready",
    "PrefillReady",
    "DecodeReady",
    "RouterReady",
    "WarmedUp",
    "HybridProfileApplied",
    "Progressing",
    "Degraded",
    "DataPathVerified",
]
CONDITION_TYPES: tuple[str, ...] = ConditionType.__args__  # type: ignore[attr-defined]


class Condition(_Model):
    type: str = Field(max_length=64)
    """One of Ready, PrefillReady, DecodeReady, RouterReady, WarmedUp, HybridProfileApplied, Progressing, Degraded."""
    status: Literal["True", "False", "Unknown"]
    reason: str | None = Field(default=None, max_length=1024)
    message: str | None = Field(default=None, max_length=32768)
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(default=None, ge=0)


class AutoscalerStatus(_Model):
    """What the role's HorizontalPodAutoscaler decided last, and the bounds the operator gave it."""

    min_replicas: int | None = None
    """The minimum in force (spec.<role>.autoscaling.minReplicas, raised by the ratio bound where it must)."""
    max_replicas: int | None = None
    """The maximum in force (lowered by the ratio bound where it must)."""
    current_replicas: int | None = None
    desired_replicas: int | None = None
    last_scale_time: str | None = None
    decision: str | None = None
    """ScaledUp, ScaledDown, Steady, AtMax, AtMin, HeldByRatio, NoMetrics, Pending."""
    reason: str | None = Field(default=None, max_length=4096)
    """The autoscaler's own words (its conditions) and the operator's ratio decision, if any."""
    signals: list[str] = Field(default_factory=list)
    """Each signal's per-replica value against its target, e.g. `waitingRequests 9/4`."""
    summary: str | None = None
    """`current->desired decision`, e.g. `2->3 ScaledUp` (printer columns)."""


class RoleStatus(_Model):
    replicas: int | None = None
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    summary: str | None = None
    """`ready/desired`, e.g. 1/1 (printer columns)."""
    selector: str | None = None
    """Label selector of the role's pods (scale subresource)."""
    autoscaler: AutoscalerStatus | None = None
    """Set while the role autoscales."""


class InjectionStatus(_Model):
    role: str | None = None
    """prefill, decode, or unset for both."""
    setting: str
    value: str
    reason: str


class VersionRuleStatus(_Model):
    """One version-table rule that applied to spec.vllmVersion (operator/hpd_operator/versions.py VERSION_RULES)."""

    rule: str
    versions: str
    """The vLLM minors it covers, e.g. 0.20-0.25."""
    upstream: str
    """The upstream PRs/issues that justify the range."""
    note: str


class ProfileStatus(_Model):
    vllm_version: str | None = None
    version_row: str | None = None
    hybrid: bool | None = None
    injections: list[InjectionStatus] = Field(default_factory=list)
    rules: list[VersionRuleStatus] = Field(default_factory=list)
    """The version-table rules that applied, each with its upstream justification."""
    warnings: list[str] = Field(default_factory=list)
    """Not fatal (also posted as Warning Events), e.g. an image tag that names another vLLM release."""


class GenerationStatus(_Model):
    """One generation of prefill + decode (docs/rollouts.md)."""

    number: int
    """Sequence number: 1 for the first, one more for every new one."""
    hash: str
    """Hash of its engine pod templates: the `hybridpd.io/generation` label, the `<cr>-prefill-<hash>` names."""
    state: Literal["Serving", "Starting", "Blocked", "Draining"]
    """Serving: the router routes to it. Starting: not Ready yet (decode Ready = pair check passed against this
    generation's prefill pods). Blocked: its pods cannot be scheduled or its rollout failed. Draining: the router's
    old pods finish their in-flight requests on it; removed when they are gone."""
    prefill: str | None = None
    """Ready/desired prefill replicas."""
    decode: str | None = None
    """Ready/desired decode replicas."""
    message: str | None = Field(default=None, max_length=4096)
    """Why it is not Ready (a probe's reason, the scheduler's message), when it is not."""
    served: bool = False
    """It took traffic with every desired replica Ready at least once. Only a generation that serves or served is
    kept while a new one comes up; one that never did and cannot answer now is replaced at once."""


class RolloutStatus(_Model):
    """Which generation serves, which one is being rolled out and how far (docs/rollouts.md)."""

    state: Literal["Complete", "Starting", "Blocked", "Switching"]
    """Complete: one generation, serving. Starting: the spec's generation is coming up beside the serving one.
    Blocked: it cannot come up (its pods cannot be scheduled, e.g. no spare GPUs for a second generation, or its
    Deployment exceeded its progress deadline); the serving generation keeps serving. Switching: traffic moved to
    the spec's generation, the old one drains."""
    summary: str
    """Short progress (printer column `Rollout`), e.g. `complete`, `gen 3: 2/3 ready`, `gen 3: blocked`."""
    message: str = Field(max_length=4096)
    serving_generation: int | None = None
    """The generation the router routes to (printer column `Gen`)."""
    serving_hash: str | None = None
    target_generation: int | None = None
    """The generation the spec asks for (equal to servingGeneration when complete)."""
    target_hash: str | None = None
    latest_generation: int | None = None
    """The highest generation number assigned so far (numbers are never reused)."""
    generations: list[GenerationStatus] = Field(default_factory=list)


class KVPathStatus(_Model):
    """The KV path as the serving generation's decode last measured it (its pair check or canary: the newest report
    of a Ready decode pod on the Lease `<cr>-kv-reporter`, which only the CR's own decode pods may write;
    hpd_runtime/kube_events.py)."""

    pod: str | None = None
    message: str | None = Field(default=None, max_length=1024)
    """`KV moved at 14.2 GB/s, 173 MB per request over tcp (16 transfers)`, plus the floor warning when below it."""
    bytes_per_second: int | None = None
    bytes_per_request: int | None = None
    fabric: str | None = None
    transport: str | None = Field(default=None, max_length=200)
    """The transport UCX chose for the KV reads, as the decode saw it (e.g. `cuda_ipc`, or `tcp` emulation between
    pods in separate PID namespaces), when it could tell."""
    below_floor: bool | None = None
    """Under spec.kvTransfer.floorGBps: did UCX fall back to TCP? (Ready is not touched)."""
    observed_time: str | None = None


class HybridPDDeploymentStatus(_Model):
    observed_generation: int | None = None
    phase: Literal["Pending", "Progressing", "Ready", "Degraded", "Failed"] | None = None
    conditions: Annotated[
        list[Condition],
        Field(json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
    ] = Field(default_factory=list)
    prefill: RoleStatus | None = None
    decode: RoleStatus | None = None
    router: RoleStatus | None = None
    endpoint: str | None = None
    """Router Service URL, e.g. http://my-hpd.default.svc:8000."""
    serving: str | None = None
    """What the endpoint serves through: `router` (P/D), or in degraded mode `colocated on prefill` / `colocated
    on decode` (spec.router.degradedMode)."""
    profile: ProfileStatus | None = None
    """What the operator injected and why."""
    rollout: RolloutStatus | None = None
    """Generations of prefill + decode and the rollout between them."""
    kv_path: KVPathStatus | None = None
    """The KV path the serving decode pods measured last (absent until one reported: no pair check, no cluster
    credentials for the report, or no transfer counters in vLLM)."""


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = "unnamed"
    namespace: str | None = None


class HybridPDDeployment(BaseModel):
    """A whole CR as read from YAML (metadata is kept as-is)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    api_version: str = Field(default=f"{contract.GROUP}/{contract.VERSION}", alias="apiVersion")
    kind: Literal["HybridPDDeployment"] = "HybridPDDeployment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: HybridPDDeploymentSpec
    status: HybridPDDeploymentStatus | None = None


def with_default_images(
    cr: HybridPDDeployment,
    *,
    vllm_image: str,
    router_image: str,
    image_set: bool = True,
    vllm_digests: Mapping[str, str] | None = None,
) -> HybridPDDeployment:
    """`cr` with the operator's default images where the CR leaves them out (pure; OPERATOR_DEFAULT). `vllm_image`
    may name `{version}` (the operator's default, c.VLLM_IMAGE_TEMPLATE): it becomes spec.vllmVersion, so a CR
    that only sets vllmVersion runs our image of that version, pinned by its digest when `vllm_digests` (the
    operator's `--vllm-image-digest VERSION=sha256:...`, chart `images.vllmDigests`) knows that version.
    `image_set`: whether the CR itself named spec.image (the model fills it from vllmVersion when parsed directly, so
    the caller tells)."""
    spec = cr.spec
    update: dict[str, Any] = {}
    if not image_set:
        update["image"] = c.vllm_image(spec.vllm_version, vllm_image)
        digest = (vllm_digests or {}).get(spec.vllm_version)
        if digest and "{version}" in vllm_image and "@" not in vllm_image:
            update["image"] += f"@{digest}"
    if "image" not in spec.router.model_fields_set:
        update["router"] = spec.router.model_copy(update={"image": router_image})
    if not update:
        return cr
    return cr.model_copy(update={"spec": spec.model_copy(update=update)})


def with_default_pod_monitor_labels(cr: HybridPDDeployment, labels: Mapping[str, str]) -> HybridPDDeployment:
    """`cr` with the operator's PodMonitor labels (`--pod-monitor-label`) under its own spec.monitoring.labels."""
    if not labels:
        return cr
    monitoring = cr.spec.monitoring.model_copy(update={"labels": {**labels, **cr.spec.monitoring.labels}})
    return cr.model_copy(update={"spec": cr.spec.model_copy(update={"monitoring": monitoring})})
