"""API constants: defaults and the deny-lists of flags and env the operator owns.

The deny-lists are the ONE source for both the CRD's CEL rules (crdgen) and the operator's checks (validation.py),
so a flag is rejected with the same reason by the apiserver and by `render`/the operator.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Final

from hpd_runtime import contract

# --- Defaults -----------------------------------------------------------------------------------------------------
DEFAULT_VLLM_VERSION: Final = "0.20.0"
"""The version our H200 runs proved end to end (bench/gpu/README.md); docs/vllm-versions.md says why."""
VLLM_IMAGE_REPOSITORY: Final = "ghcr.io/hybridpd/vllm-runtime"
VLLM_IMAGE_TEMPLATE: Final = VLLM_IMAGE_REPOSITORY + ":{version}"
"""The one definition of the default vLLM image, the operator's default `--vllm-image` (chart `images.vllm`):
`{version}` becomes the CR's spec.vllmVersion (vllm_image)."""
VLLM_MINORS: Final = range(20, 34)
"""vLLM 0.<minor> releases the version table covers (versions.VERSION_RULES): 0.20 to 0.33."""
VLLM_RANGE_TEXT: Final = f"0.{VLLM_MINORS[0]} to 0.{VLLM_MINORS[-1]}"


def vllm_version_regex() -> str:
    """The spec.vllmVersion values the version table covers: 0.<minor> or 0.<minor>.<patch> (CRD CEL + pydantic)."""
    return r"^0\.(" + "|".join(str(m) for m in VLLM_MINORS) + r")(\.[0-9]+)?$"


def vllm_image(version: str, template: str = VLLM_IMAGE_TEMPLATE) -> str:
    """The vLLM image of a version from an image template (default: ours, VLLM_IMAGE_TEMPLATE): what spec.image
    becomes when only spec.vllmVersion is set."""
    return template.replace("{version}", version)


DEFAULT_VLLM_IMAGE: Final = vllm_image(DEFAULT_VLLM_VERSION)
"""Our vLLM image: `vllm/vllm-openai:v0.20.0` + nixl + the hpd_runtime package (images/vllm/Dockerfile)."""


DEFAULT_ROUTER_IMAGE: Final = "ghcr.io/hybridpd/vllm-router:0.1.17"
DEFAULT_ROUTER_SERVICE_PORT: Final = 8000
DEFAULT_ROUTER_DRAIN_SECONDS: Final = 300
DEFAULT_ROUTER_RETRIES: Final = 3
"""spec.router.retries: 4 attempts in all, at 0, 1, 1 and 2 s (images/router/retry.cfg). A crashed engine leaves the
router's choice on its pod's NotReady, about a second after the crash: the attempts after that pick among the live
ones; before it, a pick misses the dead one of two with 1/2 (each pick after a prefill has run is as good as
random under concurrency: the other requests move the round-robin counter meanwhile)."""
MAX_ROUTER_RETRIES: Final = 5
"""spec.router.drainSeconds: a replaced router pod's time to finish its in-flight requests (a few thousand tokens
at tens of tokens per second take minutes)."""
DEFAULT_WARMUP_TIMEOUT_SECONDS: Final = contract.WARMUP_TIMEOUT_SECONDS_DEFAULT
DEFAULT_WARMUP_CONCURRENCY: Final = contract.WARMUP_CONCURRENCY_DEFAULT
DEFAULT_CANARY_SECONDS: Final = int(contract.CANARY_SECONDS_DEFAULT)

# --- The KV fabric --------------------------------------------------------------------------------------------------
FABRIC_FLOOR_GBPS: Final = MappingProxyType({"tcp": 0.0, "rdma": 5.0})
"""The KV rate below which decode reports its path as slow, per declared fabric, unless spec.kvTransfer.floorGBps
says otherwise. RDMA: a 100 Gb/s NIC moves ~11 GB/s, 400 Gb/s ~45-50 GB/s; UCX emulating reads over TCP moved 0.4-0.5
GB/s on an H200 (docs/kv-path.md). TCP: no floor (a pod network's speed varies too much to name one)."""
RDMA_CAPABILITY: Final = "IPC_LOCK"
"""UCX registers (pins) GPU and host memory with the NIC: above the default memlock limit without it."""
UCX_GET_ZCOPY_ENV: Final = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"

# --- Size bounds (they also keep the CEL rules under the apiserver's cost budget) -----------------------------------
MAX_EXTRA_ARGS: Final = 64
MAX_ARG_LENGTH: Final = 1024
MAX_ENV: Final = 64
MAX_ENV_VALUE: Final = 32_768
MAX_ENV_BYTES: Final = 262_144
"""spec.env values together (as Kubernetes bounds an object's annotations): 64 values of 24 KB made a 1.57 MB CR
that etcd stored but whose every status write it then refused."""
MAX_TENSOR_PARALLEL_SIZE: Final = 64
MAX_PIPELINE_PARALLEL_SIZE: Final = 64
MAX_GPUS_PER_NODE: Final = 64
DEFAULT_GPUS_PER_NODE: Final = 8
"""An 8-GPU node (H100/H200/B200 HGX): what spec.<role>.gpusPerNode assumes unless told otherwise."""
MAX_REPLICAS: Final = 1024
MAX_RESOURCES: Final = 16
MAX_MODEL_LEN: Final = 1_048_576
"""Nemotron 3 Nano's 1M-token context, the longest of the supported models."""
MIN_GPU_MEMORY_UTILIZATION: Final = 0.05

