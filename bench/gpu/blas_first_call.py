"""Does a GEMM pay a first-call cost at every new row count M? (issue #12, "every shape warm")

The shapes step of run.py sees the first request of a never-sent prompt length cost +5..+20 ms over its steady
median, against about +1 ms at lengths the warmup ladder sent, with 0 Triton JIT and 0 autotune after Ready. A
prefill of n tokens runs every linear layer with M = n rows; cuBLAS/cuBLASLt pick an algorithm per (M, N, K) with a
heuristic query that is cached per shape in the process. This script times, on the GPU with torch alone (no vLLM),
the six linear shapes of bench/gpu/tiny-nemotron-h at the lengths run.py measures: first call vs the median of 5
more, after a ladder of warm lengths (the control lengths). Prints JSON. One process per BLAS library (each has its
own per-process caches); a second argument W first runs every row count 1..W once (the cost of warming them all):

    python3 bench/gpu/blas_first_call.py cublas > $OUT/cublas.json; python3 bench/gpu/blas_first_call.py cublaslt > $OUT/cublaslt.json
    python3 bench/gpu/blas_first_call.py cublas 4096 > $OUT/cublas-warm-all.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

# (out_features, in_features) of the tiny Nemotron-H: Mamba in_proj / out_proj, attention qkv / o, MLP up / down
LINEAR_SHAPES = ((2320, 512), (512, 1024), (768, 512), (512, 512), (1024, 512), (512, 1024))
SHAPE_LENGTHS = (815, 816, 817, 1279, 1280, 1281, 2207, 2208, 2209, 3503, 3504, 3505)
CONTROL_LENGTHS = (1023, 1024, 1539, 2047, 2048, 3075)
REPEATS = 5


def layers(m: int, weights: list[torch.Tensor]) -> float:
    xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in (512, 1024)}
    torch.cuda.synchronize()
    t = time.perf_counter()
    for w in weights:
        torch.nn.functional.linear(xs[w.shape[1]], w)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def sweep(weights: list[torch.Tensor], warm_all: int = 0) -> list[dict[str, float | int | bool]]:
    for m in CONTROL_LENGTHS:  # the "ladder": these lengths are warm before the sweep
        layers(m, weights)
    for m in range(1, warm_all + 1):  # what it costs to warm every row count up to warm_all
        layers(m, weights)
    rows = []
    for m in (*SHAPE_LENGTHS, *CONTROL_LENGTHS):
        times = [layers(m, weights) for _ in range(1 + REPEATS)]
        steady = statistics.median(times[1:])
        rows.append({"m": m, "warm_before": m in CONTROL_LENGTHS, "first_ms": round(1000 * times[0], 3),
                     "steady_ms": round(1000 * steady, 3), "first_minus_steady_ms": round(1000 * (times[0] - steady), 3)})  # fmt: skip
    return rows


def main() -> None:
    torch.manual_seed(0)
    lib = sys.argv[1] if len(sys.argv) > 1 else "cublas"
    torch.backends.cuda.preferred_blas_library(lib)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for n, k in LINEAR_SHAPES]
    layers(64, weights)  # CUDA context, BLAS handle and workspace
    warm_all = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    t = time.perf_counter()
    rows = sweep(weights, warm_all)
    sweep_s = time.perf_counter() - t
    unseen = [float(r["first_minus_steady_ms"]) for r in rows if not r["warm_before"]]
    control = [float(r["first_minus_steady_ms"]) for r in rows if r["warm_before"]]
    summary = {"unseen_mean_ms": round(statistics.mean(unseen), 3), "unseen_max_ms": max(unseen),
               "control_mean_ms": round(statistics.mean(control), 3), "control_max_ms": max(control)}  # fmt: skip
    out = {
        "library": lib,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "summary": summary,
        "warm_all_rows_up_to": warm_all,
        "seconds_ladder_warm_all_and_sweep": round(sweep_s, 2),
        "rows": rows,
    }
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
