"""The KV data path between prefill and decode, measured without vLLM: two processes, NIXL's UCX backend, one
VRAM->VRAM transfer per shape as vLLM 0.20's NixlConnector does it (the decode side READs the prefill side's blocks:
`make_prepped_xfer("READ", ...)` over dlists prepared for every block of every registered region), per transport
configuration, beside the copy limits of the same host measured in the same run.

    python3 bench/gpu/kv_path.py --out kv.json                       # every variant, every shape (default)
    python3 bench/gpu/kv_path.py --list                               # the variant table
    python3 bench/gpu/kv_path.py --variants default,get-zcopy --shapes 700x256k --out kv.json

Each variant runs in two fresh processes (prefill "p" and decode "d"; UCX reads its configuration once, at
ucp_init), with only the variant's environment on top of BASE_ENV (UCX_* and PYTORCH_CUDA_ALLOC_CONF inherited from
the caller are removed, so a variant is exactly what the table says). They meet through files in a scratch
directory (NIXL agent metadata, region addresses) and talk over UCX on this host only; nothing listens on a
network address (the NIXL listener thread is off, as in vLLM). Per shape the destination is zeroed before every
iteration and every transferred block is compared with the source pattern after it (`verified`). UCX's own account
of the path (UCX_PROTO_INFO=y, UCX_LOG_LEVEL=info: the endpoint's lane summary and the protocol table for
`remote memory read by ucp_get*`; cuda_ipc / NVLink debug lines where the variant asks for debug) is kept in each
variant's record.

The copy limits (`copy`): torch device-to-device copy on one GPU (1 GiB, CUDA events), the same blocks as each
shape copied one cudaMemcpyAsync per block (what cuda_ipc issues per descriptor) and as one gather kernel, and
peer copies between GPU 0 and 1 where two are visible; NVML's NVLink view of GPU 0 (what UCX's cuda_ipc consults
before it offers GET zero-copy).

Nothing here imports torch or nixl at module import: the orchestrator needs neither (tests/unit checks the tables
and the result shape on a CPU); the worker processes import them.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import json
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "images" / "runtime")]
import isolation  # noqa: E402  (bench/gpu/isolation.py: the namespace topologies)

from hpd_runtime import ucx_transport  # noqa: E402  (the runtime reads UCX protocol tables the same way)

KIB = 1024
MIB = 1024 * KIB

BASE_ENV: dict[str, str] = {
    # what vLLM 0.20 sets before it imports nixl (vllm/distributed/nixl_utils.py:13-25)
    "UCX_RCACHE_MAX_UNRELEASED": "1024",
    # UCX's account of the path: lane summary at info, the protocol tables with PROTO_INFO
    "UCX_LOG_LEVEL": "info",
    "UCX_PROTO_INFO": "y",
    "PYTHONUNBUFFERED": "1",
    # kept set in every process (KINDS.md: NVLink multicast can take a shared host's GPUs out of service)
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
SCRUBBED_ENV_PREFIXES = ("UCX_", "NIXL_")
SCRUBBED_ENV = ("PYTORCH_CUDA_ALLOC_CONF",)
ALLOCATORS = ("torch", "expandable", "cudamalloc")
OPS = ("READ", "WRITE")
VLLM_NUM_THREADS = 4
"""vLLM 0.20 creates its agent as nixl_agent_config(num_threads=4, capture_telemetry=True) (nixl/worker.py:169-179)."""

DEFAULT_SHAPES = ("700x256k", "2800x64k", "11200x16k", "44x4m", "1x176m")
"""700 x 256 KiB is the issue's 180 MB transfer; the others move about the same bytes in 4x and 16x more, 16x fewer
and one descriptor, so the per-descriptor cost and the asymptotic rate separate."""
DEFAULT_REGIONS = 4
DEFAULT_REGION_MIB = 256
"""Four registered regions of 256 MiB a side (vLLM registers one region per layer tensor); blocks are scattered
over them, as a request's blocks are."""
SLOW_GBPS = 2.0
"""Below this rate after the warm-up iteration a shape gets one timed iteration (an emulated path is slow enough)."""


@dataclass(frozen=True)
class Shape:
    spec: str
    count: int
    size: int

    @property
    def nbytes(self) -> int:
        return self.count * self.size


def parse_concurrency(spec: str) -> list[int]:
    """`1,4`: the numbers of transfers in flight at once, each a point of every shape."""
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"concurrency {spec!r} is not a list of integers (e.g. 1,4)") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"concurrency {spec!r}: at least one number, each >= 1")
    return out


def parse_shape(spec: str) -> Shape:
    """`COUNTxSIZE`, SIZE in bytes or with a k / m suffix (KiB, MiB): `700x256k`."""
    m = re.fullmatch(r"(\d+)x(\d+)([kKmM]?)", spec.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"shape {spec!r} is not COUNTxSIZE (e.g. 700x256k)")
    count, size = int(m.group(1)), int(m.group(2)) * {"": 1, "k": KIB, "m": MIB}[m.group(3).lower()]
    if count < 1 or size < 1:
        raise argparse.ArgumentTypeError(f"shape {spec!r}: count and size must be positive")
    return Shape(spec.strip(), count, size)


@dataclass(frozen=True)
class Variant:
    name: str
    why: str
    env: dict[str, str] = field(default_factory=dict)
    alloc: str = "torch"
    """torch: the caching allocator (cudaMalloc segments, as vLLM's KV cache); expandable: PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True (cuMemCreate/VMM); cudamalloc: raw cudaMalloc through ctypes."""
    op: str = "READ"
    """READ: decode pulls (vLLM 0.20's NixlConnector); WRITE: prefill pushes (NixlPushConnector, vLLM >= 0.25)."""
    backend_params: dict[str, str] = field(default_factory=dict)
    """Extra UCX backend parameters for nixl_agent.create_backend (vLLM 0.20 passes only num_threads)."""
    devices: tuple[int, int] = (0, 0)
    """(prefill GPU, decode GPU)."""
    shapes: tuple[str, ...] | None = None
    """None: the run's shapes; else only these of them."""


