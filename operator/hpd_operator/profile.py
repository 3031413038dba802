"""The hybrid P/D profile: a validated CR -> per-role env and `vllm serve` args, each setting with its reason (pure).

    profile = compute_profile(validate(cr))          # hpd_operator.validation: every check runs there, once
    profile.prefill.args / .env / .injections        # builders put these into the Deployments
    profile.status()                                 # -> status.profile

The profile only renders: what vLLM needs for hybrid P/D over NIXL on spec.vllmVersion (the rules of
hpd_operator.versions), the runtime contract's env (every `HPD_*` entry) and the user's own env and extraArgs.
status.profile.injections lists what the operator set and why, status.profile.rules the version rules that
applied, status.profile.warnings what validation accepted with a warning.

Side-channel host: every role gets `HPD_POD_IP` from the downward API (`status.podIP`) FIRST, then
`VLLM_NIXL_SIDE_CHANNEL_HOST=$(HPD_POD_IP)` (Kubernetes expands `$(VAR)` from earlier entries). One downward-API
entry serves both vLLM and the runtime. Keep the env order when building the container.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from hpd_operator.api.models import (
    HybridPDDeploymentSpec,
    InjectionStatus,
    ProfileStatus,
    VersionRuleStatus,
    WarmupSpec,
)
from hpd_operator.validation import Validated
from hpd_operator.versions import VersionRow
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


def _num(x: float) -> str:
    return f"{x:g}"


def compute_profile(valid: Validated) -> Profile:
    """Pure: the per-role env/args for a validated CR (hpd_operator.validation.validate)."""
    spec, row, info = valid.spec, valid.row, valid.model
    model, chunk, hybrid = info.path, info.ssd_chunk_size, info.hybrid
    return Profile(
        warnings=valid.warnings,
        vllm_version=spec.vllm_version,
        row=row.minor,
        hybrid=hybrid,
        hybrid_reason=info.hybrid_reason,
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
