"""What the operator knows about a model: the built-in table of config numbers and how a spec resolves (pure).

    info = model_info(spec)        # ModelInfo: the --model string, the config numbers and where they came from,
                                   # hybrid or not and why
    disk = disk_plan(spec)         # DiskPlan: where the weights go, the cache volume's sizeLimit, the pod's
                                   # ephemeral-storage request

A new known model is a row in KNOWN_MODELS, with numbers from its public config.json only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from hpd_operator.api.models import HybridPDDeploymentSpec, ModelConfigSpec
from hpd_operator.api.rules import quantity
from hpd_runtime import contract

# ---------------------------------------------------------------------------------------------------------------
# Known models (config.json numbers, only where a public config was found)
# ---------------------------------------------------------------------------------------------------------------
_NANO_30B_A3B = ModelConfigSpec(
    num_attention_heads=32,
    num_key_value_heads=2,
    mamba_num_heads=64,
    mamba_n_groups=8,
    hidden_size=2688,
    ssd_chunk_size=128,
    hybrid_override_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
)
_NEMOTRON_H_8B = ModelConfigSpec(
    num_attention_heads=32,
    num_key_value_heads=8,
    mamba_num_heads=128,
    mamba_n_groups=8,
    hidden_size=4096,
    hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
)
KNOWN_MODELS: Final[dict[str, ModelConfigSpec]] = {
    # Nemotron 3 Nano 30B-A3B (BF16 and its FP8 quantization share config.json's architecture numbers).
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8": _NANO_30B_A3B,
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": _NANO_30B_A3B,
    # Nemotron-H 8B base (chunk size not confirmed from a public config: left unset).
    "nvidia/Nemotron-H-8B-Base-8K": _NEMOTRON_H_8B,
}
"""Models checked without a user-typed spec.model.config. Nemotron-H 47B/56B are left out on purpose: their
head/group numbers were not found in a public config.json."""


def model_path(spec: HybridPDDeploymentSpec) -> str:
    """The `--model` string: the PVC mount path, the Hugging Face repo, or spec.model.name."""
    src = spec.model.source
    if src is not None and src.pvc is not None:
        return f"{contract.MODEL_MOUNT}/{src.pvc.path.strip('/')}"
    if src is not None and src.huggingface is not None and src.huggingface.repo:
        return src.huggingface.repo
    return spec.model.name


def model_config(spec: HybridPDDeploymentSpec) -> tuple[ModelConfigSpec | None, str]:
    """The config numbers to check against (user's, else the built-in table's) and where they came from."""
    if spec.model.config is not None:
        return spec.model.config, "spec.model.config"
    for key in (model_path(spec), spec.model.name):
        if key in KNOWN_MODELS:
            return KNOWN_MODELS[key], f"built-in table ({key})"
    return None, "unknown"


def resolve_hybrid(spec: HybridPDDeploymentSpec, cfg: ModelConfigSpec | None, cfg_src: str) -> tuple[bool, str]:
    """Whether the model is hybrid Mamba2/attention, and why (status.profile, the HybridProfileApplied condition)."""
    if spec.model.hybrid == "mamba2":
        return True, "spec.model.hybrid=mamba2"
    if spec.model.hybrid == "none":
        return False, "spec.model.hybrid=none"
    if cfg is not None and cfg.hybrid_override_pattern is not None:
        has_m = "M" in cfg.hybrid_override_pattern
        return has_m, f"hybrid_override_pattern from {cfg_src} {'has' if has_m else 'has no'} Mamba layers"
    if cfg is not None and cfg.mamba_num_heads is not None:
        return True, f"mamba heads from {cfg_src}"
    return True, "spec.model.hybrid=auto and the model is unknown: hybrid settings applied (safe either way)"


@dataclass(frozen=True)
class ModelInfo:
    """spec.model as the checks and the profile need it."""

    path: str
    """The `--model` string (identical on both roles: it is in the NIXL compatibility hash)."""
    config: ModelConfigSpec | None
    """The config numbers to check TP against: spec.model.config, else the built-in table's, else None."""
    config_source: str
    """Where `config` came from, for messages: `spec.model.config`, `built-in table (<name>)` or `unknown`."""
    hybrid: bool
    hybrid_reason: str

    @property
    def ssd_chunk_size(self) -> int | None:
        return self.config.ssd_chunk_size if self.config is not None else None


def model_info(spec: HybridPDDeploymentSpec) -> ModelInfo:
    cfg, source = model_config(spec)
    hybrid, reason = resolve_hybrid(spec, cfg, source)
    return ModelInfo(path=model_path(spec), config=cfg, config_source=source, hybrid=hybrid, hybrid_reason=reason)


# ---------------------------------------------------------------------------------------------------------------
# Disk: where the weights go and how much node disk a pod may use
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSize:
    """A checkpoint's size on disk, from its model card."""

    parameters: float
    """Total parameters (every expert of a mixture-of-experts model)."""
    bytes_per_parameter: float
    """2 for BF16; an FP8 checkpoint keeps embeddings, norms and the Mamba mixers in BF16: 1.1 on average."""

    @property
    def gib(self) -> float:
        return self.parameters * self.bytes_per_parameter / GIB


