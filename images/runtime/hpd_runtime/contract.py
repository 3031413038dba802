"""The one contract between the operator's builders and the code inside the pods.

Every env var name, port, path and label that both sides use is defined here, once. The builders import
this module (never re-type a name); the runtime reads its configuration through it. Stdlib only: this file
ships in the vLLM image.
"""

from __future__ import annotations

from typing import Final, Literal

Role = Literal["prefill", "decode"]
ROLES: Final[tuple[Role, Role]] = ("prefill", "decode")

# --- API identity (shared so labels and the runtime agree with the CRD) ---------------------------------------
GROUP: Final = "hybridpd.io"
VERSION: Final = "v1alpha1"
KIND: Final = "HybridPDDeployment"
PLURAL: Final = "hybridpddeployments"
FIELD_MANAGER: Final = "hybrid-pd-operator"
ANNOTATION_DESIRED_HASH: Final = f"{GROUP}/desired-hash"
"""On every child: a hash of the manifest the operator last applied; a child is re-applied only when it differs."""

# --- Labels ---------------------------------------------------------------------------------------------------
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_ROLE: Final = f"{GROUP}/role"
LABEL_GENERATION: Final = f"{GROUP}/generation"
"""On engine Deployments, their pods and headless Services, and on the router: the generation (a hash of the engine
pod templates) they belong to or route to. The router's discovery selectors and decode's prefill Service select on
it, so a prefill and a decode of different generations never pair (docs/rollouts.md)."""
LABEL_GENERATION_NUMBER: Final = f"{GROUP}/generation-number"
"""Beside LABEL_GENERATION: the generation's sequence number (1, 2, ...), for people (`kubectl get pods -L`)."""
APP_NAME: Final = "hybrid-pd"
MANAGED_BY: Final = "hybrid-pd-operator"
COMPONENT_ROUTER: Final = "router"
LABEL_GROUP_ROLE: Final = f"{GROUP}/group-role"
"""On the pods of a replica that spans nodes (a LeaderWorkerSet group): `leader` (serves the API, warms up, runs the
pair check, joins the router) or `worker` (vLLM's headless ranks). Pods of a one-pod replica do not carry it."""
GROUP_LEADER: Final = "leader"
GROUP_WORKER: Final = "worker"
GroupRole = Literal["leader", "worker"]

# --- Ports (container side) ----------------------------------------------------------------------------------
VLLM_PORT: Final = 8000
"""vLLM's OpenAI server inside prefill/decode pods (container port name `http`); the router talks to it."""
RUNTIME_PORT: Final = 8081
"""The runtime's readiness server: /readyz, /livez, /metrics, /vllm/metrics (container port name `runtime`). It
serves nothing that changes state, so it is the one engine port that Prometheus is let through to."""
SIDE_CHANNEL_PORT_DEFAULT: Final = 5600
"""NIXL side channel (ZMQ) base port; vLLM listens on base + data-parallel rank."""
MASTER_PORT: Final = 29501
"""torch.distributed's rendezvous on the leader of a replica that spans nodes (vLLM's `--master-port` default)."""
ROUTER_PORT: Final = 8090
"""The router pod's API (container port name `http`, the `<cr>` Service's target): vllm-router's own, or, in P/D mode
with spec.router.retries > 0, the retry proxy's in front of it (ROUTER_BACKEND_PORT)."""
ROUTER_METRICS_PORT: Final = 29000
ROUTER_BACKEND_PORT: Final = 8091
"""vllm-router's API behind the retry proxy (container port name `router-http`): the proxy reaches it on 127.0.0.1,
the kubelet's probes on the pod IP; the router NetworkPolicy admits no client to it."""
ROUTER_RETRY_CONFIG: Final = "/etc/hpd/retry.cfg"
"""The retry proxy's HAProxy configuration in the router image (images/router/retry.cfg), set by the environment
below."""
ENV_RETRY_PORT: Final = "HPD_RETRY_PORT"
ENV_RETRY_ROUTER_PORT: Final = "HPD_ROUTER_PORT"
ENV_RETRY_HOLD_PORT: Final = "HPD_RETRY_HOLD_PORT"
ENV_RETRIES: Final = "HPD_RETRIES"
ROUTER_RETRY_HOLD_PORT: Final = 8092
"""The retry proxy's one-second hold on 127.0.0.1 (retry.cfg `later`): every other retry passes through it."""
PATH_RETRY_HEALTH: Final = "/hpd-retry/health"
"""Answered by the retry proxy itself (HAProxy's monitor-uri): its own readiness and liveness."""