FIX_ENV = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
ONE = ("700x256k",)
VARIANTS: tuple[Variant, ...] = (
    Variant("default", "vLLM 0.20 as shipped: no UCX env of ours, torch caching allocator, decode READs"),
    Variant("get-zcopy", "the fix: cuda_ipc offers GET zero-copy without NVLink", env=dict(FIX_ENV)),
    Variant("default-debug", "no fix, UCX_LOG_LEVEL=debug: cuda_ipc's own reason for no GET zero-copy, the lanes",
            env={"UCX_LOG_LEVEL": "debug"}, shapes=ONE),
    Variant("rma-ppln", "UCX_RMA_PPLN_ENABLE=y: get/rndv, the GET served as a PUT by the prefill side",
            env={"UCX_RMA_PPLN_ENABLE": "y"}, shapes=("700x256k", "11200x16k", "1x176m")),
    Variant("write-default", "prefill WRITEs (push) with no UCX env: cuda_ipc PUT needs no fix", op="WRITE",
            shapes=("700x256k", "11200x16k", "1x176m")),
    Variant("get-zcopy-noemul", "the fix, with RMA emulation forbidden: fails rather than fall back to TCP",
            env={**FIX_ENV, "UCX_PROTO_EMULATION_ENABLE": "n"}, shapes=("700x256k", "1x176m")),
    Variant("get-zcopy-expandable", "the fix on VMM memory (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
            env=dict(FIX_ENV), alloc="expandable", shapes=("700x256k", "1x176m")),
    Variant("get-zcopy-cudamalloc", "the fix on raw cudaMalloc memory", env=dict(FIX_ENV), alloc="cudamalloc",
            shapes=("700x256k", "1x176m")),
    Variant("default-expandable", "no fix, VMM memory", alloc="expandable", shapes=ONE),
    Variant("tls-ipc", "UCX_TLS naming cuda_ipc explicitly (the issue's second try)",
            env={"UCX_TLS": "cuda_ipc,cuda_copy,tcp,self,sm"}, shapes=ONE),
    Variant("get-zcopy-tls", "the fix with an explicit intra-node UCX_TLS",
            env={**FIX_ENV, "UCX_TLS": "cuda_ipc,cuda_copy,tcp,self,sm"}, shapes=ONE),
    Variant("engine-config", "the fix as a NIXL UCX backend parameter instead of env (vLLM 0.20 cannot pass it)",
            backend_params={"engine_config": "CUDA_IPC_ENABLE_GET_ZCOPY=y"}, shapes=ONE),
    Variant("proto-v1", "UCX's v1 protocol selection", env={"UCX_PROTO_ENABLE": "n"}, shapes=ONE),
    Variant("rndv-get", "UCX_RNDV_SCHEME=get_zcopy (tag/AM rendezvous only; RMA get should not change)",
            env={"UCX_RNDV_SCHEME": "get_zcopy"}, shapes=ONE),
    Variant("tls-tcp", "control: TCP and cuda_copy only", env={"UCX_TLS": "tcp,cuda_copy,self"}, shapes=ONE),
    Variant("get-zcopy-sgl", "the fix plus NIXL's UCX SGL path (one cuMemcpyBatchAsync per transfer, not per block)",
            env={**FIX_ENV, "NIXL_UCX_SGL_ENABLE": "1"}),
    Variant("write-sgl", "prefill WRITEs with NIXL's UCX SGL path, no UCX env", env={"NIXL_UCX_SGL_ENABLE": "1"},
            op="WRITE", shapes=("700x256k", "11200x16k", "1x176m")),
    Variant("get-zcopy-sgl-1thread", "the fix, SGL, one UCX worker thread (vLLM uses num_threads=4)",
            env={**FIX_ENV, "NIXL_UCX_SGL_ENABLE": "1"}, backend_params={"num_threads": "0"},
            shapes=("700x256k", "11200x16k")),
    Variant("x2-default", "P on GPU 0, D on GPU 1, no UCX env (needs two GPUs)", devices=(0, 1)),
    Variant("x2-get-zcopy", "P on GPU 0, D on GPU 1, the fix (needs two GPUs)", env=dict(FIX_ENV), devices=(0, 1)),
    Variant("x2-get-zcopy-sgl", "P on GPU 0, D on GPU 1, the fix and SGL (needs two GPUs)",
            env={**FIX_ENV, "NIXL_UCX_SGL_ENABLE": "1"}, devices=(0, 1)),
)  # fmt: skip
"""In the order they run: the baseline and the fix first, so a run cut short by --budget still answers."""
VARIANTS_BY_NAME = {v.name: v for v in VARIANTS}


def variant_env(v: Variant, inherited: dict[str, str]) -> dict[str, str]:
    """The environment of a variant's two processes: the caller's, less its UCX_/NIXL_ settings and allocator
    config, plus BASE_ENV and the variant's own."""
    env = {k: val for k, val in inherited.items() if not k.startswith(SCRUBBED_ENV_PREFIXES) and k not in SCRUBBED_ENV}
    env.update(BASE_ENV)
    env.update(v.env)
    if v.alloc == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def variant_env_delta(v: Variant) -> dict[str, str]:
    """What the variant sets beyond the scrubbed caller env (recorded in the result)."""
    env = dict(BASE_ENV)
    env.update(v.env)
    if v.alloc == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