GIB: Final = 2**30
KNOWN_SIZES: Final[dict[str, ModelSize]] = {
    # Nemotron 3 Nano 30B-A3B: 31.6 B parameters in total (model card), ~3.6 B active per token.
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8": ModelSize(parameters=31.6e9, bytes_per_parameter=1.1),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ModelSize(parameters=31.6e9, bytes_per_parameter=2),
    "nvidia/Nemotron-H-8B-Base-8K": ModelSize(parameters=8.1e9, bytes_per_parameter=2),
}
"""Checkpoint sizes of the models in KNOWN_MODELS (the cache volume's default size when weights are downloaded)."""
DOWNLOAD_HEADROOM: Final = 1.1
"""The Hugging Face Hub client writes each file as `.incomplete` and renames it, and keeps the repo's other files."""
UNKNOWN_WEIGHTS_GIB: Final = 100
"""A model the table does not know, downloaded into the cache: its bound until spec.cache.sizeLimit names one (a
larger download is evicted with the kubelet's "exceeds the limit" message, naming the volume)."""
COMPILE_CACHE_GIB: Final = 10
"""torch.compile/Inductor, Triton, FlashInfer and CUDA caches of one role under /cache (keyed per model x vLLM x GPU x
TP x role by `launch`): an allowance of a few compiles, not a measurement of any one."""
TMP_SIZE_LIMIT_GIB: Final = 4
"""/tmp (contract.TMP_MOUNT): Python's tempfile, torch/Triton compile scratch, UCX/NIXL temporary files."""
HOME_SIZE_LIMIT_GIB: Final = 1
"""HOME (contract.HOME_MOUNT): vLLM's config and usage stats, Triton's ~/.triton; the caches are pointed at /cache."""


@dataclass(frozen=True)
class DiskPlan:
    """A pod's node-disk use: the volumes on the node's disk and what the scheduler is told (spec -> pod)."""

    weights: str
    """Where the weights go, for status.profile and docs/install.md."""
    cache_size_limit: str | None
    """The `cache` emptyDir's sizeLimit; None when the cache is a PVC."""
    ephemeral_storage: str
    """The engine container's ephemeral-storage request: every emptyDir on the node's disk (cache, /tmp, HOME)."""
    reason: str
    """How the cache size was chosen."""


def model_size(spec: HybridPDDeploymentSpec) -> ModelSize | None:
    for key in (model_path(spec), spec.model.name):
        if key in KNOWN_SIZES:
            return KNOWN_SIZES[key]
    return None


def _gi(gib: float) -> str:
    return f"{math.ceil(gib)}Gi"


def _cache_size(spec: HybridPDDeploymentSpec, downloads: bool) -> tuple[float, str]:
    """(GiB, why) of the cache emptyDir."""
    if spec.cache.size_limit is not None:
        q = quantity(spec.cache.size_limit)
        return float(q or Decimal(0)) / GIB, "spec.cache.sizeLimit"
    if not downloads:
        return COMPILE_CACHE_GIB, f"compile caches only ({COMPILE_CACHE_GIB} GiB): the weights come from a PVC"
    size = model_size(spec)
    if size is None:
        return UNKNOWN_WEIGHTS_GIB + COMPILE_CACHE_GIB, (
            f"model size unknown: {UNKNOWN_WEIGHTS_GIB} GiB for weights + {COMPILE_CACHE_GIB} GiB compile caches; "
            "set spec.cache.sizeLimit for a larger model"
        )
    weights = size.gib * DOWNLOAD_HEADROOM
    return weights + COMPILE_CACHE_GIB, (
        f"{size.parameters / 1e9:g} B parameters x {size.bytes_per_parameter:g} bytes = {size.gib:.0f} GiB of weights "
        f"(+{DOWNLOAD_HEADROOM - 1:.0%} while downloading) + {COMPILE_CACHE_GIB} GiB compile caches"
    )


def disk_plan(spec: HybridPDDeploymentSpec) -> DiskPlan:
    """Where the weights land and the node disk an engine pod may use: a PVC model source is mounted read-only
    (nothing downloaded); otherwise vLLM downloads from the Hugging Face Hub into HF_HOME on the cache volume
    (contract.CACHE_MOUNT/huggingface), for every new pod when the cache is an emptyDir."""
    src = spec.model.source
    downloads = src is None or src.pvc is None
    hf_home = f"{contract.CACHE_MOUNT}/{contract.HF_HOME_SUBDIR}"
    scratch = TMP_SIZE_LIMIT_GIB + HOME_SIZE_LIMIT_GIB
    if src is not None and src.pvc is not None:
        weights = f"PVC {src.pvc.claim_name} at {model_path(spec)} (read-only, nothing downloaded)"
    elif spec.cache.type == "pvc" and spec.cache.claim_name:
        weights = f"downloaded from the Hugging Face Hub into PVC {spec.cache.claim_name} ({hf_home}), kept across pods"
    else:
        weights = (
            f"downloaded from the Hugging Face Hub into the pod's cache emptyDir ({hf_home}) on the node's disk, "
            "again by every new pod; a PVC model source or cache is the production way (docs/install.md)"
        )
    if spec.cache.type == "pvc" and spec.cache.claim_name:
        return DiskPlan(weights, None, _gi(scratch), f"cache on PVC {spec.cache.claim_name}: /tmp and HOME only")
    gib, why = _cache_size(spec, downloads)
    limit = str(spec.cache.size_limit) if spec.cache.size_limit is not None else _gi(gib)
    return DiskPlan(weights, limit, _gi(gib + scratch), f"{why}; + {scratch} GiB for /tmp and HOME")