# A pair pod (spec.kvTransfer.processNamespace Pair): one prefill engine, one decode engine and an in-pod router in one
# pod, one PID namespace (shareProcessNamespace) and one network namespace. Prefill keeps the ports above; decode and the
# in-pod router take these, so nothing in the pod listens twice on one port.
COMPONENT_PAIR: Final = "pair"
"""`app.kubernetes.io/component` of a pair pod, its Deployment and PodDisruptionBudget (they carry no role label: the
pod holds both roles)."""
PAIR_DECODE_VLLM_PORT: Final = 8100
"""Decode's vLLM API in a pair pod (container port name `decode-http`); the in-pod router and decode's runtime ask it."""
PAIR_DECODE_RUNTIME_PORT: Final = 8181
"""Decode's runtime readiness server in a pair pod (container port name `decode-runtime`)."""
PAIR_DECODE_SIDE_CHANNEL_OFFSET: Final = 50
"""Decode's NIXL side channel in a pair pod: spec.kvTransfer.sideChannelPort + this (prefill keeps the base; vLLM
listens on the base plus a rank, so the offset leaves room above the base for them)."""
PAIR_ROUTER_PORT: Final = 8200
"""The in-pod router (vllm-router in P/D mode over 127.0.0.1) of a pair pod (container port name `pair-router`): the
port the CR's router discovers pair pods on."""
PAIR_ROUTER_METRICS_PORT: Final = 29000
"""The in-pod router's Prometheus port (container port name `metrics`, as the CR's router's)."""
PAIR_PORTS: Final = (PAIR_DECODE_VLLM_PORT, PAIR_DECODE_RUNTIME_PORT, PAIR_ROUTER_PORT, PAIR_ROUTER_METRICS_PORT)
"""What decode and the in-pod router listen on in a pair pod, beside prefill's VLLM_PORT and RUNTIME_PORT."""
PAIR_LOOPBACK: Final = "127.0.0.1"
"""Where decode's pair check and the in-pod router reach the pod's own prefill (and decode)."""

PORT_NAME_HTTP: Final = "http"
PORT_NAME_RUNTIME: Final = "runtime"
PORT_NAME_SIDE_CHANNEL: Final = "nixl-side"
PORT_NAME_ROUTER_METRICS: Final = "metrics"
PORT_NAME_DECODE_HTTP: Final = "decode-http"
PORT_NAME_DECODE_RUNTIME: Final = "decode-runtime"
PORT_NAME_DECODE_SIDE_CHANNEL: Final = "decode-nixl"
PORT_NAME_PAIR_ROUTER: Final = "pair-router"
PORT_NAME_ROUTER_BACKEND: Final = "router-http"

PATH_READYZ: Final = "/readyz"
PATH_LIVEZ: Final = "/livez"
PATH_METRICS: Final = "/metrics"
PATH_VLLM_METRICS: Final = "/vllm/metrics"
"""On the runtime port: vLLM's own /metrics, fetched from its loopback API (GET only, size- and time-bounded). Prometheus
scrapes vLLM here, so the NetworkPolicy never has to open vLLM's API port (which also serves completions) to it."""
PATH_VLLM_HEALTH: Final = "/health"
PATH_IDENTITY: Final = "/identity"
"""The runtime's boot id (JSON `bootId`): decode polls its prefill peers' to notice a restarted vLLM."""
PROBE_COMMAND: Final = ("python3", "-m", "hpd_runtime", "probe")
"""Exec startup/readiness probe: prints the /readyz reason, so the kubelet's `Unhealthy` Event carries it
("Readiness probe failed: <reason>"); an HTTP probe's Event has only the status code."""

