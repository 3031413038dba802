"""bench/gpu/run.py builds its command lines with the operator's profile; these checks run on the CPU so the GPU
runs (issue #6, and the heterogeneous-TP runs of issue #7 once a multi-GPU machine is lent) start from argv that
is already known to be right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"
sys.path.insert(0, str(BENCH))
import run  # noqa: E402


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_default_bench_argv_is_the_profile_with_dummy_weights_on_one_gpu(tmp_path: Path) -> None:
    roles, subs = run.role_commands("eager", BENCH / "tiny-nemotron-h", tmp_path, warmup=True)
    for name, role in roles.items():
        assert arg(role.args, "--tensor-parallel-size") == "1"
        assert arg(role.args, "--load-format") == "dummy"
        assert "--block-size" not in role.args  # vLLM's own Mamba-aligned size (an explicit 128 broke P->D)
        assert "--enforce-eager" in role.args
        assert role.env["CUDA_VISIBLE_DEVICES"] == "0"
        assert role.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
        assert role.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        assert role.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(run.PORTS[name]["side"])
    assert ("--no-async-scheduling" in roles["decode"].args) and ("--no-async-scheduling" not in roles["prefill"].args)
    assert any("CUDA_VISIBLE_DEVICES" in s for s in subs)


@pytest.mark.parametrize(("tp", "gpus"), [((2, 1), ("0,1", "0")), ((1, 2), ("0", "0,1"))])
def test_hetero_tp_argv_uses_fixed_weights_and_keeps_nvlink_multicast_off(
    tmp_path: Path, tp: tuple[int, int], gpus: tuple[str, str]
) -> None:
    roles, _ = run.role_commands("compile", tmp_path / "ckpt", tmp_path / "cache", True, tp=tp, weights="fixed")
    for i, name in enumerate(("prefill", "decode")):
        args, env = roles[name].args, roles[name].env
        assert arg(args, "--tensor-parallel-size") == str(tp[i])
        assert "--load-format" not in args  # the same checkpoint at both TP sizes
        assert arg(args, "--model") == str(tmp_path / "ckpt")
        assert "--enforce-eager" not in args
        assert env["CUDA_VISIBLE_DEVICES"] == gpus[i]
        assert env["NCCL_NVLS_ENABLE"] == "0"
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
        # the tiny config's 2 KV heads and 2 Mamba groups divide TP 2: no replication, vLLM's own block size
        assert "--block-size" not in args


def test_block_sizes_are_read_from_vllms_log(tmp_path: Path) -> None:
    """Lines as vLLM 0.20.0 logged them on the H200 (bench/results/2026-11-29-gpu-diagnose-pd-v2.json)."""
    log = tmp_path / "p.log"
    log.write_text(
        "(EngineCore pid=1) INFO [interface.py:606] Setting attention block size to 528 tokens to ensure that "
        "attention page size is >= mamba page size.\n"
        "(EngineCore pid=1) INFO [worker.py:343] User-specified logical block size (528) does not match physical "
        "kernel block size (16). Using the latter.\n"
    )
    phase = run.Phase("cold", {"prefill": run.Role("prefill", [], {}, log=log), "decode": run.Role("decode", [], {})})
    assert run.block_sizes(phase) == {
        "prefill": {"attention": 528, "kernel": 16},
        "decode": {"attention": None, "kernel": None},
    }