# --- block layout -------------------------------------------------------------------------------------------------
def block_layout(shape: Shape, regions: int, region_bytes: int, seed: int) -> list[tuple[int, int, int]]:
    """(region, source block, destination block) per descriptor: blocks dealt round-robin over the regions, at
    distinct pseudo-random block slots on each side (a request's blocks are scattered over the KV cache)."""
    per_region = region_bytes // shape.size
    if per_region < 1:
        raise ValueError(f"{shape.spec}: a {shape.size}-byte block does not fit a {region_bytes}-byte region")
    need = [shape.count // regions + (1 if r < shape.count % regions else 0) for r in range(regions)]
    if max(need) > per_region:
        raise ValueError(f"{shape.spec}: {max(need)} blocks in a region of {per_region}")
    rng = random.Random(seed)
    slots = {
        r: (rng.sample(range(per_region), need[r]), rng.sample(range(per_region), need[r])) for r in range(regions)
    }
    out = []
    for j in range(shape.count):
        r, k = j % regions, j // regions
        out.append((r, slots[r][0][k], slots[r][1][k]))
    return out


# --- UCX log lines -----------------------------------------------------------------------------------------------
UCX_KEEP = re.compile(
    r"cuda_ipc|cuda-ipc|nvlink|intra-node|inter-node|rma_am|rma_bw|remote memory (read|write)|ucp_get|ucp_put"
    r"|get/|put/|zero-copy|emulation|Version \d|UCX_\w+=|no active messages|get zcopy|fabric|pidfd|IpcOpen"
    r"|NIXL (WARN|ERROR)|not legacy",
    re.I,
)
PROTO_TABLE_ROW = re.compile(r"^\s*(\[[^\]]*\]\s*)?\|")


def ucx_lines(text: str, cap: int = 120) -> dict[str, Any]:
    """UCX's account of the path, from one process's output: the lane summaries (`... intra-node cfg#N rma_am(...)
    am(...)`: the lanes per feature; `rma_am` there names the short-RMA lane, not the bulk path), the protocol tables
    of remote memory reads and writes (`remote memory read by ucp_get* ... from cuda/GPU0`: what a GET of VRAM
    really used, per size range), cuda_ipc/NVLink lines, the UCX version and its env echo. Deduplicated, in order."""
    lanes: list[str] = []
    tables: list[dict[str, Any]] = []
    other: list[str] = []
    seen: set[str] = set()
    table: dict[str, Any] | None = None
    title = ""
    for raw in text.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", raw).rstrip()
        body = re.sub(r"^\[[0-9.]+\]\s+\[[^\]]*\]\s*", "", line).strip()  # "[ts] [host:pid:tid]" prefix
        if body.startswith("+-"):
            continue
        if PROTO_TABLE_ROW.match(body):
            # a table: a title row naming the endpoint config (`| ucp_context_0 intra-node cfg#2 |`), a title row
            # naming the operation (`| remote memory read by ucp_get* into cuda/GPU0 from cuda |`), then the ranges
            cells = [c.strip() for c in body.strip("|").split("|")]
            if len(cells) == 1 and re.search(r"\bcfg#\d+", cells[0]):
                title, table = cells[0], None
            elif len(cells) == 1:
                table = {"ep": title, "op": cells[0], "rows": []}
                if re.search(r"remote memory (read|write)", cells[0]):
                    tables.append(table)
            elif table is not None and cells[0] != "Range" and "Range" not in cells[:2]:
                table["rows"].append(" | ".join(cells))
            continue
        table = None
        if re.search(r"cfg#\d+", body) and re.search(r"\b(am|rma|rma_am|amo|tag|device)\(", body):
            if body not in seen and len(lanes) < cap:
                seen.add(body)
                lanes.append(body)
        elif UCX_KEEP.search(body) and len(other) < cap:
            key = re.sub(r"0x[0-9a-f]+", "0x*", body)
            if key not in seen:
                seen.add(key)
                other.append(body[:400])
    unique: list[dict[str, Any]] = []
    keys: set[str] = set()
    for t in tables:
        key = json.dumps([t["ep"], t["op"], t["rows"]])
        if key not in keys and len(unique) < cap:
            keys.add(key)
            unique.append(t)
    return {"lanes": lanes, "get_put_protocols": unique, "other": other}


def read_protocols(tables: Sequence[dict[str, Any]]) -> list[str]:
    """`op: range | description | config` for every protocol range of a remote read whose memory is CUDA: what a
    GET of VRAM used (e.g. `0..inf | zero-copy | cuda_ipc/cuda`, or `... | software emulation | tcp/lo`)."""
    return [f"{t['ep']}: {t['op']}: {row}" for t in tables
            if "remote memory read" in t["op"] and "cuda" in t["op"] for row in t["rows"]]  # fmt: skip


# --- results -------------------------------------------------------------------------------------------------------
def summarize_shape(shape: Shape, iters: list[dict[str, Any]], verified: bool, concurrency: int = 1) -> dict[str, Any]:
    """One (shape, concurrency) point's record: every iteration (seconds, NIXL telemetry), the timed ones' median,
    GB/s (1e9 bytes/s of payload), and whether every iteration's data matched. At concurrency N each iteration is N
    transfers in flight at once: `gbps` is then the rate one transfer sees (its bytes over its own time from post to
    DONE, median over every transfer of the timed iterations: what vLLM's per-transfer throughput reports), and
    `aggregate_gbps` all N transfers' bytes over the iteration's wall time."""
    timed = [it for it in iters if not it.get("warmup")] or iters
    secs = [float(it["s"]) for it in timed]
    per = [float(x) for it in timed for x in it.get("per_transfer_s", [it["s"]])]
    med = statistics.median(per) if per else float("nan")
    rec: dict[str, Any] = {
        "shape": shape.spec, "descriptors": shape.count, "descriptor_bytes": shape.size, "bytes": shape.nbytes,
        "concurrency": concurrency, "iterations": iters, "timed_iterations": len(timed),
        "ms": round(med * 1e3, 3) if per else None,
        "gbps": round(shape.nbytes / med / 1e9, 3) if per and med > 0 else None,
        "best_gbps": round(shape.nbytes / min(per) / 1e9, 3) if per and min(per) > 0 else None,
        "verified": verified,
    }  # fmt: skip
    if concurrency > 1 and per:
        ordered = sorted(per)
        rec["p90_ms"] = round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3, 3)
        wall = statistics.median(secs)
        rec["aggregate_gbps"] = round(concurrency * shape.nbytes / wall / 1e9, 3) if wall > 0 else None
        posts = [float(x) for it in timed for x in it.get("post_s", [])]
        if posts:
            rec["post_ms"] = {"median": round(statistics.median(posts) * 1e3, 3), "max": round(max(posts) * 1e3, 3)}
    tele = [it["telemetry"] for it in timed if it.get("telemetry")]
    tele += [t for it in timed for t in it.get("telemetry_per_transfer", [])]
    if tele:
        xfer_us = statistics.median(t["xfer_us"] for t in tele)
        rec["nixl_telemetry"] = {"xfer_ms": round(xfer_us / 1e3, 3),
                                 "post_ms": round(statistics.median(t["post_us"] for t in tele) / 1e3, 3),
                                 "desc_count": tele[-1].get("desc_count"), "total_bytes": tele[-1].get("total_bytes"),
                                 "gbps": round(shape.nbytes / (xfer_us / 1e6) / 1e9, 3) if xfer_us > 0 else None}  # fmt: skip
    return rec


RESULT_KEYS = ("command", "date", "host", "copy", "variants", "shapes", "summary")
SCHEMA_KEYS = ("setup", "command", "requests")
"""Every result file since issue #43 (the fields tests/unit/test_bench_results.py checks)."""
VARIANT_KEYS = ("name", "why", "env", "alloc", "op", "devices", "backend_params", "status", "shapes", "ucx")
SHAPE_KEYS = ("shape", "descriptors", "descriptor_bytes", "bytes", "ms", "gbps", "verified")


def summary_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """variant -> the vLLM shape's GB/s, the best shape's GB/s, verified, and the fraction of the run's D2D copy."""
    copy = (result.get("copy") or {}).get("d2d") or {}
    d2d = copy.get("gbps")
    rows = []
    for v in result.get("variants", []):
        shapes = [s for s in v.get("shapes", []) if s.get("gbps")]
        vllm = next((s for s in shapes if s["shape"] == "700x256k" and s.get("concurrency", 1) == 1), None)
        loaded = next((s for s in shapes if s["shape"] == "700x256k" and s.get("concurrency", 1) > 1), None)
        best = max(shapes, key=lambda s: s["gbps"], default=None)
        rows.append({
            "variant": v["name"], "status": v["status"],
            "gbps_700x256k": vllm["gbps"] if vllm else None,
            **({"loaded": {"concurrency": loaded["concurrency"], "gbps_700x256k": loaded["gbps"],
                           "aggregate_gbps": loaded.get("aggregate_gbps"), "p90_ms": loaded.get("p90_ms"),
                           "of_idle": round(loaded["gbps"] / vllm["gbps"], 3) if vllm and vllm["gbps"] else None}}
               if loaded and loaded.get("gbps") else {}),
            "transport": v.get("transport"),
            "best_gbps": best["gbps"] if best else None, "best_shape": best["shape"] if best else None,
            "verified": bool(shapes) and all(s.get("verified") for s in v.get("shapes", [])),
            "fraction_of_d2d_copy": round(best["gbps"] / d2d, 4) if best and d2d else None,
        })  # fmt: skip
    return rows