# --- Flags the operator owns or forbids in extraArgs -----------------------------------------------------------------
_MULTI_NODE = (
    "the operator launches a replica that spans nodes itself (a LeaderWorkerSet, vLLM's multi-node launch): set "
    "spec.<role>.tensorParallelSize, pipelineParallelSize and gpusPerNode"
)
# flag -> where the setting lives instead / why it is refused. vLLM's FlexibleArgumentParser also accepts
# `--flag=value`, `--flag.key value` (JSON sub-keys) and underscores for dashes; the matcher below covers all three.
DENIED_FLAGS: Final = MappingProxyType(
    {
        "--model": "set spec.model.name / spec.model.source (the --model string must be identical on both roles)",
        "--served-model-name": "set spec.model.name",
        "--host": "the operator binds vLLM to the pod",
        "--port": f"vLLM listens on port {contract.VLLM_PORT} (the router and probes use it)",
        "--tensor-parallel-size": "set spec.prefill.tensorParallelSize / spec.decode.tensorParallelSize",
        "-tp": "set spec.prefill.tensorParallelSize / spec.decode.tensorParallelSize",
        "--block-size": "set spec.blockSize (it must be the same on both roles)",
        "--max-model-len": "set spec.model.maxModelLen",
        "--dtype": "set spec.model.dtype (it must be the same on both roles)",
        "--gpu-memory-utilization": "set spec.gpuMemoryUtilization or spec.<role>.gpuMemoryUtilization",
        "--kv-transfer-config": "the operator writes it from spec.kvTransfer (NixlConnector, kv_producer/kv_consumer)",
        "--enable-prefix-caching": "prefix caching must stay off for hybrid P/D (decode crashes on Mamba state)",
        "--no-enable-prefix-caching": "the operator sets it for hybrid models",
        "--disable-hybrid-kv-cache-manager": "the hybrid KV cache manager is required for Mamba over NIXL",
        "--no-disable-hybrid-kv-cache-manager": "the operator sets it where the vLLM version needs it",
        "--async-scheduling": "async scheduling races RDMA-loaded Mamba state on decode (vLLM <= 0.25)",
        "--no-async-scheduling": "the operator sets it on decode where the vLLM version needs it",
        "--mamba-cache-mode": "Mamba cache mode follows prefix caching, which stays off for hybrid P/D",
        "--speculative-config": "speculative decoding is not validated with hybrid P/D (MTP crashes on transferred state)",
        "--speculative-model": "speculative decoding is not validated with hybrid P/D",
        "--num-speculative-tokens": "speculative decoding is not validated with hybrid P/D",
        "--shutdown-timeout": "set spec.drainTimeoutSeconds (the preStop and the termination grace period follow it)",
        "--disable-log-stats": "it removes every vllm:* metric from /metrics (dashboards, alerts, autoscaling)",
        "--pipeline-parallel-size": "set spec.prefill.pipelineParallelSize / spec.decode.pipelineParallelSize (the GPUs "
        "and nodes of a replica follow it)",
        "-pp": "set spec.prefill.pipelineParallelSize / spec.decode.pipelineParallelSize",
        "--data-parallel-size": "one data-parallel rank per pod: the NIXL side-channel port is base + DP rank",
        "--distributed-executor-backend": "the operator runs vLLM's multiprocessing executor, across the pods of a "
        "replica that spans nodes (mp; Ray is not used)",
        "--headless": "vLLM would serve no API: the operator sets it on the workers of a replica that spans nodes only "
        "(spec.<role>.gpusPerNode)",
        "--nnodes": _MULTI_NODE,
        "--node-rank": _MULTI_NODE,
        "--master-addr": _MULTI_NODE,
        "--master-port": _MULTI_NODE,
        "--config": "a YAML file of flags would bypass these checks (vLLM reads it before the command line)",
        "--help": "vLLM prints its help and exits (the pod would restart forever)",
    }
)
"""Flags that may not appear in spec.extraArgs / spec.<role>.extraArgs, with the reason shown to the user."""

SPECULATIVE_FLAGS: Final = frozenset({"--speculative-config", "--speculative-model", "--num-speculative-tokens"})

OWNED_ENV: Final = MappingProxyType(
    {
        contract.ENV_VLLM_SSM_CONV_STATE_LAYOUT: "the operator sets DS for hybrid models (NIXL asserts it)",
        contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST: "the operator sets the pod IP (downward API)",
        contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT: "set spec.kvTransfer.sideChannelPort",
        contract.ENV_POD_IP: "the operator sets it from the downward API",
        "UCX_TLS": "set spec.kvTransfer.ucx.tls",
        "UCX_NET_DEVICES": "set spec.kvTransfer.ucx.netDevices",
    }
)
"""Env names that may not appear in spec.env (plus every `HPD_*` name, the runtime contract's namespace)."""
OWNED_ENV_PREFIX: Final = "HPD_"


def normalize_flag(arg: str) -> str | None:
    """The flag an extraArgs item names (`--block_size=16` -> `--block-size`), or None for a plain value."""
    if not arg.startswith("-") or arg in ("-", "--") or _NUMBER.match(arg):
        return None
    name = re.split(r"[=.]", arg, maxsplit=1)[0] if arg.startswith("--") else arg.split("=", 1)[0]
    return name.replace("_", "-")


_NUMBER = re.compile(r"^-\d")


def denied_flags_regex() -> str:
    """An RE2 regex (CEL `matches`) that matches an extraArgs item naming any DENIED_FLAGS entry."""
    alts = []
    for flag in sorted(DENIED_FLAGS):
        words = flag.lstrip("-").split("-")
        dashes = flag[: len(flag) - len(flag.lstrip("-"))]
        alts.append(dashes + "[-_]".join(words))
    return "^(" + "|".join(alts) + ")([=.].*)?$"


def denied_flags_text() -> str:
    """The deny-list as shown in messages."""
    return ", ".join(sorted(DENIED_FLAGS))
