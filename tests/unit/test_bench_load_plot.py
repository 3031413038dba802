"""bench/load/plot.py on a synthetic result of run_load.py's shape (numbers made up, shapes as vLLM 0.20's
`vllm bench serve` saves them): the PNGs a platform team looks at, P/D and colocated on the same axes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_load_{name}", REPO / "bench" / "load" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


plot = load("plot")
run_load = load("run_load")


def bench_result(ttft_ms: float, itl_ms: float, n: int, detailed: bool = False) -> dict[str, Any]:
    """The keys of vLLM 0.20's saved result that plot.py reads (and a few it does not)."""
    r: dict[str, Any] = {"completed": n, "failed": 0, "duration": 10.0, "request_throughput": n / 10,
                         "request_goodput": n / 10 * (1.0 if ttft_ms < 2000 and itl_ms < 50 else 0.4),
                         "output_throughput": n / 10 * 192, "total_token_throughput": n / 10 * 4288,
                         "median_ttft_ms": ttft_ms}  # fmt: skip
    for q, f in (("50", 1.0), ("90", 1.6), ("99", 2.5)):
        r[f"p{q}_ttft_ms"], r[f"p{q}_itl_ms"], r[f"p{q}_tpot_ms"] = ttft_ms * f, itl_ms * f, itl_ms * (1 + f) / 2
    if detailed:
        r["ttfts"] = [ttft_ms / 1000 * (1 + 0.05 * i) for i in range(n)]
    return r


def synthetic(variant: str | None, sides: tuple[str, ...], sweep: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"cr": "nemotron-h-8b", "gpu": "NVIDIA H200", "hardware": run_load.ONE_GPU_LABEL,
                           "date": "2026-12-02", "variant": variant, "slo": {"ttft_ms": 2000, "tpot_ms": 50},
                           "command": "python3 bench/load/run_load.py --cr nemotron-h-8b ...",
                           "burst_command": "BURST_SECONDS=530 bash bench/gpu/load-burst.sh load ...", "sides": {}}  # fmt: skip
    for side in sides:
        pd = side == "pd"
        rows = []
        for p in run_load.SWEEPS["h200"] if sweep else []:
            load_ = p.x if p.family != "length" else p.x / 1024
            ttft = (300 if pd else 220) * (1 + load_ / 8)
            itl = (11 if pd else 14) * (1 + load_ / (40 if pd else 20))
            rows.append({"point": run_load.asdict(p), "target": "router", "status": {"ok": True},
                         "command": f"vllm bench serve --seed {p.seed}", "result": bench_result(ttft, itl, p.num_prompts)})  # fmt: skip
        rows.append({"point": run_load.asdict(run_load.SWEEPS["h200"][2]), "target": "router",
                     "status": {"ok": False, "error": "TimeoutError"}, "command": "x"})  # a failed run is left out  # fmt: skip
        probe = []
        for p in run_load.PROBES["h200"]:
            for target in ("router", "decode") if pd else ("router",):
                ttft = p.x / 20 + (12 if pd and target == "router" else 0)
                row = {"point": run_load.asdict(p), "target": target, "status": {"ok": True}, "command": "y",
                       "result": bench_result(ttft, 9, 5, detailed=True)}  # fmt: skip
                if pd and target == "router":
                    row["nixl"] = {"transfers": 6, "gbps": 20.0 * p.x / 8192, "mb_per_transfer": 102 + p.x / 64}
                probe.append(row)
        out["sides"][side] = {"points": rows, "probe": probe}
    return out


def test_plots_of_both_sides_and_the_probe(tmp_path: Path) -> None:
    results = [(synthetic("env+UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y", ("pd", "colocated")), None),
               (synthetic("env-UCX_CUDA_IPC_ENABLE_GET_ZCOPY", ("pd",), sweep=False), "TCP emulation")]  # fmt: skip
    written = plot.plot(results, tmp_path, "h200")
    assert [p.name for p in written] == ["h200-concurrency.png", "h200-rate.png", "h200-length.png", "h200-probe.png"]
    for p in written:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000
    names = [s["name"] for s in plot.series(results)]
    assert names == ["P/D via router [env+UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y]", "colocated x2, round robin",
                     "P/D via router [TCP emulation]"]  # fmt: skip
    assert all(r["status"]["ok"] for s in plot.series(results) for r in s["points"])  # the failed run left out