# --- worker side (imports torch / nixl) ------------------------------------------------------------------------------
class HostMemory:
    """DRAM regions (a CPU self-check of the orchestration; UCX moves them over TCP or shared memory)."""

    mem_type = "DRAM"

    def __init__(self, regions: int, region_bytes: int, device: int) -> None:
        self.device = 0
        self.bufs = [ctypes.create_string_buffer(region_bytes) for _ in range(regions)]
        self.addrs = [ctypes.addressof(b) for b in self.bufs]
        self.region_bytes = region_bytes
        self.info: dict[str, Any] = {"alloc": "host"}

    _patterns: dict[tuple[int, int, int], bytes] = {}

    @classmethod
    def pattern(cls, seed: int, r: int, n: int) -> bytes:
        key = (seed, r, n)
        if key not in cls._patterns:
            cls._patterns[key] = random.Random(seed * 1000 + r).randbytes(n)
        return cls._patterns[key]

    def fill(self, seed: int) -> None:
        for r, a in enumerate(self.addrs):
            ctypes.memmove(a, self.pattern(seed, r, self.region_bytes), self.region_bytes)

    def zero(self) -> None:
        for a in self.addrs:
            ctypes.memset(a, 0, self.region_bytes)

    def verify(self, seed: int, shape: Shape, layout: list[tuple[int, int, int]]) -> bool:
        exp = [self.pattern(seed, r, self.region_bytes) for r in range(len(self.addrs))]
        s = shape.size
        return all(ctypes.string_at(self.addrs[r] + d * s, s) == exp[r][b * s : (b + 1) * s] for r, b, d in layout)


class _CudaArray:
    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _libcudart() -> tuple[Any, str]:
    """libcudart as torch loaded it (torch links it); else the one in the nvidia wheels; else libcuda's cuMemAlloc."""
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for base in sys.path:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libcudart.so*")))
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    for n in names:
        try:
            return ctypes.CDLL(n), n
        except OSError:
            continue
    return None, ""


