"""bench/gpu/kv_path.py on a CPU: its arguments, variant table, block layout, UCX log reading and result shape, without
a GPU, torch or nixl (the module imports neither; only its worker processes do)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu" / "kv_path.py"
RESULTS = sorted((REPO / "bench" / "results").glob("*-kv-path-*.json"))


def load() -> ModuleType:
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("bench_gpu_kv_path", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    mod.IMPORTED = set(sys.modules) - before  # type: ignore[attr-defined]
    return mod


kv = load()


def test_module_import_pulls_in_neither_torch_nor_nixl() -> None:
    assert not {m for m in kv.IMPORTED if m.split(".")[0] in ("torch", "nixl", "nixl_cu13", "numpy", "pynvml")}


def test_defaults_and_required_out() -> None:
    args = kv.parse_args(["--out", "x.json"])
    assert args.shapes.split(",") == list(kv.DEFAULT_SHAPES)
    assert (args.iters, args.regions, args.region_mib, args.mem, args.variants) == (3, 4, 256, "gpu", "all")
    assert kv.parse_args(["--list"]).list
    with pytest.raises(SystemExit):
        kv.parse_args([])  # --out is required for a run
    with pytest.raises(SystemExit):
        kv.parse_args(["--out", "x.json", "--iters", "0"])
    with pytest.raises(SystemExit):
        kv.parse_args(["--out", "x.json", "--shapes", "700x256q"])


def test_worker_arguments_round_trip() -> None:
    args = kv.parse_args(["--role", "d", "--rdv", "/tmp/r", "--variant", "get-zcopy", "--shapes", "700x256k"])
    assert (args.role, args.variant, args.out) == ("d", "get-zcopy", None)
    with pytest.raises(SystemExit):
        kv.parse_args(["--role", "d", "--rdv", "/tmp/r", "--variant", "nope"])


def test_shapes() -> None:
    s = kv.parse_shape("700x256k")
    assert (s.count, s.size, s.nbytes) == (700, 256 * 1024, 183_500_800)  # the "180 MB in 700 x 256 KiB"
    assert kv.parse_shape("1x176m").nbytes == 176 * 1024 * 1024
    assert kv.parse_shape("3x100").nbytes == 300
    for spec in kv.DEFAULT_SHAPES:  # every default shape fits the default regions
        layout = kv.block_layout(kv.parse_shape(spec), kv.DEFAULT_REGIONS, kv.DEFAULT_REGION_MIB * kv.MIB, 7)
        assert len(layout) == kv.parse_shape(spec).count


def test_variant_table() -> None:
    names = [v.name for v in kv.VARIANTS]
    assert len(names) == len(set(names))
    assert names[:2] == ["default", "get-zcopy"]  # a run cut short by --budget still has the baseline and the fix
    for v in kv.VARIANTS:
        assert v.alloc in kv.ALLOCATORS and v.op in kv.OPS, v
        assert all(isinstance(k, str) and isinstance(x, str) for k, x in v.env.items()), v
        assert v.shapes is None or set(v.shapes) <= set(kv.DEFAULT_SHAPES), v
        assert len(v.devices) == 2 and min(v.devices) >= 0, v
    by = kv.VARIANTS_BY_NAME
    assert by["default"].env == {} and by["default"].alloc == "torch" and by["default"].op == "READ"
    assert by["get-zcopy"].env == {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
    assert {v.alloc for v in kv.VARIANTS} == set(kv.ALLOCATORS)
    assert any(v.op == "WRITE" for v in kv.VARIANTS) and any(v.devices == (0, 1) for v in kv.VARIANTS)
    rows = kv.variant_table()
    assert [r["name"] for r in rows] == names and all(set(r) >= {"env", "alloc", "op", "why"} for r in rows)


def test_variant_env_is_exactly_the_table() -> None:
    inherited = {"PATH": "/bin", "UCX_TLS": "tcp", "NIXL_LOG_LEVEL": "DEBUG", "PYTORCH_CUDA_ALLOC_CONF": "x"}
    env = kv.variant_env(kv.VARIANTS_BY_NAME["default"], inherited)
    assert env["PATH"] == "/bin" and "UCX_TLS" not in env and "NIXL_LOG_LEVEL" not in env
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert env["UCX_RCACHE_MAX_UNRELEASED"] == "1024"  # what vLLM 0.20 sets itself
    assert env["UCX_PROTO_INFO"] == "y" and env["NCCL_NVLS_ENABLE"] == "0"
    env = kv.variant_env(kv.VARIANTS_BY_NAME["get-zcopy-expandable"], inherited)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
    assert kv.variant_env(kv.VARIANTS_BY_NAME["tls-tcp"], {})["UCX_TLS"] == "tcp,cuda_copy,self"


def test_block_layout() -> None:
    shape = kv.parse_shape("700x256k")
    region = 256 * kv.MIB
    layout = kv.block_layout(shape, 4, region, 7)
    assert layout == kv.block_layout(shape, 4, region, 7)  # deterministic: both processes compute it
    assert len(layout) == 700 and {r for r, _, _ in layout} == {0, 1, 2, 3}
    per_region = region // shape.size
    for r in range(4):
        src = [b for rr, b, _ in layout if rr == r]
        dst = [d for rr, _, d in layout if rr == r]
        assert len(set(src)) == len(src) and len(set(dst)) == len(dst)
        assert all(0 <= x < per_region for x in src + dst)
    with pytest.raises(ValueError):
        kv.block_layout(kv.parse_shape("2x300m"), 1, region, 7)
    with pytest.raises(ValueError):
        kv.block_layout(kv.parse_shape("5000x256k"), 1, region, 7)


# Lines as UCX 1.23.0 (nixl-cu13 1.5.1) printed them in the 2026-12-01 run (bench/results/2026-12-01-kv-path-1gpu.json)
UCX_LOG = """\
[1796159379.574357] [vm:510  :0]     ucp_context.c:2753 UCX  INFO  Version 1.23.0 (loaded from /tmp/site/x/libucp-b39b3ed9.so.0.0.0, git branch <unknown>, revision 65e342a)
[1796159380.494461] [vm:510  :0]      ucp_worker.c:1997 UCX  INFO    kvp-d intra-node cfg#2 rma_am(tcp/lo)  amo_am(tcp/lo)  device(cuda_ipc/cuda)  am(tcp/lo cma/memory cuda_ipc/cuda)  ka(tcp/lo)
[1796159380.494461] [vm:510  :0]     cuda_ipc_iface.c:320  UCX  DEBUG cuda-ipc get zcopy disabled as no nvlinks detected
[1796159380.566214] [vm:510  :0]   +--------+--------------------+-----------------------------------------+
[1796159380.566214] [vm:510  :0]   | kvp-d intra-node cfg#2                                                |
[1796159380.566214] [vm:510  :0]   | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1] |
[1796159380.566214] [vm:510  :0]   +--------+--------------------+-----------------------------------------+
[1796159380.566214] [vm:510  :0]   | Range  |    Description     |                 Config                  |
[1796159380.566214] [vm:510  :0]   +--------+--------------------+-----------------------------------------+
[1796159380.566214] [vm:510  :0]   | 0..inf | software emulation | tcp/lo                                  |
[1796159380.566214] [vm:510  :0]   +--------+--------------------+-----------------------------------------+
[1796159380.929706] [vm:510  :0]   +------------+--------------------+--------------------+
[1796159380.929706] [vm:510  :0]   | kvp-d intra-node cfg#2                                |
[1796159380.929706] [vm:510  :0]   | active message by ucp_am_send* from host memory       |
[1796159380.929706] [vm:510  :0]   | 0..inf     | multi-frag copy-in | tcp/lo             |
[1796159381.383110] [vm:510  :1]   | kvp-d intra-node cfg#2                                                |
[1796159381.383110] [vm:510  :1]   | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1] |
[1796159381.383110] [vm:510  :1]   | Range  |    Description     |                 Config                  |
[1796159381.383110] [vm:510  :1]   | 0..inf | software emulation | tcp/lo                                  |
"""


def test_ucx_lines() -> None:
    got = kv.ucx_lines(UCX_LOG)
    assert got["lanes"] == [
        "ucp_worker.c:1997 UCX  INFO    kvp-d intra-node cfg#2 rma_am(tcp/lo)  amo_am(tcp/lo)  "
        "device(cuda_ipc/cuda)  am(tcp/lo cma/memory cuda_ipc/cuda)  ka(tcp/lo)"
    ]
    # the GET table once (the second, identical one is deduplicated); the active-message table is not kept
    assert got["get_put_protocols"] == [{
        "ep": "kvp-d intra-node cfg#2",
        "op": "remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1]",
        "rows": ["0..inf | software emulation | tcp/lo"],
    }]  # fmt: skip
    assert any("Version 1.23.0" in x for x in got["other"])
    assert any("get zcopy disabled as no nvlinks" in x for x in got["other"])
    assert kv.read_protocols(got["get_put_protocols"]) == [
        "kvp-d intra-node cfg#2: remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1]: "
        "0..inf | software emulation | tcp/lo"
    ]


def test_summarize_shape_and_summary_table() -> None:
    shape = kv.parse_shape("700x256k")
    tele = {"xfer_us": 8000, "post_us": 100, "total_bytes": shape.nbytes, "desc_count": 700}
    iters = [{"s": 1.0, "warmup": True}, *({"s": t, "warmup": False, "telemetry": tele} for t in (0.009, 0.008, 0.010))]
    rec = kv.summarize_shape(shape, iters, True)
    assert set(kv.SHAPE_KEYS) <= set(rec)
    assert rec["timed_iterations"] == 3 and rec["ms"] == 9.0  # the median of the timed ones; the warm-up is left out
    assert rec["gbps"] == round(shape.nbytes / 0.009 / 1e9, 3) and rec["best_gbps"] == round(
        shape.nbytes / 0.008 / 1e9, 3
    )
    assert rec["nixl_telemetry"]["desc_count"] == 700 and rec["nixl_telemetry"]["xfer_ms"] == 8.0
    result = {"copy": {"d2d": {"gbps": 2000.0}},
              "variants": [{"name": "a", "status": "ok", "shapes": [rec]}, {"name": "b", "status": "failed", "shapes": []}]}  # fmt: skip
    rows = kv.summary_table(result)
    assert rows[0]["variant"] == "a" and rows[0]["gbps_700x256k"] == rec["gbps"] and rows[0]["verified"]
    assert rows[0]["fraction_of_d2d_copy"] == round(rec["gbps"] / 2000.0, 4)
    assert rows[1] == {"variant": "b", "status": "failed", "gbps_700x256k": None, "transport": None,
                       "best_gbps": None, "best_shape": None, "verified": False, "fraction_of_d2d_copy": None}  # fmt: skip


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_committed_results_have_the_shape(path: Path) -> None:
    data = json.loads(path.read_text())
    assert set(kv.RESULT_KEYS) <= set(data), path
    assert "kv_path.py" in data["command"]
    for v in data["variants"]:
        assert set(kv.VARIANT_KEYS) <= set(v), v["name"]
        for s in v["shapes"]:
            assert set(kv.SHAPE_KEYS) <= set(s), (v["name"], s.get("shape"))
            assert s["verified"] is True, (v["name"], s["shape"])


# --- issue #43: the roles isolated as pods, transfers in flight at once, the transport named ----------------------
ISOLATED = sorted((REPO / "bench" / "results").glob("*-kv-path-isolation-*.json"))


def test_concurrency_is_a_list_of_positive_counts() -> None:
    assert kv.parse_concurrency("1,4") == [1, 4]
    for bad in ("0", "a", ""):
        with pytest.raises(SystemExit):
            kv.parse_args(["--out", "x.json", "--concurrency", bad])


def test_each_role_starts_behind_its_topologys_wrapper() -> None:
    v = kv.VARIANTS_BY_NAME["get-zcopy"]
    pods = kv.parse_args(["--out", "x.json", "--topology", "pods", "--concurrency", "1,4"])
    argv = kv.worker_argv("d", v, pods, Path("/tmp/r"), "700x256k")
    assert argv[:2] == ["unshare", "--pid"] and argv[argv.index("--concurrency") + 1] == "1,4"
    assert "--reuid=1001" in argv and kv.worker_argv("d", v, kv.parse_args(["--out", "x"]), Path("/r"), "1x1k")[0] \
        == sys.executable  # fmt: skip
    pair = kv.parse_args(["--out", "x.json", "--topology", "pair", "--as-root"])
    argv = kv.worker_argv("p", v, pair, Path("/tmp/r"), "700x256k", holder_pid=99)
    assert argv[:2] == ["nsenter", "--target=99"] and "setpriv" not in argv


def test_setup_says_whether_the_roles_shared_a_pid_namespace() -> None:
    host = {"nvidia_smi": "0, NVIDIA H200, 580.159.04, 00000000:00:05.0"}
    for topology, shared in (("host", True), ("pods", False), ("pair", True)):
        args = kv.parse_args(["--out", "x.json", "--topology", topology])
        s = kv.setup_of(args, [kv.VARIANTS_BY_NAME["default"]], host)
        assert s["machine"] == "nvidia-h200: 1x H200" and s["roles_share_pid_namespace"] is shared
        assert (s["gpus_per_role"], s["roles_share_gpu"], s["vllm_version"], s["mode"]) == (
            {"prefill": [0], "decode": [0]}, True, None, None)  # fmt: skip
        assert s["topology"]["name"] == topology


def test_a_loaded_point_reports_the_rate_one_transfer_sees_and_the_aggregate() -> None:
    shape = kv.parse_shape("700x256k")
    it = {"s": 0.030, "per_transfer_s": [0.008, 0.015, 0.022, 0.029], "post_s": [0.007] * 4, "warmup": False}
    rec = kv.summarize_shape(shape, [{**it, "warmup": True}, it, it], True, 4)
    assert rec["concurrency"] == 4 and rec["timed_iterations"] == 2
    assert rec["ms"] == 18.5  # the median of the 8 timed transfers' own times, post to DONE
    assert rec["gbps"] == round(shape.nbytes / 0.0185 / 1e9, 3)
    assert rec["aggregate_gbps"] == round(4 * shape.nbytes / 0.030 / 1e9, 3) and rec["p90_ms"] == 29.0
    idle = kv.summarize_shape(shape, [{"s": 0.009, "warmup": False}], True)
    row = kv.summary_table({"variants": [{"name": "x", "status": "ok", "transport": "cuda_ipc",
                                          "shapes": [idle, rec]}]})[0]  # fmt: skip
    assert row["gbps_700x256k"] == idle["gbps"] and row["transport"] == "cuda_ipc"
    assert row["loaded"]["of_idle"] == round(rec["gbps"] / idle["gbps"], 3)


@pytest.mark.parametrize("path", ISOLATED, ids=[p.name for p in ISOLATED])
def test_isolated_results_carry_the_schema_the_topology_and_the_transport(path: Path) -> None:
    data = json.loads(path.read_text())
    assert set(kv.SCHEMA_KEYS) <= set(data) and data["requests"] is None
    topology = data["setup"]["topology"]["name"]
    assert path.stem.endswith(topology)
    for v in data["variants"]:
        shares = v["roles_share"]  # measured by the roles themselves, not assumed
        assert shares["pid"] is data["setup"]["roles_share_pid_namespace"], v["name"]
        assert v["transport"] in ("cuda_ipc", "tcp emulation"), v["name"]
        if not shares["pid"]:  # separate PID namespaces: cuda_ipc unreachable, with or without the fix
            assert v["transport"] == "tcp emulation"
