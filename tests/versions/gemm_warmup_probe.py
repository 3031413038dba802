"""Run with a vLLM parser venv's python (PYTHONPATH=images/runtime): hpd_runtime.gemm_warmup against real vLLM on the
CPU. Prints one JSON object. argv[1]: `after` (the plugin registers before vLLM imports its GPU worker, as in a
worker process), `before` (the worker module is already imported when the plugin registers) or `model` (as `after`,
on vLLM's own NemotronH model class instead of hand-built layers). argv[2]: a path for the
one-rank gloo group's file store."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import multiprocessing
import os
import sys
import types
from pathlib import Path

import torch

TINY_MODEL = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "tiny-nemotron-h" / "config.json"

os.environ["HPD_GEMM_WARMUP_TOKENS"] = "48"
order = sys.argv[1]
out: dict[str, object] = {}

# the worker calls kernel_warmup by the name it imported: what the plugin patches
spec = importlib.util.find_spec("vllm.v1.worker.gpu_worker")
assert spec is not None and spec.origin is not None
source = Path(spec.origin).read_text()
out["worker_imports_kernel_warmup"] = "from vllm.model_executor.warmup.kernel_warmup import kernel_warmup" in source
out["worker_calls_kernel_warmup"] = "kernel_warmup(self" in source

from hpd_runtime import gemm_warmup  # noqa: E402

gemm_warmup.register()  # in the API server process: must not touch vLLM
out["api_server_untouched"] = "vllm.model_executor.warmup.kernel_warmup" not in sys.modules
multiprocessing.current_process().name = "VllmWorker-0"
if order == "before":
    importlib.import_module("vllm.v1.worker.gpu_worker")
gemm_warmup.register()
gemm_warmup.register()  # vLLM may load plugins more than once per process
worker_module = importlib.import_module("vllm.v1.worker.gpu_worker")
kw = importlib.import_module("vllm.model_executor.warmup.kernel_warmup")
out["kernel_warmup_wrapped"] = bool(getattr(kw.kernel_warmup, "_hpd_gemm_warmup", False))
out["worker_binding_wrapped"] = bool(getattr(worker_module.kernel_warmup, "_hpd_gemm_warmup", False))
original = getattr(kw.kernel_warmup, "_hpd_original", None)
out["wrapped_once"] = callable(original) and not getattr(original, "_hpd_gemm_warmup", False)

from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import init_distributed_environment, initialize_model_parallel  # noqa: E402
from vllm.model_executor.layers import linear  # noqa: E402


def nemotron_h_without_attention(tmp: Path) -> VllmConfig:
    """The bench's tiny Nemotron-H with its attention layer dropped (vLLM has no CPU attention backend in these venvs):
    real Mamba2 mixers (whose conv1d is a LinearBase with a 3-D weight) and MLPs, built by vLLM's own model class."""
    from vllm.config import ModelConfig

    config = json.loads(TINY_MODEL.read_text())
    config.update(hybrid_override_pattern="M-M-", num_hidden_layers=4)
    (tmp / "model").mkdir(exist_ok=True)
    (tmp / "model" / "config.json").write_text(json.dumps(config))
    mc = ModelConfig(model=str(tmp / "model"), dtype="float32", max_model_len=256, skip_tokenizer_init=True)
    return VllmConfig(model_config=mc, device_config=DeviceConfig(device="cpu"))


if order == "model":
    vllm_config = nemotron_h_without_attention(Path(sys.argv[2]).parent)
else:
    vllm_config = VllmConfig(device_config=DeviceConfig(device="cpu"))
with set_current_vllm_config(vllm_config):
    init_distributed_environment(1, 0, f"file://{sys.argv[2]}", 0, backend="gloo")  # one rank, no port
    initialize_model_parallel(1, 1)
    dt = torch.float32
    if order == "model":
        from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM

        model = NemotronHForCausalLM(vllm_config=vllm_config, prefix="")
        out["linear_weights"] = sorted(
            {tuple(m.weight.shape) for m in model.modules() if isinstance(m, linear.LinearBase)}
        )
    else:
        model = torch.nn.Module()
        model.in_proj = linear.MergedColumnParallelLinear(64, [48, 48], bias=False, params_dtype=dt)
        model.in_proj2 = linear.MergedColumnParallelLinear(64, [48, 48], bias=False, params_dtype=dt)  # same GEMM
        model.out_proj = linear.RowParallelLinear(96, 64, bias=False, params_dtype=dt)
        # with bias: warmed with and without
        model.qkv = linear.ColumnParallelLinear(64, 80, bias=True, params_dtype=dt)
        model.o = linear.ReplicatedLinear(80, 64, bias=False, params_dtype=dt)
        # a layer whose method cannot take a plain (m, k) input: left out and named, the others still warm
        model.odd = linear.ReplicatedLinear(72, 40, bias=False, params_dtype=dt)

        def refuse(layer, x, bias=None):
            raise RuntimeError("needs a packed input")

        model.odd.quant_method = types.SimpleNamespace(apply=refuse)

    seen: dict[tuple[str, bool], list[int]] = {}
    method = linear.UnquantizedLinearMethod  # what every layer here (and the tiny model's, unquantized) applies
    real_apply = method.apply

    def counting_apply(self, layer, x, bias=None):  # the real method, counted
        seen.setdefault((f"{x.shape[1]}->{tuple(layer.weight.shape)}", bias is not None), []).append(x.shape[0])
        return real_apply(self, layer, x, bias)

    method.apply = counting_apply
    worker = types.SimpleNamespace(
        get_model=lambda: model,
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=64),
        model_config=types.SimpleNamespace(dtype=dt),
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        gemm_warmup.warm_worker(worker)
    method.apply = real_apply
out["log"] = err.getvalue().strip()
out["rows_per_gemm"] = {f"{k[0]} bias={k[1]}": v for k, v in sorted(seen.items())}
print(json.dumps(out))
