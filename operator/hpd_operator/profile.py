"""The hybrid P/D profile: spec + vLLM version -> per-role env and `vllm serve` args (pure).

    profile = compute_profile(spec)                  # version = spec.vllmVersion
    profile.prefill.args / .env / .injections        # builders put these into the Deployments
    profile.status()                                 # -> status.profile

Raises `SpecError` (all violations at once) for what vLLM would otherwise only hit at runtime: TP sizes that
do not divide one another, heads/groups that a TP size does not divide, operator-owned or forbidden flags in
extraArgs, operator-owned env, kv_both, speculative decoding with hybrid P/D.
Facts and their sources: shared/reference/vllm-facts.md (§0 table, §1.3, §1.5, §6).

Side-channel host: every role gets `HPD_POD_IP` from the downward API (`status.podIP`) FIRST, then
`VLLM_NIXL_SIDE_CHANNEL_HOST=$(HPD_POD_IP)` (Kubernetes expands `$(VAR)` from earlier entries). One downward-API
entry serves both vLLM and the runtime. Keep the env order when building the container.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

from hpd_operator.api import constants as c
from hpd_operator.api.models import HybridPDDeploymentSpec, InjectionStatus, ModelConfigSpec, ProfileStatus
from hpd_operator.errors import SpecError, SpecViolation
from hpd_operator.validation import check_extra_args, check_spec, unique
from hpd_runtime import contract

KV_CONNECTOR: Final = "NixlConnector"
KV_ROLES: Final[dict[contract.Role, str]] = {"prefill": "kv_producer", "decode": "kv_consumer"}


# ---------------------------------------------------------------------------------------------------------------
# Version table (vllm-facts.md §0)
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VersionRow:
    """What one vLLM minor version needs for hybrid Mamba2 P/D over NIXL."""

    minor: str
    needs_no_disable_hybrid_kv_cache_manager: bool
    """0.20 turns the hybrid KV cache manager off whenever --kv-transfer-config is set; NIXL+Mamba asserts it on."""
    decode_needs_no_async_scheduling: bool
    """Async scheduling races RDMA-loaded Mamba state on decode (#37285); fixed in 0.33 (#45357 + #48481)."""
    kv_both_deprecated: bool
    """kv_role=kv_both logs a deprecation from 0.25; we never emit it and reject it everywhere."""
    hetero_tp: Literal["both", "none"]
    """Heterogeneous TP for Mamba2: `both` = P_TP > D_TP and P_TP < D_TP, when one divides the other."""
    side_channel_host_in_compile_key: bool
    """VLLM_NIXL_SIDE_CHANNEL_HOST is hashed into the torch.compile cache key: a new pod IP = a cold compile cache."""
    ssd_warmup_builtin: bool
    """vLLM autotunes the Mamba2 SSD kernels at startup (#39822)."""
    hybrid_prefix_caching_default_on: bool
    """Hybrid models default to prefix caching ON: --no-enable-prefix-caching is essential."""
    abort_request_timeout_env: bool
    """VLLM_NIXL_ABORT_REQUEST_TIMEOUT exists (0.20); later versions use kv_lease_duration."""


VERSION_TABLE: Final[dict[str, VersionRow]] = {
    row.minor: row
    for row in (
        VersionRow("0.20", True, True, False, "both", True, False, False, True),
        VersionRow("0.22", False, True, False, "both", False, True, False, False),
        VersionRow("0.25", False, True, True, "both", False, True, False, False),
        VersionRow("0.33", False, False, True, "both", False, True, True, False),
    )
}
SUPPORTED_VERSIONS: Final = tuple(VERSION_TABLE)


def version_row(version: str) -> VersionRow:
    """The table row of a version (`0.20.0` -> row `0.20`); SpecError naming spec.vllmVersion if unsupported."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?(?:[.+-].*)?", version.strip())
    minor = f"{m.group(1)}.{m.group(2)}" if m else version
    row = VERSION_TABLE.get(minor)
    if row is None:
        raise SpecError.one(
            "spec.vllmVersion",
            "supported-vllm-version",
            f"vLLM {version!r} is not in the version table; supported: "
            + ", ".join(f"{v}.x" for v in SUPPORTED_VERSIONS),
        )
    return row


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


# ---------------------------------------------------------------------------------------------------------------
# Profile types
# ---------------------------------------------------------------------------------------------------------------
class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnvEntry(_Frozen):
    """One container env entry: a literal `value`, or a downward-API `field_path` (`status.podIP`)."""

    name: str
    value: str | None = None
    field_path: str | None = None

    def to_k8s(self) -> dict[str, object]:
        if self.field_path is not None:
            return {"name": self.name, "valueFrom": {"fieldRef": {"fieldPath": self.field_path}}}
        return {"name": self.name, "value": self.value or ""}


class Injection(_Frozen):
    """A setting the operator injected, with the reason shown in status.profile."""

    setting: str
    value: str
    reason: str


class RoleProfile(_Frozen):
    role: contract.Role
    tensor_parallel_size: int
    replicas: int
    env: tuple[EnvEntry, ...]
    """In order (HPD_POD_IP precedes the entries that reference it), then the user's spec.env."""
    args: tuple[str, ...]
    """`vllm serve` arguments, without the leading `vllm serve`."""
    injections: tuple[Injection, ...]

    def env_k8s(self) -> list[dict[str, object]]:
        return [e.to_k8s() for e in self.env]


class Profile(_Frozen):
    vllm_version: str
    row: str
    hybrid: bool
    hybrid_reason: str
    model: str
    """The `--model` string (identical on both roles: it is in the NIXL compatibility hash)."""
    served_model_name: str
    ssd_chunk_size: int | None
    prefill: RoleProfile
    decode: RoleProfile

    def role(self, role: contract.Role) -> RoleProfile:
        return self.prefill if role == "prefill" else self.decode

    def status(self) -> dict[str, object]:
        """status.profile (camelCase), the injections of both roles with their reasons."""
        inj = [
            InjectionStatus(role=rp.role, setting=i.setting, value=i.value, reason=i.reason)
            for rp in (self.prefill, self.decode)
            for i in rp.injections
        ]
        ps = ProfileStatus(vllm_version=self.vllm_version, version_row=self.row, hybrid=self.hybrid, injections=inj)
        return ps.model_dump(by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------------------------------------------
# compute_profile
# ---------------------------------------------------------------------------------------------------------------
def model_path(spec: HybridPDDeploymentSpec) -> str:
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


def _resolve_hybrid(spec: HybridPDDeploymentSpec, cfg: ModelConfigSpec | None, cfg_src: str) -> tuple[bool, str]:
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


def _check_tp(
    spec: HybridPDDeploymentSpec,
    *,
    row: VersionRow,
    cfg: ModelConfigSpec | None,
    cfg_src: str,
    hybrid: bool,
    out: list[SpecViolation],
) -> None:
    p, d = spec.prefill.tensor_parallel_size, spec.decode.tensor_parallel_size
    if p != d:
        if hybrid and row.hetero_tp == "none":
            out.append(
                SpecViolation(
                    "spec.decode.tensorParallelSize",
                    "tp-homogeneous",
                    f"vLLM {row.minor} needs the same TP on prefill and decode for hybrid models "
                    f"(prefill {p}, decode {d})",
                )
            )
        elif p % d and d % p:
            out.append(
                SpecViolation(
                    "spec.decode.tensorParallelSize",
                    "tp-divides",
                    f"prefill TP {p} and decode TP {d} must divide one another "
                    f"(valid decode sizes for prefill {p}: " + ", ".join(str(x) for x in _divisible_partners(p)) + ")",
                )
            )
    if cfg is None:
        return
    top = max(p, d)
    replicated = [
        f"the {n} {what}"
        for n, what in ((cfg.num_key_value_heads, "KV heads"), (cfg.mamba_n_groups, "Mamba groups"))
        if n is not None and top > n
    ]
    if hybrid and p != d and spec.block_size is None and replicated:
        out.append(
            SpecViolation(
                "spec.blockSize",
                "block-size-required-for-replicated-heads",
                f"prefill TP {p} and decode TP {d}: at TP {top} " + " and ".join(replicated) + f" ({cfg_src}) are "
                "replicated, so vLLM's own attention block size differs between the roles and NIXL rejects the "
                "pair; set spec.blockSize (a multiple of 16) to at least the larger 'Setting attention block size' "
                "value vLLM logs for the two TP sizes",
            )
        )
    for role in contract.ROLES:
        tp = spec.role(role).tensor_parallel_size
        field = f"spec.{role}.tensorParallelSize"
        where = f"({cfg_src})"
        checks: list[tuple[str, int | None, Callable[[int, int], bool], str]] = [
            (
                "attention-heads-divisible",
                cfg.num_attention_heads,
                lambda n, t: n % t == 0,
                "num_attention_heads {n} is not divisible by TP {t}",
            ),
            (
                "kv-heads-divisible",
                cfg.num_key_value_heads,
                lambda n, t: n % t == 0 or t % n == 0,
                "num_key_value_heads {n} and TP {t}: one must divide the other",
            ),
            (
                "mamba-heads-divisible",
                cfg.mamba_num_heads,
                lambda n, t: n % t == 0,
                "mamba_num_heads {n} is not divisible by TP {t}",
            ),
            (
                "mamba-groups-divisible",
                cfg.mamba_n_groups,
                lambda n, t: n % t == 0 or n == 1,
                "n_groups {n} is not divisible by TP {t} (and is not 1)",
            ),
            (
                "hidden-size-divisible",
                cfg.hidden_size,
                lambda n, t: n % t == 0,
                "hidden_size {n} is not divisible by TP {t}",
            ),
        ]
        for rule, n, ok, text in checks:
            if n is not None and not ok(n, tp):
                valid = [t for t in (1, 2, 4, 8, 16, 32, 64) if all(m is None or f(m, t) for _, m, f, _ in checks)]
                out.append(
                    SpecViolation(
                        field, rule, text.format(n=n, t=tp) + f" {where}; valid TP sizes: " + ", ".join(map(str, valid))
                    )
                )


def _divisible_partners(p: int) -> list[int]:
    return [t for t in range(1, c.MAX_TENSOR_PARALLEL_SIZE + 1) if p % t == 0 or t % p == 0][:8]


def _role_profile(
    spec: HybridPDDeploymentSpec, role: contract.Role, *, row: VersionRow, hybrid: bool, model: str, chunk: int | None
) -> RoleProfile:
    rs = spec.role(role)
    inj: list[Injection] = []

    def add(setting: str, value: str, reason: str) -> None:
        inj.append(Injection(setting=setting, value=value, reason=reason))

    # --- env ---
    port = spec.kv_transfer.side_channel_port
    env: list[EnvEntry] = [
        EnvEntry(name=contract.ENV_POD_IP, field_path="status.podIP"),
        EnvEntry(name=contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST, value=f"$({contract.ENV_POD_IP})"),
        EnvEntry(name=contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT, value=str(port)),
    ]
    host_reason = "NIXL side channel binds and advertises this address: the pod IP (not 0.0.0.0, not localhost)"
    if row.side_channel_host_in_compile_key:
        host_reason += f"; vLLM {row.minor} hashes it into the compile-cache key, so a new pod IP recompiles"
    add(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST, "status.podIP", host_reason)
    add(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT, str(port), "NIXL side-channel base port from spec.kvTransfer")
    if hybrid:
        env.append(EnvEntry(name=contract.ENV_VLLM_SSM_CONV_STATE_LAYOUT, value="DS"))
        add(contract.ENV_VLLM_SSM_CONV_STATE_LAYOUT, "DS", "NIXL asserts the DS conv-state layout for Mamba models")
    ucx = spec.kv_transfer.ucx
    if ucx is not None and ucx.tls:
        env.append(EnvEntry(name="UCX_TLS", value=ucx.tls))
    if ucx is not None and ucx.net_devices:
        env.append(EnvEntry(name="UCX_NET_DEVICES", value=ucx.net_devices))
    w = spec.warmup
    env += [
        EnvEntry(name=contract.ENV_ROLE, value=role),
        EnvEntry(name=contract.ENV_MODEL, value=model),
        EnvEntry(name=contract.ENV_VLLM_VERSION, value=spec.vllm_version),
        EnvEntry(name=contract.ENV_TENSOR_PARALLEL_SIZE, value=str(rs.tensor_parallel_size)),
        EnvEntry(name=contract.ENV_VLLM_PORT, value=str(contract.VLLM_PORT)),
        EnvEntry(name=contract.ENV_RUNTIME_PORT, value=str(contract.RUNTIME_PORT)),
    ]
    if spec.model.max_model_len is not None:
        env.append(EnvEntry(name=contract.ENV_MAX_MODEL_LEN, value=str(spec.model.max_model_len)))
    if chunk is not None:
        env.append(EnvEntry(name=contract.ENV_SSD_CHUNK_SIZE, value=str(chunk)))
    env += [
        EnvEntry(name=contract.ENV_WARMUP_ENABLED, value=str(w.enabled).lower()),
        EnvEntry(name=contract.ENV_WARMUP_PROMPT_LENGTHS, value=",".join(map(str, w.prompt_lengths))),
        EnvEntry(name=contract.ENV_WARMUP_CONCURRENCY, value=str(w.concurrency)),
        EnvEntry(name=contract.ENV_WARMUP_TIMEOUT_SECONDS, value=str(w.timeout_seconds)),
        EnvEntry(name=contract.ENV_WARMUP_PAIR_CHECK, value=str(w.pair_check and role == "decode").lower()),
    ]
    for e in spec.env:
        if e.value_from is not None:
            env.append(EnvEntry(name=e.name, field_path=str(e.value_from.get("fieldRef", {}).get("fieldPath", ""))))
        else:
            env.append(EnvEntry(name=e.name, value=e.value or ""))

    # --- args ---
    tp = rs.tensor_parallel_size
    args: list[str] = [
        "--model",
        model,
        "--served-model-name",
        spec.model.name,
        "--port",
        str(contract.VLLM_PORT),
        "--tensor-parallel-size",
        str(tp),
    ]
    if spec.block_size is not None:
        args += ["--block-size", str(spec.block_size)]
        add(
            "--block-size",
            str(spec.block_size),
            "spec.blockSize, the same on prefill and decode (NIXL compares it); vLLM raises it if the Mamba page "
            "needs more",
        )
    if spec.model.max_model_len is not None:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    args += ["--dtype", spec.model.dtype]
    gmu = rs.gpu_memory_utilization if rs.gpu_memory_utilization is not None else spec.gpu_memory_utilization
    if gmu is not None:
        args += ["--gpu-memory-utilization", _num(gmu)]
    kv: dict[str, str] = {"kv_connector": KV_CONNECTOR, "kv_role": KV_ROLES[role]}
    if spec.kv_transfer.load_failure_policy != "fail":
        kv["kv_load_failure_policy"] = spec.kv_transfer.load_failure_policy
    kv_json = json.dumps(kv, separators=(",", ":"))
    args += ["--kv-transfer-config", kv_json]
    add(
        "--kv-transfer-config",
        kv_json,
        f"NIXL P/D: {role} is {KV_ROLES[role]} (never kv_both"
        + (f", deprecated in vLLM {row.minor})" if row.kv_both_deprecated else ")"),
    )
    if hybrid:
        args.append("--no-enable-prefix-caching")
        reason = "prefix caching with hybrid P/D crashes decode on Mamba state (SSM can only have one local block)"
        if row.hybrid_prefix_caching_default_on:
            reason += f"; vLLM {row.minor} turns it ON by default for hybrid models"
        add("--no-enable-prefix-caching", "", reason)
        if row.needs_no_disable_hybrid_kv_cache_manager:
            args.append("--no-disable-hybrid-kv-cache-manager")
            add(
                "--no-disable-hybrid-kv-cache-manager",
                "",
                f"vLLM {row.minor} turns the hybrid KV cache manager off when --kv-transfer-config is set; "
                "NIXL with Mamba requires it",
            )
        if role == "decode" and row.decode_needs_no_async_scheduling:
            args.append("--no-async-scheduling")
            add(
                "--no-async-scheduling",
                "",
                f"vLLM {row.minor}: async scheduling can overwrite RDMA-loaded Mamba state on decode (#37285)",
            )
    if chunk is not None:
        add(
            contract.ENV_SSD_CHUNK_SIZE,
            str(chunk),
            "warmup covers prompts shorter and longer than the SSD chunk"
            + ("" if row.ssd_warmup_builtin else f" (vLLM {row.minor} does not autotune SSD kernels at startup)"),
        )
    if spec.model.source is not None and spec.model.source.huggingface is not None:
        rev = spec.model.source.huggingface.revision
        if rev:
            args += ["--revision", rev]
    args += spec.extra_args
    args += rs.extra_args
    return RoleProfile(
        role=role,
        tensor_parallel_size=tp,
        replicas=rs.replicas,
        env=tuple(env),
        args=tuple(args),
        injections=tuple(inj),
    )


def _num(x: float) -> str:
    return f"{x:g}"


def compute_profile(spec: HybridPDDeploymentSpec, version: str | None = None) -> Profile:
    """Pure: the per-role env/args for `spec` on vLLM `version` (default spec.vllmVersion). Raises SpecError."""
    version = version or spec.vllm_version
    row = version_row(version)
    cfg, cfg_src = model_config(spec)
    hybrid, hybrid_reason = _resolve_hybrid(spec, cfg, cfg_src)
    problems: list[SpecViolation] = []
    _check_tp(spec, row=row, cfg=cfg, cfg_src=cfg_src, hybrid=hybrid, out=problems)
    # The rule table (the CRD's CEL rules, re-checked; a rule _check_tp reports with more detail is kept once) and
    # extraArgs as vLLM's parser reads them: validation.py.
    problems = unique(problems + check_spec(spec) + check_extra_args(spec, hybrid=hybrid))
    if problems:
        raise SpecError(problems)
    model = model_path(spec)
    chunk = cfg.ssd_chunk_size if cfg is not None else None
    return Profile(
        vllm_version=version,
        row=row.minor,
        hybrid=hybrid,
        hybrid_reason=hybrid_reason,
        model=model,
        served_model_name=spec.model.name,
        ssd_chunk_size=chunk,
        prefill=_role_profile(spec, "prefill", row=row, hybrid=hybrid, model=model, chunk=chunk),
        decode=_role_profile(spec, "decode", row=row, hybrid=hybrid, model=model, chunk=chunk),
    )