DRAIN_COMMAND: Final = ("python3", "-m", "hpd_runtime", "drain")
"""The engine container's preStop hook (hpd_runtime.drain): stop new work, wait for in-flight requests and, on
prefill, for decode to pull the KV it holds, then return so the kubelet's SIGTERM finds vLLM idle."""
PATH_DRAIN: Final = "/drain"
"""POST on the runtime port: turn /readyz 503 "draining" for good (the preStop calls it first)."""
ENV_DRAIN_TIMEOUT_SECONDS: Final = "HPD_DRAIN_TIMEOUT_SECONDS"
"""How long the preStop waits for in-flight work; vLLM gets the same as --shutdown-timeout after SIGTERM."""
ENV_DRAIN_PROPAGATION_SECONDS: Final = "HPD_DRAIN_PROPAGATION_SECONDS"
"""How long the preStop waits first, for the router's pod watch to drop the leaving pod (its deletion event)."""
DRAIN_TIMEOUT_SECONDS_DEFAULT: Final = 120
DRAIN_PROPAGATION_SECONDS_DEFAULT: Final = 5

# --- Image user ------------------------------------------------------------------------------------------------
IMAGE_UID: Final = 10001
"""The uid (gid 0) every image of ours runs as (images/*/Dockerfile `ARG UID`), and the pods' runAsUser: >= 10000,
above any uid a node's own accounts use (checkov CKV_K8S_40), so a container breakout is not also a host user."""

# --- Mount paths -----------------------------------------------------------------------------------------------
CACHE_MOUNT: Final = "/cache"
"""Persistent compile/Triton cache volume; the runtime keys a subdirectory per model x vLLM x GPU x TP x role."""
SHM_MOUNT: Final = "/dev/shm"
MODEL_MOUNT: Final = "/models"
"""Where a PVC model source is mounted (the model path passed to vLLM is under it)."""
HOME_MOUNT: Final = "/home/hpd"
"""The vLLM image's HOME (an emptyDir: the root filesystem is read-only); what writes under it: vLLM's usage stats
and config (~/.config/vllm), Triton's ~/.triton, any ~/.cache a library opens before `launch` points it at /cache."""
TMP_MOUNT: Final = "/tmp"
"""An emptyDir too: Python's tempfile, torch and Triton compile scratch, UCX/NIXL's temporary files."""
HF_HOME_SUBDIR: Final = "huggingface"
"""HF_HOME is CACHE_MOUNT/HF_HOME_SUBDIR (the vLLM image's ENV): weights downloaded from the Hub land in the cache
volume."""

