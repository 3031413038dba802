"""Pure parts of the launcher and the config: argv, cache key, cache env, exit codes, GPU detection."""

from __future__ import annotations

import re
import signal
import subprocess
from typing import Any

import pytest

from hpd_runtime import contract as c
from hpd_runtime import triton_cache
from hpd_runtime.config import ConfigError, load_config
from hpd_runtime.launcher import (
    cache_env,
    cache_key,
    child_env,
    detect_gpu_product,
    exit_code,
    parse_gpu_product,
    vllm_argv,
)

ARGS = ["nvidia/NVIDIA-Nemotron-Nano-9B-v2", "--port", "8000", "--tensor-parallel-size", "2", "--max-model-len", "8192"]


def test_vllm_argv_runs_vllm_cli_module_with_the_exact_args() -> None:
    cfg = load_config({c.ENV_ROLE: "prefill"}, ARGS)
    assert vllm_argv(cfg, ARGS, python="/usr/bin/python3") == [
        "/usr/bin/python3",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        *ARGS,
    ]


def test_vllm_command_override_is_shell_split_and_gets_the_args() -> None:
    cfg = load_config({c.ENV_VLLM_COMMAND: "/opt/py 'my fake.py' --x"}, ARGS)
    assert vllm_argv(cfg, ARGS) == ["/opt/py", "my fake.py", "--x", *ARGS]


def test_config_reads_the_model_tp_and_lengths_from_args_when_env_is_silent() -> None:
    cfg = load_config({}, [*ARGS, "--served-model-name", "nano", "--max-num-batched-tokens=2048"])
    assert cfg.model == "nvidia/NVIDIA-Nemotron-Nano-9B-v2"
    assert cfg.served_model_name == "nano"
    assert cfg.tensor_parallel_size == 2
    assert cfg.max_model_len == 8192
    assert cfg.max_num_batched_tokens == 2048
    assert cfg.vllm_port == 8000
    assert cfg.runtime_port == c.RUNTIME_PORT
    assert cfg.runtime_host == "0.0.0.0"
    assert cfg.cache_dir == c.CACHE_MOUNT
    assert cfg.warmup_enabled is True


def test_env_wins_over_args() -> None:
    cfg = load_config({c.ENV_MODEL: "/models/x", c.ENV_TENSOR_PARALLEL_SIZE: "4", c.ENV_MAX_MODEL_LEN: "1024"}, ARGS)
    assert (cfg.model, cfg.tensor_parallel_size, cfg.max_model_len) == ("/models/x", 4, 1024)