def pointer_ipc_attrs(ptr: int) -> dict[str, Any]:
    """CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE (10) and ALLOWED_HANDLE_TYPES (14): what UCX's cuda_ipc md
    checks when it packs the rkey (src/uct/cuda/cuda_ipc/cuda_ipc_md.c, uct_cuda_ipc_mem_add_reg)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return {"error": str(e)}
    legacy, handles = ctypes.c_int(-1), ctypes.c_uint64(0)
    r1 = cuda.cuPointerGetAttribute(ctypes.byref(legacy), 10, ctypes.c_uint64(ptr))
    r2 = cuda.cuPointerGetAttribute(ctypes.byref(handles), 14, ctypes.c_uint64(ptr))
    return {"legacy_ipc_capable": legacy.value if r1 == 0 else f"err {r1}",
            "allowed_handle_types": handles.value if r2 == 0 else f"err {r2}"}  # fmt: skip


class GpuMemory:
    """VRAM regions: torch tensors (caching allocator, or VMM with expandable segments) or raw cudaMalloc."""

    mem_type = "VRAM"

    def __init__(self, regions: int, region_bytes: int, device: int, alloc: str) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.dev = torch.device("cuda", device)
        torch.cuda.set_device(self.dev)
        torch.zeros(1, device=self.dev)  # the primary context, current on this thread
        self.region_bytes = region_bytes
        self.info: dict[str, Any] = {"alloc": alloc, "torch": torch.__version__,
                                     "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}  # fmt: skip
        self.raw: list[int] = []
        if alloc == "cudamalloc":
            lib, name = _libcudart()
            self.info["cudart"] = name or "libcuda.so.1 cuMemAlloc_v2"
            self.tensors = []
            for _ in range(regions):
                p = ctypes.c_void_p()
                if lib is not None:
                    rc = lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(region_bytes))
                else:
                    rc = ctypes.CDLL("libcuda.so.1").cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(region_bytes))
                if rc != 0 or not p.value:
                    raise RuntimeError(f"cudaMalloc({region_bytes}) failed: {rc}")
                self.raw.append(int(p.value))
                self.tensors.append(torch.as_tensor(_CudaArray(int(p.value), region_bytes), device=self.dev))
        else:
            self.tensors = [torch.empty(region_bytes, dtype=torch.uint8, device=self.dev) for _ in range(regions)]
        self.addrs = [int(t.data_ptr()) for t in self.tensors]
        self.info["ipc_attrs"] = pointer_ipc_attrs(self.addrs[0])

    def pattern(self, seed: int, r: int) -> Any:
        g = self.torch.Generator(device=self.dev)
        g.manual_seed(seed * 1000 + r)
        return self.torch.randint(0, 256, (self.region_bytes,), dtype=self.torch.uint8, generator=g, device=self.dev)

    def fill(self, seed: int) -> None:
        for r, t in enumerate(self.tensors):
            t.copy_(self.pattern(seed, r))
        self.torch.cuda.synchronize(self.dev)

    def zero(self) -> None:
        for t in self.tensors:
            t.zero_()
        self.torch.cuda.synchronize(self.dev)

    def verify(self, seed: int, shape: Shape, layout: list[tuple[int, int, int]]) -> bool:
        torch = self.torch
        ok = True
        for r, t in enumerate(self.tensors):
            rows = [(b, d) for rr, b, d in layout if rr == r]
            if not rows:
                continue
            exp = self.pattern(seed, r)
            nb = self.region_bytes // shape.size
            src = torch.tensor([b for b, _ in rows], device=self.dev)
            dst = torch.tensor([d for _, d in rows], device=self.dev)
            got = t[: nb * shape.size].view(nb, shape.size).index_select(0, dst)
            want = exp[: nb * shape.size].view(nb, shape.size).index_select(0, src)
            ok = ok and bool(torch.equal(got, want))
            del exp
        return ok


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def wait_for(path: Path, timeout: float, idle: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout:.0f} s")
        if idle is not None:
            idle()
        time.sleep(0.001)


def make_agent(role: str, v: Variant) -> Any:
    from nixl._api import nixl_agent, nixl_agent_config

    if v.backend_params:
        agent = nixl_agent(f"kvp-{role}", nixl_agent_config(backends=[], capture_telemetry=True))
        agent.create_backend("UCX", {"num_threads": str(VLLM_NUM_THREADS), **v.backend_params})  # params win
        return agent
    # as vLLM 0.20 (nixl/worker.py:172-181): UCX only, num_threads=4, telemetry on, progress thread (default) on
    return nixl_agent(f"kvp-{role}", nixl_agent_config(num_threads=VLLM_NUM_THREADS, capture_telemetry=True))


def identity() -> dict[str, Any]:
    """The process as its peer would see it: pid (in its own PID namespace), uid/gid, the namespaces it is in."""
    return {"pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid(), "ns": isolation.namespaces(os.getpid())}


def read_batch(agent: Any, lh: Any, rh: Any, groups: list[tuple[list[int], list[int]]], tag: str) -> dict[str, Any]:
    """Post one READ per group back to back from this thread (vLLM's engine loop posts one per request of a step),
    then poll them all until DONE: per transfer its post time (transfer() call) and its time from post to DONE."""
    handles = [agent.make_prepped_xfer("READ", lh, li, rh, ri, notif_msg=f"{tag}-{j}".encode())
               for j, (li, ri) in enumerate(groups)]  # fmt: skip
    n = len(handles)
    starts, posts, states = [0.0] * n, [0.0] * n, [""] * n
    done: list[float | None] = [None] * n
    t0 = time.perf_counter()
    for j, h in enumerate(handles):
        starts[j] = time.perf_counter()
        states[j] = agent.transfer(h)
        posts[j] = time.perf_counter() - starts[j]
        if states[j] == "DONE":
            done[j] = time.perf_counter()
    while any(d is None for d in done):
        for j, h in enumerate(handles):
            if done[j] is None:
                states[j] = agent.check_xfer_state(h)
                if states[j] == "ERR":
                    raise RuntimeError(f"{tag}: transfer {j} state ERR")
                if states[j] == "DONE":
                    done[j] = time.perf_counter()
    ends = [float(d) for d in done if d is not None]
    rec: dict[str, Any] = {"s": round(max(ends) - t0, 6),
                           "per_transfer_s": [round(e - s0, 6) for e, s0 in zip(ends, starts, strict=True)],
                           "post_s": [round(x, 6) for x in posts]}  # fmt: skip
    tele = []
    for h in handles:
        with contextlib.suppress(Exception):
            tel = agent.get_xfer_telemetry(h)
            tele.append({"xfer_us": int(tel.xferDuration), "post_us": int(tel.postDuration),
                         "total_bytes": int(tel.totalBytes), "desc_count": int(tel.descCount)})  # fmt: skip
        agent.release_xfer_handle(h)
    if n == 1:
        if tele:
            rec["telemetry"] = tele[0]
        rec.pop("per_transfer_s")
    elif tele:
        rec["telemetry_per_transfer"] = tele
    return rec


def worker(args: argparse.Namespace) -> int:
    """One side of one variant. p: holds the source pattern; d: holds the destination, verifies. The initiator is
    d for READ (vLLM 0.20) and p for WRITE. Every (shape, concurrency) point: concurrency N means N transfers of
    the shape in flight at once (READ only), on disjoint destination blocks."""
    role, rdv = args.role, Path(args.rdv)
    v = VARIANTS_BY_NAME[args.variant]
    points = [(parse_shape(s), c) for s in args.shapes.split(",") for c in parse_concurrency(args.concurrency)]
    peer = "d" if role == "p" else "p"
    device = v.devices[0] if role == "p" else v.devices[1]
    region_bytes = args.region_mib * MIB
    t0 = time.monotonic()
    mem: HostMemory | GpuMemory = (
        HostMemory(args.regions, region_bytes, device) if args.mem == "host"
        else GpuMemory(args.regions, region_bytes, device, v.alloc)
    )  # fmt: skip
    if role == "p":
        mem.fill(args.seed)
    agent = make_agent(role, v)
    reg = agent.get_reg_descs([(a, region_bytes, mem.device, "") for a in mem.addrs], mem.mem_type)
    agent.register_memory(reg)
    write_bytes_atomic(rdv / f"{role}.meta", agent.get_agent_metadata())
    me = identity()
    write_json_atomic(rdv / f"{role}.json", {"addrs": mem.addrs, "device": mem.device, "mem": mem.info,
                                             "setup_s": round(time.monotonic() - t0, 2), "identity": me})  # fmt: skip
    wait_for(rdv / f"{peer}.json", args.timeout)
    peer_info = json.loads((rdv / f"{peer}.json").read_text())
    peer_name = agent.add_remote_agent((rdv / f"{peer}.meta").read_bytes())
    notifs = {"n": 0}

    def idle() -> None:
        for msgs in agent.get_new_notifs().values():
            notifs["n"] += len(msgs)

    initiator = (v.op == "READ" and role == "d") or (v.op == "WRITE" and role == "p")
    records: list[dict[str, Any]] = []

    def save_result() -> None:  # after every shape: a variant cut off by its timeout keeps what it measured
        write_json_atomic(rdv / "d.result.json", {"shapes": records, "notifs_received": notifs["n"],
                                                  "peer_mem": peer_info.get("mem"), "mem": mem.info,
                                                  "identity": me, "peer_identity": peer_info.get("identity")})  # fmt: skip

    for k, (shape, wanted) in enumerate(points):
        conc = wanted if v.op == "READ" else 1
        if v.op == "WRITE" and k and points[k - 1][0] == shape:
            continue  # WRITE: one point per shape
        both = Shape(shape.spec, shape.count * conc, shape.size)
        layout = block_layout(both, args.regions, region_bytes, args.seed + k)
        nb = region_bytes // shape.size
        iters: list[dict[str, Any]] = []
        verified = True
        n_iter = 1 + args.iters
        if initiator:
            local = [(a + b * shape.size, shape.size, mem.device) for a in mem.addrs for b in range(nb)]
            remote = [
                (a + b * shape.size, shape.size, peer_info["device"]) for a in peer_info["addrs"] for b in range(nb)
            ]
            lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, mem.mem_type)
            rh = agent.prep_xfer_dlist(peer_name, remote, mem.mem_type)
            # READ: local = decode's destination slots, remote = prefill's source slots; WRITE the other way round
            if v.op == "READ":
                li = [r * nb + d for r, _, d in layout]
                ri = [r * nb + b for r, b, _ in layout]
            else:
                li = [r * nb + b for r, b, _ in layout]
                ri = [r * nb + d for r, _, d in layout]
            n = shape.count
            groups = [(li[j * n : (j + 1) * n], ri[j * n : (j + 1) * n]) for j in range(conc)]
            i = 0
            while i < n_iter:
                if v.op == "READ":
                    mem.zero()
                    rec = read_batch(agent, lh, rh, groups, f"kvp-{k}-{i}")
                    rec["warmup"] = i == 0
                    rec["verified"] = mem.verify(args.seed, both, layout)
                    verified = verified and rec["verified"]
                    iters.append(rec)
                    dt = float(rec["s"])
                else:
                    wait_for(rdv / f"go-{k}-{i}", args.timeout, idle)
                    h = agent.make_prepped_xfer(v.op, lh, li, rh, ri, notif_msg=f"kvp-{k}-{i}".encode())
                    t = time.perf_counter()
                    state = agent.transfer(h)
                    while state not in ("DONE", "ERR"):
                        state = agent.check_xfer_state(h)
                    dt = time.perf_counter() - t
                    if state == "ERR":
                        raise RuntimeError(f"{shape.spec}: transfer state ERR")
                    rec = {"s": round(dt, 6), "warmup": i == 0}
                    with contextlib.suppress(Exception):
                        tel = agent.get_xfer_telemetry(h)
                        rec["telemetry"] = {"xfer_us": int(tel.xferDuration), "post_us": int(tel.postDuration),
                                            "total_bytes": int(tel.totalBytes), "desc_count": int(tel.descCount)}  # fmt: skip
                    agent.release_xfer_handle(h)
                    write_json_atomic(rdv / f"done-{k}-{i}", rec)
                if i == 0 and dt > 0 and both.nbytes / dt / 1e9 < SLOW_GBPS:
                    n_iter = min(n_iter, 2)
                    if v.op == "WRITE":
                        write_json_atomic(rdv / f"iters-{k}", {"n": n_iter})
                i += 1
            agent.release_dlist_handle(lh)
            agent.release_dlist_handle(rh)
            if v.op == "READ":
                records.append(summarize_shape(shape, iters, verified, conc))
                save_result()
        elif v.op == "WRITE":  # the decode side: zero, let prefill push, verify
            i = 0
            while i < n_iter:
                mem.zero()
                write_json_atomic(rdv / f"go-{k}-{i}", {})
                wait_for(rdv / f"done-{k}-{i}", args.timeout, idle)
                rec = json.loads((rdv / f"done-{k}-{i}").read_text())
                rec["verified"] = mem.verify(args.seed, shape, layout)
                verified = verified and rec["verified"]
                iters.append(rec)
                if (rdv / f"iters-{k}").exists():
                    n_iter = json.loads((rdv / f"iters-{k}").read_text())["n"]
                i += 1
            records.append(summarize_shape(shape, iters, verified))
            save_result()
    if role == "d":
        save_result()
        write_json_atomic(rdv / "end", {})
    else:
        wait_for(rdv / "end", args.timeout, idle)
        write_json_atomic(rdv / "p.result.json", {"notifs_received": notifs["n"], "mem": mem.info})
    with contextlib.suppress(Exception):
        agent.deregister_memory(reg)
    return 0


# --- copy limits (imports torch) -------------------------------------------------------------------------------------
def nvml_nvlinks(index: int = 0) -> dict[str, Any]:
    """NVML's NVLink view of a GPU, the calls UCX's uct_cuda_ipc_get_device_nvlinks makes: the link count field,
    then the remote PCI info of every link (one failure -> UCX counts 0 links -> no GET zero-copy)."""
    try:
        import pynvml
    except ImportError as e:
        return {"error": f"pynvml: {e}"}
    out: dict[str, Any] = {}
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        out["name"] = str(pynvml.nvmlDeviceGetName(h))
        fv = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0]
        out["link_count_field"] = {"nvmlReturn": int(fv.nvmlReturn), "value": int(fv.value.uiVal)}
        links = []
        for link in range(int(fv.value.uiVal) if fv.nvmlReturn == 0 else 0):
            rec: dict[str, Any] = {"link": link}
            for what, fn in (("state", pynvml.nvmlDeviceGetNvLinkState),
                             ("remote_pci", pynvml.nvmlDeviceGetNvLinkRemotePciInfo)):  # fmt: skip
                try:
                    val = fn(h, link)
                    rec[what] = getattr(val, "busId", val) if what == "remote_pci" else int(val)
                    if isinstance(rec[what], bytes):
                        rec[what] = rec[what].decode()
                    else:
                        rec[what] = str(rec[what]) if what == "remote_pci" else rec[what]
                except pynvml.NVMLError as e:
                    rec[what] = f"NVMLError: {e}"
            links.append(rec)
        out["links"] = links
        out["ucx_would_count"] = (
            0 if not links or any(str(x.get("remote_pci", "")).startswith("NVMLError") for x in links) else len(links)
        )
        pynvml.nvmlShutdown()
    except Exception as e:  # NVML absent or refused: recorded, not fatal
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def copy_limits(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    def timed(fn: Callable[[], None], reps: int) -> float:
        fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / reps

    out: dict[str, Any] = {"device_count": torch.cuda.device_count(), "torch": torch.__version__,
                           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}  # fmt: skip
    n = 1 << 30
    dev = torch.device("cuda", 0)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    s = timed(lambda: dst.copy_(src), 20)
    out["d2d"] = {"bytes": n, "ms": round(s * 1e3, 4), "gbps": round(n / s / 1e9, 1),
                  "gbps_read_plus_write": round(2 * n / s / 1e9, 1),
                  "what": "torch dst.copy_(src), 1 GiB on GPU 0, mean of 20 after a warm-up (CUDA events); gbps "
                          "counts payload bytes as the KV rates do"}  # fmt: skip
    region_bytes = args.region_mib * MIB
    regions_src = [src[i * region_bytes : (i + 1) * region_bytes] for i in range(min(args.regions, n // region_bytes))]
    regions_dst = [dst[i * region_bytes : (i + 1) * region_bytes] for i in range(len(regions_src))]
    per_shape = []
    for k, spec in enumerate(args.shapes.split(",")):
        shape = parse_shape(spec)
        try:
            layout = block_layout(shape, len(regions_src), region_bytes, args.seed + k)
        except ValueError as e:
            per_shape.append({"shape": spec, "error": str(e)})
            continue
        sz = shape.size

        def per_block(layout: list[tuple[int, int, int]] = layout, sz: int = sz) -> None:
            for r, b, d in layout:
                regions_dst[r][d * sz : (d + 1) * sz].copy_(regions_src[r][b * sz : (b + 1) * sz])

        nb = region_bytes // sz
        idx = [(r, torch.tensor([b for rr, b, _ in layout if rr == r], device=dev),
                torch.tensor([d for rr, _, d in layout if rr == r], device=dev)) for r in range(len(regions_src))]  # fmt: skip

        def gather(idx: list[tuple[int, Any, Any]] = idx, nb: int = nb, sz: int = sz) -> None:
            for r, bi, di in idx:
                if len(bi):
                    regions_dst[r][: nb * sz].view(nb, sz).index_copy_(
                        0, di, regions_src[r][: nb * sz].view(nb, sz).index_select(0, bi)
                    )

        t_blocks = timed(per_block, 3)
        t_gather = timed(gather, 3)
        per_shape.append({"shape": spec, "bytes": shape.nbytes,
                          "one_copy_per_block": {"ms": round(t_blocks * 1e3, 3),
                                                 "gbps": round(shape.nbytes / t_blocks / 1e9, 1),
                                                 "us_per_block": round(t_blocks / shape.count * 1e6, 2)},
                          "one_gather_kernel": {"ms": round(t_gather * 1e3, 3),
                                                "gbps": round(shape.nbytes / t_gather / 1e9, 1)}})  # fmt: skip
    out["same_blocks"] = per_shape
    if torch.cuda.device_count() >= 2:
        peer = {"can_access_peer_0_1": torch.cuda.can_device_access_peer(0, 1)}
        a = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:0")
        b = torch.empty(n, dtype=torch.uint8, device="cuda:1")
        s01 = timed(lambda: b.copy_(a), 10)
        s10 = timed(lambda: a.copy_(b), 10)
        peer["gpu0_to_gpu1"] = {"ms": round(s01 * 1e3, 3), "gbps": round(n / s01 / 1e9, 1)}
        peer["gpu1_to_gpu0"] = {"ms": round(s10 * 1e3, 3), "gbps": round(n / s10 / 1e9, 1)}
        out["peer"] = peer
    else:
        out["peer"] = {"skipped": "one GPU visible"}
    out["nvml_gpu0"] = nvml_nvlinks(0)
    return out


# --- orchestrator -------------------------------------------------------------------------------------------------
def run_cmd(argv: Sequence[str], timeout: float = 20) -> str:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        return (p.stdout + p.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({argv[0]}: {e})"


def host_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"python": sys.version.split()[0], "kernel": os.uname().release}
    facts["nvidia_smi"] = run_cmd(["nvidia-smi", "--query-gpu=index,name,driver_version,pci.bus_id",
                                   "--format=csv,noheader"])  # fmt: skip
    facts["topo"] = run_cmd(["nvidia-smi", "topo", "-m"])[:3000]
    facts["nvlink_status"] = run_cmd(["nvidia-smi", "nvlink", "-s"])[:3000]
    facts["nixl"] = nixl_facts()
    return facts


def nixl_facts() -> dict[str, Any]:
    """The nixl packages' versions and the bundled UCX's own version string (ucp_get_version_string)."""
    from importlib import metadata

    out: dict[str, Any] = {}
    for dist in ("nixl", "nixl-cu13", "nixl-cu12"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    for base in sys.path:
        libs = sorted(glob.glob(os.path.join(base, "nixl_cu1*.libs", "libucp-*.so*")))
        if libs:
            out["libucp"] = os.path.relpath(libs[0], base)
            try:
                lib = ctypes.CDLL(libs[0])
                lib.ucp_get_version_string.restype = ctypes.c_char_p
                out["ucx_version"] = lib.ucp_get_version_string().decode()
            except OSError as e:
                out["ucx_version"] = f"(not loaded: {e})"
            break
    return out


def worker_argv(
    role: str, v: Variant, args: argparse.Namespace, rdv: Path, shapes: str, *, holder_pid: int | None = None
) -> list[str]:
    """One role's command line: the topology's namespace wrapper (isolation.role_prefix), then this script."""
    own = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--rdv", str(rdv), "--variant", v.name,
           "--shapes", shapes, "--iters", str(args.iters), "--regions", str(args.regions),
           "--region-mib", str(args.region_mib), "--seed", str(args.seed), "--mem", args.mem,
           "--timeout", str(args.timeout), "--concurrency", args.concurrency]  # fmt: skip
    return [*isolation.role_prefix(args.topology, role, holder_pid, args.as_root), *own]


def spawn(
    role: str, v: Variant, args: argparse.Namespace, rdv: Path, shapes: str, *, holder_pid: int | None = None
) -> subprocess.Popen[bytes]:
    env = variant_env(v, dict(os.environ))
    # a non-root role: its own writable HOME (CUDA's cache, torch's)
    if isolation.TOPOLOGIES[args.topology].uids and not args.as_root:
        env["HOME"] = str(rdv / f"home-{role}")
        isolation.prepare_dirs([rdv / f"home-{role}"])
    with (rdv / f"{role}.log").open("wb") as fh:
        return subprocess.Popen(worker_argv(role, v, args, rdv, shapes, holder_pid=holder_pid), env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)


def run_variant(v: Variant, args: argparse.Namespace, work: Path, device_count: int | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"name": v.name, "why": v.why, "env": variant_env_delta(v), "alloc": v.alloc, "op": v.op,
                           "devices": list(v.devices), "backend_params": v.backend_params, "status": "ok",
                           "shapes": [], "ucx": {}}  # fmt: skip
    shapes = [s for s in args.shapes.split(",") if v.shapes is None or s in v.shapes] or args.shapes.split(",")[:1]
    rec["shape_specs"] = shapes
    if args.mem == "gpu" and device_count is not None and max(v.devices) >= device_count:
        rec["status"] = f"skipped: needs GPU {max(v.devices)}, {device_count} visible"
        return rec
    rdv = work / v.name
    shutil.rmtree(rdv, ignore_errors=True)  # a reused --workdir must not hand this run an earlier run's files
    isolation.prepare_dirs([work, rdv])
    logs = {r: rdv / f"{r}.log" for r in ("p", "d")}
    t0 = time.monotonic()
    holder, holder_pid = isolation.start_holder() if args.topology == "pair" else (None, None)
    procs = {r: spawn(r, v, args, rdv, ",".join(shapes), holder_pid=holder_pid) for r in ("p", "d")}
    deadline = t0 + args.timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
        if any(p.poll() not in (None, 0) for p in procs.values()):
            time.sleep(1)  # let the other side notice / finish writing
            break
        time.sleep(0.05)
    for p in procs.values():
        stop(p)
    if holder is not None:
        isolation.stop_holder(holder)
    rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["exit_codes"] = {r: p.returncode for r, p in procs.items()}
    texts = {r: logs[r].read_text(errors="replace") if logs[r].exists() else "" for r in logs}
    rec["ucx"] = {r: ucx_lines(texts[r]) for r in texts}
    rec["ucx"]["d_get_protocols"] = read_protocols(rec["ucx"]["d"]["get_put_protocols"])
    # the transport, as the runtime reads it from decode's log (READ) or prefill's (WRITE)
    choices = ucx_transport.choices_in(texts["d" if v.op == "READ" else "p"])
    rec["transport"] = choices[-1].transport if choices else None
    rec["transport_protocols"] = [c.describe() for c in choices]
    res_path = rdv / "d.result.json"
    if res_path.exists():
        res = json.loads(res_path.read_text())
        rec["shapes"] = res["shapes"]
        rec["memory"] = {"d": res.get("mem"), "p": res.get("peer_mem")}
        rec["notifs_received_by_d"] = res.get("notifs_received")
        ids = {"d": res.get("identity"), "p": res.get("peer_identity")}
        rec["roles"] = ids
        if all(ids.values()):
            rec["roles_share"] = {ns: ids["d"]["ns"].get(ns) == ids["p"]["ns"].get(ns) for ns in ids["d"]["ns"]}
    if any(c != 0 for c in rec["exit_codes"].values()) or not rec["shapes"]:
        rec["status"] = "failed" if rec["seconds"] < args.timeout else "timeout"
        rec["log_tail"] = {r: [ln[:300] for ln in texts[r].splitlines()[-25:]] for r in texts}
    elif not all(s.get("verified") for s in rec["shapes"]):
        rec["status"] = "data mismatch"
    return rec


def run_copy(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / "copy.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--role", "copy", "--rdv", str(work),
            "--shapes", args.shapes, "--regions", str(args.regions), "--region-mib", str(args.region_mib),
            "--seed", str(args.seed)]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}, **BASE_ENV}
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
    if p.returncode != 0 or not out.exists():
        return {"error": f"exit {p.returncode}", "log_tail": (p.stdout + p.stderr).splitlines()[-20:]}
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def select_variants(spec: str) -> list[Variant]:
    if spec == "all":
        return list(VARIANTS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in VARIANTS_BY_NAME]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS_BY_NAME)}")
    return [VARIANTS_BY_NAME[n] for n in names]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, help="the result JSON")
    ap.add_argument("--variants", default="all", help="comma-separated variant names, or all (--list shows them)")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated COUNTxSIZE (e.g. 700x256k)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per shape after one warm-up")
    ap.add_argument("--regions", type=int, default=DEFAULT_REGIONS, help="registered regions per side")
    ap.add_argument("--region-mib", type=int, default=DEFAULT_REGION_MIB, help="size of each region, MiB")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per variant (both processes)")
    ap.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="seconds for the whole run: no variant starts after this (0: no limit)",
    )
    ap.add_argument(
        "--mem",
        choices=("gpu", "host"),
        default="gpu",
        help="gpu (the benchmark) or host (DRAM: a CPU self-check of the orchestration)",
    )
    ap.add_argument(
        "--topology",
        choices=tuple(isolation.TOPOLOGIES),
        default="host",
        help="how the two roles are isolated (bench/gpu/isolation.py): host, pods, pair",
    )
    ap.add_argument(
        "--concurrency",
        default="1",
        help="comma-separated: transfers in flight at once per point (READ variants), e.g. 1,4",
    )
    ap.add_argument("--as-root", action="store_true", help="keep the caller's uid in every topology")
    ap.add_argument("--no-copy", action="store_true", help="skip the copy limits")
    ap.add_argument("--fail-fast", action="store_true", help="stop once the first two variants run have failed")
    ap.add_argument("--list", action="store_true", help="print the variant table and exit")
    ap.add_argument("--workdir", type=Path, help="keep the per-variant logs here (default: a temporary directory)")
    ap.add_argument("--role", choices=("p", "d", "copy"), help=argparse.SUPPRESS)
    ap.add_argument("--rdv", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    for s in args.shapes.split(","):
        try:
            parse_shape(s)
        except argparse.ArgumentTypeError as e:
            ap.error(str(e))
    if args.iters < 1:
        ap.error("--iters must be >= 1")
    try:
        parse_concurrency(args.concurrency)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if args.role is None and not args.list and args.out is None:
        ap.error("--out is required")
    if args.variant is not None and args.variant not in VARIANTS_BY_NAME:
        ap.error(f"unknown variant {args.variant}")
    return args


def machine_of(nvidia_smi: str) -> str:
    """`nvidia-h200: 1x H200` from nvidia-smi's `index, name, ...` lines (the kind as the device tool names it)."""
    names = [ln.split(",")[1].strip() for ln in nvidia_smi.splitlines() if ln.count(",") >= 2]
    if not names:
        return "not recorded (no GPU listed by nvidia-smi)"
    n, short = len(names), names[0].removeprefix("NVIDIA ").strip()
    kind = "nvidia-" + re.sub(r"[^a-z0-9]+", "-", short.lower()) + ("" if n == 1 else f"-x{n}")
    return f"{kind}: {n}x {short}" + ("" if n == 1 else " (one host)")


def setup_of(args: argparse.Namespace, variants: Sequence[Variant], host: dict[str, Any]) -> dict[str, Any]:
    """The `setup` every result file carries (issue #43's schema, shared with tests/unit/test_bench_results.py)."""
    t = isolation.TOPOLOGIES[args.topology]
    devices = {tuple(v.devices) for v in variants}
    p_gpu, d_gpu = sorted(devices)[0] if devices else (0, 0)
    gpu = args.mem == "gpu"
    return {
        "machine": machine_of(str(host.get("nvidia_smi", ""))) if gpu else "cpu self-check (--mem host, no GPU)",
        "model": "none (NIXL transfers of KV-shaped GPU buffers, no vLLM)", "vllm_version": None, "mode": None,
        "gpus_per_role": {"prefill": [p_gpu], "decode": [d_gpu]} if gpu else {},
        "roles_share_gpu": (len(devices) == 1 and p_gpu == d_gpu) if gpu else None,
        "roles_share_pid_namespace": t.roles_share_pid_namespace,
        "topology": {"name": t.name, "why": t.why, "roles_share_ipc_namespace": t.roles_share_ipc_namespace,
                     "own_mount_namespace": t.own_mount_namespace,
                     "uids": {"prefill": list(t.uids[0]), "decode": list(t.uids[1])}
                     if t.uids and not args.as_root else None},
    }  # fmt: skip


def variant_table() -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(var).items()} for var in VARIANTS]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for row in variant_table():
            print(json.dumps(row))
        return 0
    if args.role in ("p", "d"):
        return worker(args)
    if args.role == "copy":
        write_json_atomic(Path(args.rdv) / "copy.json", copy_limits(args))
        return 0
    variants = select_variants(args.variants)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kv-path-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "setup": {},
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "requests": None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": {}, "copy": {}, "variants": [],
        "shapes": [asdict(parse_shape(s)) for s in args.shapes.split(",")],
        "settings": {"iters": args.iters, "regions": args.regions, "region_mib": args.region_mib, "mem": args.mem,
                     "base_env": BASE_ENV, "scrubbed_env": [*SCRUBBED_ENV_PREFIXES, *SCRUBBED_ENV],
                     "topology": args.topology, "concurrency": parse_concurrency(args.concurrency),
                     "vllm_like_agent": f"nixl_agent_config(num_threads={VLLM_NUM_THREADS}, capture_telemetry=True)"},
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["summary"] = summary_table(result)
        args.out.write_text(json.dumps(result, indent=1))

    try:
        result["host"] = host_facts() if args.mem == "gpu" else {"python": sys.version.split()[0], "nixl": nixl_facts()}
        result["setup"] = setup_of(args, variants, result["host"])
        device_count = None
        if args.mem == "gpu" and not args.no_copy:
            result["copy"] = run_copy(args, work)
            device_count = result["copy"].get("device_count")
        save()
        t_run = time.monotonic()
        for v in variants:
            t = time.monotonic()
            if args.budget and t - t_run > args.budget:
                result["variants"].append({"name": v.name, "why": v.why, "env": variant_env_delta(v),
                                           "alloc": v.alloc, "op": v.op, "devices": list(v.devices),
                                           "backend_params": v.backend_params, "status": "not run: --budget spent",
                                           "shapes": [], "ucx": {}})  # fmt: skip
                continue
            ran = [r for r in result["variants"] if not r["status"].startswith(("skipped", "not run"))]
            if args.fail_fast and len(ran) >= 2 and all(r["status"] in ("failed", "timeout") for r in ran):
                result["variants"].append({"name": v.name, "why": v.why, "env": variant_env_delta(v),
                                           "alloc": v.alloc, "op": v.op, "devices": list(v.devices),
                                           "backend_params": v.backend_params,
                                           "status": "not run: the first variants all failed (--fail-fast)",
                                           "shapes": [], "ucx": {}})  # fmt: skip
                continue
            rec = run_variant(v, args, work, device_count)
            result["variants"].append(rec)
            save()
            brief = [(s["shape"], s.get("gbps"), s.get("verified")) for s in rec["shapes"]]
            print(f"[kv_path] {v.name}: {rec['status']} {brief} ({time.monotonic() - t:.1f} s)", flush=True)
    finally:
        save()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    for row in result["summary"]:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