# --- Env the operator sets on prefill/decode containers and the runtime reads ----------------------------------
ENV_ROLE: Final = "HPD_ROLE"
"""`prefill` or `decode`."""
ENV_INSTANCE: Final = "HPD_INSTANCE"
"""Name of the owning HybridPDDeployment."""
ENV_MODEL: Final = "HPD_MODEL"
"""The model id/path exactly as given to `vllm serve` (identical on both roles: NIXL compat hash)."""
ENV_VLLM_VERSION: Final = "HPD_VLLM_VERSION"
ENV_TENSOR_PARALLEL_SIZE: Final = "HPD_TENSOR_PARALLEL_SIZE"
ENV_GPU_PRODUCT: Final = "HPD_GPU_PRODUCT"
"""Optional; when unset the runtime asks the GPU (nvidia-smi) for the cache key."""
ENV_VLLM_PORT: Final = "HPD_VLLM_PORT"
ENV_RUNTIME_PORT: Final = "HPD_RUNTIME_PORT"
ENV_CACHE_DIR: Final = "HPD_CACHE_DIR"
ENV_MAX_MODEL_LEN: Final = "HPD_MAX_MODEL_LEN"
ENV_SSD_CHUNK_SIZE: Final = "HPD_SSD_CHUNK_SIZE"
"""Mamba2 SSD chunk size of the model when known (warmup sends prompts of at least 2x it)."""
ENV_WARMUP_ENABLED: Final = "HPD_WARMUP_ENABLED"
ENV_WARMUP_PROMPT_LENGTHS: Final = "HPD_WARMUP_PROMPT_LENGTHS"
"""Comma-separated token counts; empty = derived from chunk size and max model len."""
ENV_WARMUP_CONCURRENCY: Final = "HPD_WARMUP_CONCURRENCY"
ENV_WARMUP_TIMEOUT_SECONDS: Final = "HPD_WARMUP_TIMEOUT_SECONDS"
ENV_WARMUP_PAIR_CHECK: Final = "HPD_WARMUP_PAIR_CHECK"
ENV_PREFILL_SERVICE: Final = "HPD_PREFILL_SERVICE"
"""Headless Service DNS name of the prefill pods (decode's pair check resolves it to Ready prefill pods)."""
ENV_POD_IP: Final = "HPD_POD_IP"
"""Downward API `status.podIP`."""
ENV_POD_NAME: Final = "HPD_POD_NAME"
"""Decode with the pair check: downward API `metadata.name` (the pod its KVPath Events are about)."""
ENV_POD_NAMESPACE: Final = "HPD_POD_NAMESPACE"
"""Decode with the pair check: downward API `metadata.namespace`."""
ENV_POD_UID: Final = "HPD_POD_UID"
"""Decode with the pair check: downward API `metadata.uid`."""
EVENT_REASON_KV_PATH: Final = "KVPath"
"""The reason of the Event a decode posts on its own pod with the KV rate its pair check or canary measured (Normal;
Warning below the fabric's floor), for `kubectl describe pod`; the operator reads the same report from the CR's
kv-reporter Lease (ENV_KV_REPORT_LEASE), never from Events."""
EVENT_COMPONENT_RUNTIME: Final = "hpd-runtime"
ENV_KV_REPORT_LEASE: Final = "HPD_KV_REPORT_LEASE"
"""Decode with the pair check: the Lease (coordination.k8s.io, `<cr>-kv-reporter`) whose annotation
`ANNOTATION_KV_REPORT_PREFIX + <pod uid>` holds the pod's KV path report (KV_REPORT_FIELDS, JSON). Only the CR's
kv-reporter ServiceAccount may patch it (its Role names it), so the operator reads the KV path from there and not
from Events, which anyone who may create Events can post. A Lease, not a ConfigMap: the operator watches the kind it
reads, and watching every ConfigMap of the cluster is read access to all of them."""
ANNOTATION_KV_REPORT_PREFIX: Final = f"kv.{GROUP}/"
"""The prefix of a decode pod's report annotation on the kv-reporter Lease; the rest is the pod's uid."""
KV_REPORT_FIELDS: Final = ("uid", "bytesPerSecond", "bytesPerRequest", "fabric", "belowFloor", "message",
                           "observedTime", "transport", "prefills")  # fmt: skip
