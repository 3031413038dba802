"""What the operator knows about a model: the built-in table of config numbers and how a spec resolves (pure).

    info = model_info(spec)        # ModelInfo: the --model string, the config numbers and where they came from,
                                   # hybrid or not and why

A new known model is a row in KNOWN_MODELS, with numbers from its public config.json only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hpd_operator.api.models import HybridPDDeploymentSpec, ModelConfigSpec
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
