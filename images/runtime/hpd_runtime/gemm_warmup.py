"""A vLLM general plugin that warms every GEMM row count before the pod reports Ready (every shape warm).

Why: on the H200 the first request of a prompt length that no warmup request had sent cost +5..+20 ms over its
steady median (first/steady up to 1.79x on the tiny model), with 0 Triton JIT and 0 autotune after Ready. A prefill
step of M tokens runs every linear layer with M rows, and cuBLAS/cuBLASLt choose an algorithm per (M, N, K) on first
use (a heuristic query, and sometimes a kernel module load), cached per process. `bench/gpu/blas_first_call.py` times
that with torch alone on the six linear shapes of the tiny model: +1..+16.6 ms at a new M against +0.01..+0.06 ms at
a warm one, the same per-length pattern as vLLM's; after one call at every M from 1 to 4,096 (4 s) every length is
warm (bench/results/2026-11-30-gpu-blas-first-call.json). Requests cannot cover every M cheaply (one forward per M,
prompts up to max_num_batched_tokens long), so this runs the model's own linear methods at every M in-process, as
vLLM itself does for DeepGEMM (vllm/model_executor/warmup/deep_gemm_warmup.py warms every M up to
max_num_batched_tokens).

Measured on the H200 (bench/gpu/README.md, fifth burst): with it, the first request at 12 never-sent lengths costs
what it costs at warmed ones (colocated: mean -0.7..+2.5 ms, every length within 1.2x, eager and compile, vLLM 0.20
and 0.25.1; without it +7.3 ms and 4 of 12 over 1.2x), for 7-10 s of sweep on the bench model.

How: registered under the `vllm.general_plugins` entry point (pyproject.toml), inert unless HPD_GEMM_WARMUP_TOKENS
is set (the operator sets it when spec.warmup.everyLength, the default). It wraps
`vllm.model_executor.warmup.kernel_warmup.kernel_warmup`, which the GPU worker calls after compile warmup and before
CUDA graph capture (0.20 to 0.33), and then calls `quant_method.apply(layer, x[:m])` once
per distinct linear shape of the loaded model for m = 1 .. limit (the scheduler's max_num_batched_tokens, or the
env value if smaller). Each tensor-parallel rank warms its own shards; nothing collective runs. Anything that goes
wrong is printed and skipped: this plugin never stops vLLM from starting. Its progress lines start with
`hpd-gemm-warmup:` in the vLLM log.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .contract import ENV_GEMM_WARMUP_SECONDS, ENV_GEMM_WARMUP_TOKENS, GEMM_WARMUP_SECONDS_DEFAULT

KERNEL_WARMUP_MODULE = "vllm.model_executor.warmup.kernel_warmup"
GPU_WORKER_MODULE = "vllm.v1.worker.gpu_worker"
LOG_PREFIX = "hpd-gemm-warmup:"


def say(message: str) -> None:
    print(f"{LOG_PREFIX} {message}", file=sys.stderr, flush=True)


def requested_tokens(env: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """None: off. 0: up to the scheduler's max_num_batched_tokens. N > 0: up to min(N, that)."""
    raw = env.get(ENV_GEMM_WARMUP_TOKENS, "").strip().lower()
    if raw in ("", "0", "off", "false"):
        return None
    if raw in ("auto", "on", "true"):
        return 0
    try:
        value = int(raw)
    except ValueError:
        say(f"{ENV_GEMM_WARMUP_TOKENS}={raw!r} is not a number or auto; GEMM warmup off")
        return None
    return value if value > 0 else None