"""The keys of one KV path report on that Lease (camelCase, as status.kvPath names them; `uid`: the pod's;
`prefills`: KV_REPORT_PREFILLS)."""
KV_REPORT_PREFILLS: Final = "prefills"
"""The report's list of the prefill peers whose pair check with this decode passed and still holds, each
`{"ip": <the pod IP the headless Service answered>, "verifiedTime": <when its current vLLM process passed>}`
(hpd_runtime.pairing.PairMonitor.peer_report). The prefill pods carry no downward-API uid, so the IP names the pod;
the time tells a check of an earlier pod that had the same IP from one of the pod that has it now (the operator
counts an entry for a pod created no later than it, within its clock-skew allowance). Degraded mode's switch back to
the router waits for a Ready prefill pod in this list (hpd_operator.builders.fallback.choose); a report without the
key (an older runtime) holds nothing."""
ANNOTATION_KV_BYTES_PER_SECOND: Final = f"{GROUP}/kv-bytes-per-second"
ANNOTATION_KV_BYTES_PER_REQUEST: Final = f"{GROUP}/kv-bytes-per-request"
ANNOTATION_KV_FABRIC: Final = f"{GROUP}/kv-fabric"
ANNOTATION_KV_BELOW_FLOOR: Final = f"{GROUP}/kv-below-floor"
ENV_PREFILL_PORT: Final = "HPD_PREFILL_PORT"
"""vLLM port on the prefill pods for the pair check; default VLLM_PORT (the operator need not set it)."""
ENV_PREFILL_RUNTIME_PORT: Final = "HPD_PREFILL_RUNTIME_PORT"
"""Runtime port on the prefill pods (GET /identity); default RUNTIME_PORT (the operator need not set it)."""
ENV_PAIR_RECHECK_SECONDS: Final = "HPD_PAIR_RECHECK_SECONDS"
"""Decode: how often the prefill peers are polled for a change (new address or boot id); default 10."""
ENV_PAIR_CHECK_CONCURRENCY: Final = "HPD_PAIR_CHECK_CONCURRENCY"
"""Decode: how many prompts of the start-up pair check's last round run at once (default
PAIR_CHECK_CONCURRENCY_DEFAULT; 1 = every prompt one after another, as before 2026-12-02)."""
ENV_PAIR_MAX_LOGPROB_DELTA: Final = "HPD_PAIR_MAX_LOGPROB_DELTA"
"""Decode: the largest |top-1 logprob| difference P->D vs local that the pair check accepts (nats); default 0.5."""
ENV_PAIR_RESTART_ON_BREAK: Final = "HPD_PAIR_RESTART_ON_BREAK"
"""Decode: restart vLLM (exit the container) when a pair that had passed stays broken; default on."""
ENV_CANARY_SECONDS: Final = "HPD_CANARY_SECONDS"
"""Decode: every how many seconds a short verified P->D round trip re-proves each Ready prefill after Ready (the
canary); 0 = off. From spec.warmup.canarySeconds."""
ENV_KV_FABRIC: Final = "HPD_KV_FABRIC"
"""The fabric the CR declares between prefill and decode (spec.kvTransfer.fabric: tcp, rdma): named in the report."""
ENV_KV_FLOOR_BYTES_PER_SECOND: Final = "HPD_KV_FLOOR_BYTES_PER_SECOND"
"""Decode: below this measured KV rate the runtime reports the path as slow for its fabric (0 = no floor)."""
ENV_GROUP_ROLE: Final = "HPD_GROUP_ROLE"
"""`leader` or `worker` on the pods of a replica that spans nodes (LABEL_GROUP_ROLE); unset on a one-pod replica,
which behaves as a leader. A worker runs vLLM headless: no API, no warmup; Ready while its ranks run."""

# --- Env LeaderWorkerSet's pod webhook injects into every container of a group (sigs.k8s.io/lws v0.9
# api/leaderworkerset/v1/leaderworkerset_types.go; pkg/utils/pod/pod_utils.go AddLWSVariables, put first so that
# later entries and the args can refer to them as $(NAME)) ---------------------------------------------------------
ENV_LWS_LEADER_ADDRESS: Final = "LWS_LEADER_ADDRESS"
"""`<lws>-<group>.<subdomain>.<namespace>`: the group leader's DNS name (a headless Service LWS makes)."""
ENV_LWS_WORKER_INDEX: Final = "LWS_WORKER_INDEX"
"""0 on the leader, 1..size-1 on the workers: vLLM's --node-rank."""
ENV_LWS_GROUP_SIZE: Final = "LWS_GROUP_SIZE"
"""Pods in the group: vLLM's --nnodes."""

# --- Runtime knobs with safe defaults (the operator normally leaves them unset; tests and debugging set them) ---
ENV_VLLM_HOST: Final = "HPD_VLLM_HOST"
"""Host the runtime uses to reach its own vLLM (health, warmup); default 127.0.0.1."""
ENV_RUNTIME_HOST: Final = "HPD_RUNTIME_HOST"
"""Bind address of the readiness server; default 0.0.0.0 (the kubelet probes the pod IP)."""
ENV_VLLM_COMMAND: Final = "HPD_VLLM_COMMAND"
"""Override of the program that `launch` starts instead of `python -m vllm.entrypoints.cli.main serve`
(shell-split; the vLLM args are appended). For tests and debugging."""
ENV_WARMUP_MAX_TOKENS: Final = "HPD_WARMUP_MAX_TOKENS"
"""Decode tokens per warmup request (default 4)."""
ENV_STABLE_TRITON_CACHE: Final = "HPD_STABLE_TRITON_CACHE"
"""Default on: route Triton's file cache to the keyed dir via TRITON_CACHE_MANAGER (see hpd_runtime.triton_cache)."""
ENV_TRITON_STABLE_DIR: Final = "HPD_TRITON_STABLE_DIR"
"""Set by `launch` for the vLLM process tree: the keyed directory hpd_runtime.triton_cache writes to."""
ENV_CACHE_KEY: Final = "HPD_CACHE_KEY"
"""Set by `launch` for the vLLM process tree (informational): the computed cache key."""
ENV_GEMM_WARMUP_TOKENS: Final = "HPD_GEMM_WARMUP_TOKENS"
"""Read by the vLLM plugin hpd_runtime.gemm_warmup in vLLM's worker: warm every GEMM row count 1..N before Ready
(`auto`: N = max_num_batched_tokens). Unset: off. The operator sets `auto` when spec.warmup.enabled and
spec.warmup.everyLength (both default true)."""
ENV_GEMM_WARMUP_SECONDS: Final = "HPD_GEMM_WARMUP_SECONDS"
"""Upper bound on the GEMM row-count sweep (seconds; default GEMM_WARMUP_SECONDS_DEFAULT). The operator sets
min(GEMM_WARMUP_SECONDS_DEFAULT, spec.warmup.timeoutSeconds)."""

