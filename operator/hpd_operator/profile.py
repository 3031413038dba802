"""The hybrid P/D profile: spec + vLLM version -> per-role env and `vllm serve` args (pure).

    profile = compute_profile(spec)                  # version = spec.vllmVersion
    profile.prefill.args / .env / .injections        # builders put these into the Deployments
    profile.status()                                 # -> status.profile

Raises `SpecError` (all violations at once) for what vLLM would otherwise only hit at runtime: TP sizes that
do not divide one another, heads/groups that a TP size does not divide, operator-owned or forbidden flags in
extraArgs, operator-owned env, kv_both, speculative decoding with hybrid P/D.
Version table: VERSION_RULES, one rule per fact over a range of vLLM minors (0.20-0.33), each citing its upstream
PRs/issues; status.profile.rules lists the rules that applied, status.profile.warnings what is not fatal (an image
tag naming another release than spec.vllmVersion).
Facts and their sources: shared/reference/vllm-upstream-2026-11.md (wins where they differ) and vllm-facts.md.

Side-channel host: every role gets `HPD_POD_IP` from the downward API (`status.podIP`) FIRST, then
`VLLM_NIXL_SIDE_CHANNEL_HOST=$(HPD_POD_IP)` (Kubernetes expands `$(VAR)` from earlier entries). One downward-API
entry serves both vLLM and the runtime. Keep the env order when building the container.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from hpd_operator.api import constants as c
from hpd_operator.api.models import (
    HybridPDDeploymentSpec,
    InjectionStatus,
    ModelConfigSpec,
    ProfileStatus,
    VersionRuleStatus,
    WarmupSpec,
)
from hpd_operator.errors import SpecError, SpecViolation
from hpd_operator.modelinfo import model_info
from hpd_operator.validation import check_extra_args, check_spec, unique
from hpd_operator.versions import BLOCK_SIZE_FIXED_MINOR, VersionRow, image_version_warning, parse_version, version_row
from hpd_runtime import contract

KV_CONNECTOR: Final = "NixlConnector"
KV_ROLES: Final[dict[contract.Role, str]] = {"prefill": "kv_producer", "decode": "kv_consumer"}


# ---------------------------------------------------------------------------------------------------------------
# Profile types
# ---------------------------------------------------------------------------------------------------------------
class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnvEntry(_Frozen):
    """One container env entry: a literal `value`, a downward-API `field_path` (`status.podIP`), or the user's own
    core/v1 EnvVarSource (`value_from`: secretKeyRef, configMapKeyRef, resourceFieldRef, fieldRef) as written."""

    name: str
    value: str | None = None
    field_path: str | None = None
    value_from: dict[str, Any] | None = None

    def to_k8s(self) -> dict[str, object]:
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": copy.deepcopy(self.value_from)}
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
    warnings: tuple[str, ...] = ()
    """Accepted but risky settings: shown in the Ready condition's message and posted once as a Warning Event."""
    rules: tuple[VersionRuleStatus, ...] = ()
    """The version-table rules that applied (hybrid-only rules only for hybrid models)."""

    def role(self, role: contract.Role) -> RoleProfile:
        return self.prefill if role == "prefill" else self.decode

    def status(self) -> dict[str, object]:
        """status.profile (camelCase), the injections of both roles with their reasons."""
        inj = [
            InjectionStatus(role=rp.role, setting=i.setting, value=i.value, reason=i.reason)
            for rp in (self.prefill, self.decode)
            for i in rp.injections
        ]
        ps = ProfileStatus(
            vllm_version=self.vllm_version,
            version_row=self.row,
            hybrid=self.hybrid,
            injections=inj,
            rules=list(self.rules),
            warnings=list(self.warnings),
        )
        return ps.model_dump(by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------------------------------------------
# compute_profile
# ---------------------------------------------------------------------------------------------------------------
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
    if p % d and d % p:  # hetero TP itself is allowed in every version (rule hetero-tp-mamba2)
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
    if hybrid and p != d and replicated and row.has("replicated-hetero-tp-unservable"):
        out.append(
            SpecViolation(
                "spec.decode.tensorParallelSize" if d > p else "spec.prefill.tensorParallelSize",
                "replicated-hetero-tp-unservable",
                f"prefill TP {p} and decode TP {d}: at TP {top} " + " and ".join(replicated) + f" ({cfg_src}) are "
                f"replicated, and vLLM {row.minor} cannot serve that pair: without spec.blockSize the roles derive "
                "different block sizes (NIXL refuses), and with one that makes them equal P->D output was NaN "
                f"({row.cite('replicated-hetero-tp-unservable')}); use equal TP sizes, sizes that split the heads, "
                "or vLLM 0.27+",
            )
        )
    elif hybrid and p != d and spec.block_size is None and replicated and row.equal_block_size_required:
        out.append(
            SpecViolation(
                "spec.blockSize",
                "block-size-required-for-replicated-heads",
                f"prefill TP {p} and decode TP {d}: at TP {top} " + " and ".join(replicated) + f" ({cfg_src}) are "
                "replicated, so vLLM's own attention block size differs between the roles and vLLM "
                f"{row.minor} rejects the pair ({row.cite('equal-block-size')}); set spec.blockSize (a multiple of "
                "16) to at least the larger 'Setting attention block size' value vLLM logs for the two TP sizes, "
                "or use vLLM 0.27+",
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
        host_reason += (
            f"; vLLM {row.minor} hashes it into the compile-cache key, so a new pod IP recompiles "
            f"[{row.cite('side-channel-host-in-compile-key')}]"
        )
    add(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST, "status.podIP", host_reason)
    add(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT, str(port), "NIXL side-channel base port from spec.kvTransfer")
    if hybrid:
        env.append(EnvEntry(name=contract.ENV_VLLM_SSM_CONV_STATE_LAYOUT, value="DS"))
        add(
            contract.ENV_VLLM_SSM_CONV_STATE_LAYOUT,
            "DS",
            f"NIXL asserts the DS conv-state layout for Mamba models [{row.cite('ds-conv-state-layout')}]",
        )
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
    gemm_seconds = gemm_warmup_seconds(w)
    if gemm_seconds:
        env += [
            EnvEntry(name=contract.ENV_GEMM_WARMUP_TOKENS, value="auto"),
            EnvEntry(name=contract.ENV_GEMM_WARMUP_SECONDS, value=str(gemm_seconds)),
        ]
        add(
            contract.ENV_GEMM_WARMUP_TOKENS,
            "auto",
            "spec.warmup.everyLength: vLLM's worker runs each distinct GEMM at every row count up to "
            "max_num_batched_tokens before Ready (cuBLAS picks an algorithm per row count on first use: "
            "+4 to +11 ms on the first request of each new prompt length otherwise)",
        )
        add(
            contract.ENV_GEMM_WARMUP_SECONDS,
            str(gemm_seconds),
            f"the sweep's bound: spec.warmup.timeoutSeconds, at most {contract.GEMM_WARMUP_SECONDS_DEFAULT}",
        )
    for e in spec.env:
        if e.value_from is not None:
            env.append(EnvEntry(name=e.name, value_from=dict(e.value_from)))
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
        + (f", deprecated in vLLM {row.minor} [{row.cite('kv-both-deprecated')}])" if row.kv_both_deprecated else ")"),
    )
    if hybrid:
        args.append("--no-enable-prefix-caching")
        add(
            "--no-enable-prefix-caching",
            "",
            "prefix caching with hybrid P/D crashes decode on Mamba state (SSM can only have one local block); "
            "vLLM may turn it on for hybrid models by itself (0.20: NemotronH mamba_cache_mode='all'; 0.33: on)",
        )
        if row.needs_no_disable_hybrid_kv_cache_manager:
            args.append("--no-disable-hybrid-kv-cache-manager")
            add(
                "--no-disable-hybrid-kv-cache-manager",
                "",
                f"vLLM {row.minor} turns the hybrid KV cache manager off when --kv-transfer-config is set; "
                f"NIXL with Mamba requires it [{row.cite('hybrid-kv-cache-manager-flag')}]",
            )
        if row.needs_no_async_scheduling and (role == "decode" or tp > 1):
            args.append("--no-async-scheduling")
            where = "decode" if role == "decode" else f"prefill at TP {tp}"
            add(
                "--no-async-scheduling",
                "",
                f"vLLM {row.minor} on {where}: async scheduling races RDMA-loaded Mamba/KV state "
                f"[{row.cite('no-async-scheduling')}]",
            )
    if role == "decode" and spec.warmup.enabled and spec.warmup.pair_check:
        args.append("--enable-prompt-tokens-details")
        add(
            "--enable-prompt-tokens-details",
            "",
            "the decode pair check proves a KV transfer happened: usage.prompt_tokens_details.cached_tokens "
            "counts the tokens loaded from prefill",
        )
    if chunk is not None:
        add(
            contract.ENV_SSD_CHUNK_SIZE,
            str(chunk),
            "warmup covers prompts shorter and longer than the SSD chunk"
            + (
                f" (vLLM {row.minor} autotunes seqlen = chunk_size only [{row.cite('builtin-ssd-warmup')}])"
                if row.ssd_warmup_builtin
                else f" (vLLM {row.minor} does not autotune SSD kernels at startup [{row.cite('no-builtin-ssd-warmup')}])"
            ),
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


def gemm_warmup_seconds(warmup: WarmupSpec) -> int:
    """The bound on hpd_runtime.gemm_warmup's sweep inside vLLM's startup (the startup probe allows for it too);
    0 when it does not run (spec.warmup.everyLength or spec.warmup.enabled off)."""
    if not (warmup.enabled and warmup.every_length):
        return 0
    return min(contract.GEMM_WARMUP_SECONDS_DEFAULT, warmup.timeout_seconds)


def block_size_warnings(spec: HybridPDDeploymentSpec, row: VersionRow, hybrid: bool) -> tuple[str, ...]:
    """A warning when a user block size may be raised by vLLM on a version where that corrupted P->D.

    Whether vLLM raises it depends on the Mamba page size (conv + SSM state bytes per sequence: ssm_state_size,
    mamba_head_dim, conv_kernel, the state dtype) against the attention page per token (head_dim): spec.model.config
    carries none of those numbers, so the operator cannot tell a safe value (>= vLLM's own size, e.g. 528 or 1056
    for the tiny Nemotron-H) from a raised one (128 -> 640); it warns on every explicit value instead, and the
    decode pair check is what refuses Ready when P->D output differs."""
    if spec.block_size is None or not hybrid:
        return ()
    v = parse_version(row.minor)
    if v is not None and (v.major, v.minor) >= BLOCK_SIZE_FIXED_MINOR:
        return ()
    return (
        f"spec.blockSize={spec.block_size}: vLLM {row.minor} raises a block size below the model's Mamba-aligned "
        "size (e.g. 128 -> 640 tokens on a 64-token kernel block), and on vLLM 0.20 that corrupted P->D output "
        "(token 0 repeated); the Mamba page size cannot be computed from spec.model.config, so this value is not "
        "checked here. Remove spec.blockSize unless the TP sizes need it; the decode pair check keeps decode not "
        "Ready if P->D output differs from local",
    )


def _num(x: float) -> str:
    return f"{x:g}"


def compute_profile(spec: HybridPDDeploymentSpec, version: str | None = None) -> Profile:
    """Pure: the per-role env/args for `spec` on vLLM `version` (default spec.vllmVersion). Raises SpecError."""
    version = version or spec.vllm_version
    row = version_row(version)
    info = model_info(spec)
    cfg, cfg_src, hybrid, hybrid_reason = info.config, info.config_source, info.hybrid, info.hybrid_reason
    problems: list[SpecViolation] = []
    _check_tp(spec, row=row, cfg=cfg, cfg_src=cfg_src, hybrid=hybrid, out=problems)
    # The rule table (the CRD's CEL rules, re-checked; a rule _check_tp reports with more detail is kept once) and
    # extraArgs as vLLM's parser reads them: validation.py.
    problems = unique(problems + check_spec(spec) + check_extra_args(spec, hybrid=hybrid))
    if problems:
        raise SpecError(problems)
    model = info.path
    chunk = info.ssd_chunk_size
    tag_warning = image_version_warning(spec.image or c.vllm_image(version), version)
    warnings = ((tag_warning,) if tag_warning else ()) + tuple(block_size_warnings(spec, row, hybrid))
    return Profile(
        warnings=warnings,
        vllm_version=version,
        row=row.minor,
        hybrid=hybrid,
        hybrid_reason=hybrid_reason,
        model=model,
        served_model_name=spec.model.name,
        ssd_chunk_size=chunk,
        prefill=_role_profile(spec, "prefill", row=row, hybrid=hybrid, model=model, chunk=chunk),
        decode=_role_profile(spec, "decode", row=row, hybrid=hybrid, model=model, chunk=chunk),
        rules=tuple(
            VersionRuleStatus(rule=r.key, versions=r.versions, upstream=r.upstream, note=r.note)
            for r in row.rules
            if hybrid or not r.hybrid_only
        ),
    )