def test_pair_check_only_on_decode_and_needs_the_prefill_service() -> None:
    on = {c.ENV_WARMUP_PAIR_CHECK: "true", c.ENV_PREFILL_SERVICE: "x-prefill.ns.svc"}
    assert load_config({**on, c.ENV_ROLE: "decode"}).warmup_pair_check is True
    assert load_config({**on, c.ENV_ROLE: "prefill"}).warmup_pair_check is False
    with pytest.raises(ConfigError, match=c.ENV_PREFILL_SERVICE):
        load_config({c.ENV_ROLE: "decode", c.ENV_WARMUP_PAIR_CHECK: "1"})


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({c.ENV_ROLE: "router"}, c.ENV_ROLE),
        ({c.ENV_WARMUP_CONCURRENCY: "many"}, c.ENV_WARMUP_CONCURRENCY),
        ({c.ENV_WARMUP_TIMEOUT_SECONDS: "0"}, c.ENV_WARMUP_TIMEOUT_SECONDS),
        ({c.ENV_WARMUP_PROMPT_LENGTHS: "16,x"}, c.ENV_WARMUP_PROMPT_LENGTHS),
    ],
)
def test_bad_env_values_name_the_variable(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(env)


def test_cache_key_is_readable_filesystem_safe_and_stable() -> None:
    key = cache_key("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "0.20.0", "NVIDIA H200", 2, "decode")
    assert key == cache_key("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "v0.20.0", "NVIDIA-H200", 2, "decode")
    assert key.startswith("nvidia-nvidia-nemotron-nano-9b-v2_0.20.0_nvidia-h200_tp2_decode_")
    assert re.fullmatch(r"[a-z0-9._-]+", key)
    assert len(key) <= 140


@pytest.mark.parametrize(
    "change",
    [
        {"model": "nvidia/other"},
        {"vllm_version": "0.22.0"},
        {"gpu_product": "NVIDIA H100 80GB HBM3"},
        {"tensor_parallel_size": 4},
        {"role": "prefill"},
    ],
)
def test_cache_key_changes_with_each_input(change: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "model": "nvidia/m",
        "vllm_version": "0.20.0",
        "gpu_product": "NVIDIA H200",
        "tensor_parallel_size": 2,
        "role": "decode",
    }
    assert cache_key(**base) != cache_key(**{**base, **change})


def test_cache_key_hash_separates_models_whose_slugs_collide() -> None:
    a = cache_key("org/model_A", "0.20.0", "h200", 1, "decode")
    b = cache_key("org/model-a", "0.20.0", "h200", 1, "decode")
    assert a != b
    assert a.rsplit("_", 1)[0] == b.rsplit("_", 1)[0]


def test_cache_key_of_a_very_long_model_path_stays_short() -> None:
    assert len(cache_key("/models/" + "x" * 500, "0.20.0", "NVIDIA H200", 8, "prefill")) <= 140


def test_cache_env_points_every_cache_under_the_keyed_dir() -> None:
    env = cache_env("/cache", "k1")
    for name in (
        c.ENV_VLLM_CACHE_ROOT,
        c.ENV_TRITON_CACHE_DIR,
        c.ENV_XDG_CACHE_HOME,
        c.ENV_TORCHINDUCTOR_CACHE_DIR,
        c.ENV_FLASHINFER_WORKSPACE_BASE,
        c.ENV_CUDA_CACHE_PATH,
    ):
        assert env[name].startswith("/cache/k1/"), name
    assert len({env[c.ENV_VLLM_CACHE_ROOT], env[c.ENV_TRITON_CACHE_DIR], env[c.ENV_XDG_CACHE_HOME]}) == 3
    assert env[c.ENV_TRITON_CACHE_MANAGER] == "hpd_runtime.triton_cache:StableFileCacheManager"
    assert env[c.ENV_TRITON_CACHE_MANAGER] == triton_cache.MANAGER_SPEC
    assert env[c.ENV_TRITON_STABLE_DIR] == env[c.ENV_TRITON_CACHE_DIR]
    assert env[c.ENV_CACHE_KEY] == "k1"
    assert c.ENV_TRITON_CACHE_MANAGER not in cache_env("/cache", "k1", stable_triton=False)


def test_child_env_keeps_cache_vars_the_pod_sets_explicitly() -> None:
    cfg = load_config({c.ENV_CACHE_DIR: "/c", c.ENV_GPU_PRODUCT: "NVIDIA H200"}, ARGS)
    env, key, applied = child_env({"VLLM_CACHE_ROOT": "/mine", "PATH": "/bin"}, cfg, "NVIDIA H200")
    assert env["VLLM_CACHE_ROOT"] == "/mine"
    assert "VLLM_CACHE_ROOT" not in applied
    assert env["TRITON_CACHE_DIR"] == f"/c/{key}/triton"
    assert env["PATH"] == "/bin"


@pytest.mark.parametrize(("rc", "code"), [(0, 0), (1, 1), (3, 3), (-signal.SIGTERM, 143), (-signal.SIGKILL, 137)])
def test_exit_code_is_shell_style(rc: int, code: int) -> None:
    assert exit_code(rc) == code


def test_gpu_product_prefers_the_configured_value() -> None:
    def boom(*a: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        raise AssertionError("nvidia-smi must not run")

    assert detect_gpu_product("NVIDIA-H200", run=boom) == "NVIDIA-H200"


def test_gpu_product_from_nvidia_smi_and_fallback_unknown() -> None:
    def smi(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert argv[0] == "nvidia-smi"
        return subprocess.CompletedProcess(argv, 0, stdout="NVIDIA H200\nNVIDIA H200\n", stderr="")

    def missing(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("nvidia-smi")

    assert detect_gpu_product(None, run=smi) == "NVIDIA H200"
    assert detect_gpu_product(None, run=missing) == "unknown"
    assert parse_gpu_product("\n\n") is None