# --- Runtime defaults ---------------------------------------------------------------------------------------------
SSD_CHUNK_SIZE_DEFAULT: Final = 256
WARMUP_CONCURRENCY_DEFAULT: Final = 4
WARMUP_TIMEOUT_SECONDS_DEFAULT: Final = 900
"""Also the CRD default of spec.warmup.timeoutSeconds (api/constants.py takes both warmup defaults from here)."""
GEMM_WARMUP_SECONDS_DEFAULT: Final = 300
WARMUP_MAX_TOKENS_DEFAULT: Final = 4
PAIR_RECHECK_SECONDS_DEFAULT: Final = 10.0
CANARY_SECONDS_DEFAULT: Final = 300.0
PAIR_CHECK_CONCURRENCY_DEFAULT: Final = 4
"""The start-up pair check's last round sends its prompts 4 at a time, so decode has served concurrent P->D reads
and local prefills mixed with running P->D decodes before Ready (the first canary under load stalled ~2 s on
0.20 when both were first seen after Ready: bench/gpu/README.md)."""
CANARY_LENGTHS: Final = 2
"""Prompts per canary round trip (the shortest and the longest of the pair check's lengths)."""
PAIR_MAX_LOGPROB_DELTA_DEFAULT: Final = 0.5
EXIT_PAIR_BROKEN: Final = 75
"""`launch` exit status after it stopped vLLM because P->D stayed broken (EX_TEMPFAIL: the kubelet restarts it)."""

# --- vLLM's own env that the profile sets ------------------------------------------------------------------------
ENV_VLLM_SSM_CONV_STATE_LAYOUT: Final = "VLLM_SSM_CONV_STATE_LAYOUT"
ENV_VLLM_NIXL_SIDE_CHANNEL_HOST: Final = "VLLM_NIXL_SIDE_CHANNEL_HOST"
ENV_VLLM_NIXL_SIDE_CHANNEL_PORT: Final = "VLLM_NIXL_SIDE_CHANNEL_PORT"
ENV_VLLM_HOST_IP: Final = "VLLM_HOST_IP"
"""The address vLLM's processes advertise to each other (vllm.utils.network_utils.get_ip): on a replica that spans
nodes, the leader's message queue to the remote ranks (v1/executor/multiproc_executor.py `mq_connect_ip`)."""
ENV_VLLM_CACHE_ROOT: Final = "VLLM_CACHE_ROOT"
ENV_TRITON_CACHE_DIR: Final = "TRITON_CACHE_DIR"
ENV_XDG_CACHE_HOME: Final = "XDG_CACHE_HOME"
ENV_TRITON_CACHE_MANAGER: Final = "TRITON_CACHE_MANAGER"
ENV_TORCHINDUCTOR_CACHE_DIR: Final = "TORCHINDUCTOR_CACHE_DIR"
ENV_FLASHINFER_WORKSPACE_BASE: Final = "FLASHINFER_WORKSPACE_BASE"
ENV_CUDA_CACHE_PATH: Final = "CUDA_CACHE_PATH"

TRUE_VALUES: Final = frozenset({"1", "true", "yes", "on"})


def env_flag(value: str | None, default: bool = False) -> bool:
    """Parse a boolean env value the same way on both sides."""
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in TRUE_VALUES