def test_a_probe_only_result_draws_the_probe_alone_from_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(synthetic("env-UCX_CUDA_IPC_ENABLE_GET_ZCOPY", ("pd",), sweep=False)))
    assert plot.main([str(path), "--out-dir", str(tmp_path / "png"), "--tag", f"{path}=before"]) == 0
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == ["load-probe.png"]


def test_lengths_label_reads_vllms_range_ratio() -> None:
    p = run_load.asdict(run_load.SWEEPS["h200"][1])
    assert plot.lengths(p) == "prompts 1024-7168 tokens, outputs 128-256"
    assert plot.lengths(run_load.asdict(run_load.SWEEPS["h200"][2])) == "prompts 8192 tokens, outputs 128"


def texts(fig: Any) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def with_failures() -> dict[str, Any]:
    """The synthetic P/D result with 2 of 5 probe requests and 7 of 32 sweep requests failed, as vLLM saves them
    (TTFT 0 and the error text at the failed request's index)."""
    res = synthetic(None, ("pd",))
    probe = next(r for r in res["sides"]["pd"]["probe"] if r["target"] == "router" and r["point"]["x"] == 8192)
    probe["result"].update(completed=3, failed=2, ttfts=[0.3, 0.31, 0.29, 0.0, 0.0],
                           errors=["", "", "", "Bad Request", "Internal Server Error"])  # fmt: skip
    point = next(r for r in res["sides"]["pd"]["points"] if r["point"]["name"] == "len8k-c16" and r.get("result"))
    point["result"].update(completed=25, failed=7)
    point["invalid"] = "the tokenizer bug"
    return res


def test_failed_requests_are_left_out_of_latencies_and_shown_as_failures() -> None:
    res = with_failures()
    probe = next(r for r in res["sides"]["pd"]["probe"] if r["target"] == "router" and r["point"]["x"] == 8192)
    assert plot.answered_ttfts(probe["result"]) == [300.0, 310.0, 290.0]  # the two 0 s failures are not latencies
    assert plot.counts(probe) == (3, 5)
    ss = plot.series([(res, None)])
    fig = plot.probe_figure(ss, "t", "f")
    assert "2 of 5 failed" in texts(fig)  # beside the point, ringed
    assert "P/D via router (n=5 per length)" in [t.get_text() for t in fig.legends[0].get_texts()]
    length = texts(plot.family_figure(ss, "length", "t", "f"))
    assert "7 of 32 failed" in length and "invalid (see file)" in length


def test_the_probe_ratio_is_over_the_colocated_deployment_as_in_the_docs() -> None:
    pd, colocated = synthetic("fix", ("pd",), sweep=False), synthetic(None, ("colocated",), sweep=False)
    ss = plot.series([(pd, None), (colocated, None)])
    ratios = sorted(t for t in texts(plot.probe_figure(ss, "t", "f")) if t.endswith("x colocated"))
    # P->D through the router: x/20 + 12 ms; the colocated deployment: x/20 ms (colocated on P/D's decode: the same)
    assert ratios == sorted(f"{(x / 20 + 12) / (x / 20):.2f}x colocated" for x in (1024, 4096, 8192))


def test_each_side_keeps_one_colour_and_rates_start_at_zero() -> None:
    results = [(synthetic("fix", ("pd", "colocated")), None), (synthetic("before", ("pd",), sweep=False), None)]
    colours = {s["name"]: s["color"] for s in plot.series(results)}
    assert colours == {"P/D via router [fix]": "tab:blue", "colocated x2, round robin": "tab:green",
                       "P/D via router [before]": "tab:orange"}  # fmt: skip
    colo_only = plot.series([(synthetic(None, ("colocated",)), None)])
    assert colo_only[0]["color"] == "tab:green"  # not the next colour of a shared cycle
    fig = plot.family_figure(plot.series(results), "concurrency", "t", "f")
    ttft, itl, good, tput = fig.axes[:4]
    assert ttft.get_yscale() == "log" and [ax.get_ylim()[0] for ax in (itl, good, tput)] == [0, 0, 0]
    assert any(label.get_text().endswith("n=48") for label in tput.get_xticklabels())
