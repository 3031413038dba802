"""Runtime configuration: parsed once from the environment the operator sets (names in `contract`).

Pure: `load_config(env, vllm_args)` takes the mapping and the `vllm serve` arguments and never reads the process
environment itself, so tests pass plain dicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from hpd_runtime import contract as c


class ConfigError(ValueError):
    """An env value the runtime cannot use (the message names the variable)."""


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    role: str
    model: str
    served_model_name: str
    vllm_version: str
    tensor_parallel_size: int
    gpu_product: str | None
    vllm_host: str
    vllm_port: int
    runtime_host: str
    runtime_port: int
    cache_dir: str
    max_model_len: int | None
    max_num_batched_tokens: int | None
    ssd_chunk_size: int
    warmup_enabled: bool
    warmup_prompt_lengths: tuple[int, ...]
    warmup_concurrency: int
    warmup_timeout_seconds: float
    warmup_max_tokens: int
    warmup_pair_check: bool
    prefill_service: str | None
    prefill_port: int
    prefill_runtime_port: int
    pair_recheck_seconds: float
    pair_check_concurrency: int
    pair_max_logprob_delta: float
    pair_restart_on_break: bool
    canary_seconds: float
    kv_fabric: str
    kv_floor_bytes_per_second: float
    vllm_command: str | None
    stable_triton_cache: bool
    group_role: str | None = None
    """`leader` / `worker` on a pod of a replica that spans nodes (contract.ENV_GROUP_ROLE); None on a one-pod
    replica, which behaves as a leader."""

    @property
    def worker(self) -> bool:
        """A headless worker of a group: no API, no warmup, Ready while its ranks run (hpd_runtime.group)."""
        return self.group_role == c.GROUP_WORKER


def arg_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag V` or `--flag=V` in a vLLM argv (last one wins, like argparse)."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def model_from_args(args: Sequence[str]) -> str | None:
    """The model of `vllm serve`: the first positional argument, or `--model`."""
    if args and not args[0].startswith("-"):
        return args[0]
    return arg_value(args, "--model")


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise ConfigError(f"{name}={raw!r} is not an integer") from e
    if value < minimum:
        raise ConfigError(f"{name}={value} is below {minimum}")
    return value


def _req_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    value = _int(env, name, default, minimum)
    assert value is not None
    return value


def _opt_int_arg(args: Sequence[str], flag: str) -> int | None:
    raw = arg_value(args, flag)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _lengths(env: Mapping[str, str]) -> tuple[int, ...]:
    raw = env.get(c.ENV_WARMUP_PROMPT_LENGTHS, "").strip()
    if not raw:
        return ()
    try:
        lengths = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError as e:
        raise ConfigError(f"{c.ENV_WARMUP_PROMPT_LENGTHS}={raw!r} is not a comma-separated list of integers") from e
    if any(n < 1 for n in lengths):
        raise ConfigError(f"{c.ENV_WARMUP_PROMPT_LENGTHS}={raw!r}: lengths must be >= 1")
    return lengths


def _float(env: Mapping[str, str], name: str, default: float, minimum: float | None = None) -> float:
    """A number > 0 (or >= `minimum` when given: 0 turns a period off)."""
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as e:
        raise ConfigError(f"{name}={raw!r} is not a number") from e
    if minimum is None and not value > 0:
        raise ConfigError(f"{name}={raw!r} must be > 0")
    if minimum is not None and not value >= minimum:
        raise ConfigError(f"{name}={raw!r} must be >= {minimum:g}")
    return value


def installed_vllm_version() -> str | None:
    """vLLM's version from package metadata (no import of vllm itself)."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def load_config(env: Mapping[str, str], vllm_args: Sequence[str] = ()) -> RuntimeConfig:
    """Parse the runtime configuration; `vllm_args` fill what the env leaves out (model, lengths)."""
    role = env.get(c.ENV_ROLE, "").strip() or "decode"
    if role not in c.ROLES:
        raise ConfigError(f"{c.ENV_ROLE}={role!r}: expected one of {', '.join(c.ROLES)}")
    model = env.get(c.ENV_MODEL, "").strip() or model_from_args(vllm_args) or ""
    served = arg_value(vllm_args, "--served-model-name")
    served_name = served.split()[0] if served and served.strip() else model
    tp = _req_int(env, c.ENV_TENSOR_PARALLEL_SIZE, _opt_int_arg(vllm_args, "--tensor-parallel-size") or 1, 1)
    max_len = _int(env, c.ENV_MAX_MODEL_LEN, _opt_int_arg(vllm_args, "--max-model-len"), 1)
    prefill_service = env.get(c.ENV_PREFILL_SERVICE, "").strip() or None
    timeout = env.get(c.ENV_WARMUP_TIMEOUT_SECONDS, "").strip()
    try:
        timeout_s = float(timeout) if timeout else float(c.WARMUP_TIMEOUT_SECONDS_DEFAULT)
    except ValueError as e:
        raise ConfigError(f"{c.ENV_WARMUP_TIMEOUT_SECONDS}={timeout!r} is not a number") from e
    pair_check = role == "decode" and c.env_flag(env.get(c.ENV_WARMUP_PAIR_CHECK), default=False)
    if pair_check and prefill_service is None:
        raise ConfigError(f"{c.ENV_WARMUP_PAIR_CHECK} is on but {c.ENV_PREFILL_SERVICE} is not set")
    if timeout_s <= 0:
        raise ConfigError(f"{c.ENV_WARMUP_TIMEOUT_SECONDS}={timeout!r} must be > 0")
    group_role = env.get(c.ENV_GROUP_ROLE, "").strip() or None
    if group_role not in (None, c.GROUP_LEADER, c.GROUP_WORKER):
        raise ConfigError(f"{c.ENV_GROUP_ROLE}={group_role!r}: expected {c.GROUP_LEADER} or {c.GROUP_WORKER}")
    return RuntimeConfig(
        role=role,
        model=model,
        served_model_name=served_name,
        vllm_version=env.get(c.ENV_VLLM_VERSION, "").strip() or installed_vllm_version() or "unknown",
        tensor_parallel_size=tp,
        gpu_product=env.get(c.ENV_GPU_PRODUCT, "").strip() or None,
        vllm_host=env.get(c.ENV_VLLM_HOST, "").strip() or "127.0.0.1",
        vllm_port=_req_int(env, c.ENV_VLLM_PORT, _opt_int_arg(vllm_args, "--port") or c.VLLM_PORT, 1),
        runtime_host=env.get(c.ENV_RUNTIME_HOST, "").strip() or "0.0.0.0",
        runtime_port=_req_int(env, c.ENV_RUNTIME_PORT, c.RUNTIME_PORT, 0),
        cache_dir=env.get(c.ENV_CACHE_DIR, "").strip() or c.CACHE_MOUNT,
        max_model_len=max_len,
        max_num_batched_tokens=_opt_int_arg(vllm_args, "--max-num-batched-tokens"),
        ssd_chunk_size=_req_int(env, c.ENV_SSD_CHUNK_SIZE, c.SSD_CHUNK_SIZE_DEFAULT, 1),
        warmup_enabled=c.env_flag(env.get(c.ENV_WARMUP_ENABLED), default=True),
        warmup_prompt_lengths=_lengths(env),
        warmup_concurrency=_req_int(env, c.ENV_WARMUP_CONCURRENCY, c.WARMUP_CONCURRENCY_DEFAULT, 1),
        warmup_timeout_seconds=timeout_s,
        warmup_max_tokens=_req_int(env, c.ENV_WARMUP_MAX_TOKENS, c.WARMUP_MAX_TOKENS_DEFAULT, 1),
        warmup_pair_check=pair_check,
        prefill_service=prefill_service,
        prefill_port=_req_int(env, c.ENV_PREFILL_PORT, c.VLLM_PORT, 1),
        prefill_runtime_port=_req_int(env, c.ENV_PREFILL_RUNTIME_PORT, c.RUNTIME_PORT, 1),
        pair_recheck_seconds=_float(env, c.ENV_PAIR_RECHECK_SECONDS, c.PAIR_RECHECK_SECONDS_DEFAULT),
        pair_check_concurrency=_req_int(env, c.ENV_PAIR_CHECK_CONCURRENCY, c.PAIR_CHECK_CONCURRENCY_DEFAULT, 1),
        pair_max_logprob_delta=_float(env, c.ENV_PAIR_MAX_LOGPROB_DELTA, c.PAIR_MAX_LOGPROB_DELTA_DEFAULT),
        pair_restart_on_break=c.env_flag(env.get(c.ENV_PAIR_RESTART_ON_BREAK), default=True),
        canary_seconds=_float(env, c.ENV_CANARY_SECONDS, c.CANARY_SECONDS_DEFAULT, minimum=0.0),
        kv_fabric=env.get(c.ENV_KV_FABRIC, "").strip() or "tcp",
        kv_floor_bytes_per_second=_float(env, c.ENV_KV_FLOOR_BYTES_PER_SECOND, 0.0, minimum=0.0),
        vllm_command=env.get(c.ENV_VLLM_COMMAND, "").strip() or None,
        stable_triton_cache=c.env_flag(env.get(c.ENV_STABLE_TRITON_CACHE), default=True),
        group_role=group_role,
    )