def register() -> None:
    """vLLM general plugin entry point; vLLM calls it in every process it starts (API server, engine, workers)."""
    if requested_tokens() is None:
        return
    if multiprocessing.current_process().name == "MainProcess":
        # the API server: it never runs the model; do not import model code there
        return
    try:
        module = importlib.import_module(KERNEL_WARMUP_MODULE)
    except Exception as e:  # a vLLM without this module: say so, serve anyway
        say(f"not installed: cannot import {KERNEL_WARMUP_MODULE} ({type(e).__name__}: {e})")
        return
    original = getattr(module, "kernel_warmup", None)
    if original is None or getattr(original, "_hpd_gemm_warmup", False):
        return

    def kernel_warmup(worker: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(worker, *args, **kwargs)
        warm_worker(worker)
        return result

    kernel_warmup._hpd_gemm_warmup = True  # type: ignore[attr-defined]
    kernel_warmup._hpd_original = original  # type: ignore[attr-defined]
    setattr(module, "kernel_warmup", kernel_warmup)  # noqa: B010
    gpu_worker = sys.modules.get(GPU_WORKER_MODULE)  # imported before this plugin ran: patch its binding too
    if gpu_worker is not None and getattr(gpu_worker, "kernel_warmup", None) is original:
        setattr(gpu_worker, "kernel_warmup", kernel_warmup)  # noqa: B010


def warm_worker(worker: Any) -> None:
    limit = requested_tokens()
    if limit is None:
        return
    try:
        import torch

        model = worker.get_model()
        max_tokens = int(worker.scheduler_config.max_num_batched_tokens)
        rows = max_tokens if limit == 0 else min(limit, max_tokens)
        dtype = worker.model_config.dtype
        seconds = float(os.environ.get(ENV_GEMM_WARMUP_SECONDS, GEMM_WARMUP_SECONDS_DEFAULT))
        from vllm.model_executor.layers.linear import LinearBase

        targets = distinct_linear_calls(m for m in model.modules() if isinstance(m, LinearBase))
        with torch.inference_mode():
            report = sweep(targets, rows, dtype, deadline=time.monotonic() + seconds)
        say(report)
    except Exception as e:  # never fail vLLM's startup over a warmup
        say(f"skipped after {type(e).__name__}: {e}")


@dataclass(frozen=True)
class LinearCall:
    """One distinct GEMM of the model: a linear layer's own method applied to an input of K columns."""

    layer: Any
    k: int
    bias: Any

    def __call__(self, x: Any) -> Any:
        return self.layer.quant_method.apply(self.layer, x, self.bias)


def distinct_linear_calls(layers: Iterable[Any]) -> list[LinearCall]:
    """One call per distinct (method, input width, weight shape/dtype, bias or not): the same GEMM shape in 30 layers
    is warmed once. A layer with a bias is warmed with and without it (row-parallel layers add the bias on rank 0 only;
    addmm and mm are different cuBLAS calls)."""
    calls: dict[tuple[Any, ...], LinearCall] = {}
    for layer in layers:
        method = getattr(layer, "quant_method", None)
        if method is None:
            continue
        k = getattr(layer, "input_size_per_partition", None) or getattr(layer, "input_size", None)
        weight = getattr(layer, "weight", None)
        if not isinstance(k, int) or weight is None or weight.dim() != 2:
            # not a GEMM: Mamba2's conv1d is a ColumnParallelLinear whose weight the mixer reshapes to
            # (dim, 1, width) and feeds to the causal-conv1d kernels, never to quant_method.apply
            continue
        bias = getattr(layer, "bias", None)
        if getattr(layer, "skip_bias_add", False):
            bias = None
        for b in (None, bias) if bias is not None else (None,):
            key = (type(method).__qualname__, k, tuple(weight.shape), str(weight.dtype), b is not None)
            calls.setdefault(key, LinearCall(layer, k, b))
    return list(calls.values())


def sweep(calls: list[LinearCall], rows: int, dtype: Any, deadline: float) -> str:
    """Apply every call at every row count 1..rows (inputs of the model's dtype, sliced). Stops at the deadline."""
    import torch

    start = time.monotonic()
    buffers: dict[tuple[int, Any], Any] = {}  # one input per width and device: activations are shared, not per layer
    inputs, kept, dropped = [], [], []
    for c in calls:
        key = (c.k, c.layer.weight.device)
        if key not in buffers:
            buffers[key] = torch.zeros((rows, c.k), dtype=dtype, device=key[1])
        try:  # one row first: a layer whose method cannot take a plain (m, k) input is left out, the rest still warm
            c(buffers[key][:1])
        except Exception as e:
            dropped.append(f"{type(c.layer).__name__} {c.k}->{tuple(c.layer.weight.shape)} ({type(e).__name__}: {e})")
            continue
        kept.append(c)
        inputs.append(buffers[key])
    calls = kept
    done = 1  # every kept call has run at one row
    for m in range(2, rows + 1):
        for call, x in zip(calls, inputs, strict=True):
            call(x[:m])
        done = m
        if time.monotonic() > deadline:
            break
    for x in buffers.values():
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)  # the time reported is the GPU's, not the launch queue's
    del inputs, buffers
    elapsed = time.monotonic() - start
    shapes = ", ".join(f"{c.k}->{tuple(c.layer.weight.shape)}" for c in calls)
    status = "done" if done == rows else f"stopped at the deadline after {done} of {rows} row counts"
    left_out = f"; left out {len(dropped)}: {'; '.join(dropped)}" if dropped else ""
    return f"{status}: {len(calls)} GEMM shapes x row counts 1..{done} in {elapsed:.1f} s ({shapes}){left_out}"
