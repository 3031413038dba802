"""PNGs of bench/load/run_load.py results: P/D and colocated on the same axes.

    python3 bench/load/plot.py RESULT.json [RESULT.json ...] --out-dir DIR [--prefix NAME] [--tag RESULT.json=TEXT]

One figure per load family in the results (`concurrency`: fixed concurrencies on the mixed prompt lengths; `rate`:
open-loop request rates on them; `length`: fixed prompt lengths at one concurrency), each with four panels: TTFT
p50/p90/p99, ITL p50/p90/p99, goodput at the results' SLO beside request throughput, output token throughput. And
`probe` (issue #26): time to first token at concurrency 1 against prompt length (median, min-max bars), P->D through
the router (annotated with its ratio over the next), colocated on P/D's decode, the colocated deployment, with
decode's KV transfer rate and bytes per request at each length. A series is one
side of one result file, tagged with the file's plan variant (or --tag); the footer names the command of each file.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

FAMILIES = {
    "concurrency": ("concurrent requests (max in flight)", False),
    "rate": ("request rate (req/s, Poisson arrivals)", False),
    "length": ("prompt tokens", True),
}
PERCENTILE_STYLES = {"50": ("-", "o"), "90": ("--", "s"), "99": (":", "^")}
SIDE_NAMES = {"pd": "P/D via router", "colocated": "colocated x2, round robin"}
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def series(results: list[tuple[dict[str, Any], str | None]]) -> list[dict[str, Any]]:
    """(result, tag) -> one entry per side: its name, colour, sweep rows and probe rows."""
    out = []
    for result, given in results:
        tag = given if given is not None else result.get("variant")
        for side, rec in result.get("sides", {}).items():
            name = SIDE_NAMES.get(side, side) + (f" [{tag}]" if tag and side == "pd" else "")
            ok = lambda rows: [r for r in rows if r.get("result") and (r.get("status") or {}).get("ok")]  # noqa: E731
            out.append({"name": name, "side": side, "points": ok(rec.get("points", [])),
                        "probe": ok(rec.get("probe", [])), "color": COLORS[len(out) % len(COLORS)]})  # fmt: skip
    return out


def _rows(s: dict[str, Any], family: str) -> list[dict[str, Any]]:
    return sorted((r for r in s["points"] if r["point"]["family"] == family), key=lambda r: r["point"]["x"])


def lengths(p: dict[str, Any]) -> str:
    """A point's prompt and output lengths as vLLM's random dataset draws them (uniform integers in L(1 -+ r))."""
    rr = json.loads(p["range_ratio"]) if p["range_ratio"].startswith("{") else float(p["range_ratio"])
    r_in, r_out = (rr.get("input", 0.0), rr.get("output", 0.0)) if isinstance(rr, dict) else (rr, rr)

    def span(n: int, r: float) -> str:  # vllm/benchmarks/datasets/utils.py: floor and ceil, both included
        return f"{math.floor(n * (1 - r))}-{math.ceil(n * (1 + r))}" if r else str(n)

    return f"prompts {span(p['input_len'], r_in)} tokens, outputs {span(p['output_len'], r_out)}"


def family_figure(ss: list[dict[str, Any]], family: str, title: str, footer: str) -> plt.Figure | None:
    if not any(_rows(s, family) for s in ss):
        return None
    xlabel, log_x = FAMILIES[family]
    first = next(r["point"] for s in ss for r in _rows(s, family))
    if family == "length":
        xlabel += f" (concurrency {first['max_concurrency']}, {first['output_len']} output tokens)"
    else:
        xlabel += f"; {lengths(first)}"
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ttft, itl), (good, tput) = axes
    for s in ss:
        rows = _rows(s, family)
        if not rows:
            continue
        x = [r["point"]["x"] for r in rows]
        for q, (ls, mk) in PERCENTILE_STYLES.items():
            for ax, metric in ((ttft, "ttft"), (itl, "itl")):
                y = [r["result"].get(f"p{q}_{metric}_ms") for r in rows]
                ax.plot(x, y, linestyle=ls, marker=mk, color=s["color"])
        good.plot(x, [r["result"].get("request_goodput") or 0 for r in rows], "-o", color=s["color"])
        good.plot(x, [r["result"].get("request_throughput") for r in rows], ":", marker=".", color=s["color"])
        tput.plot(x, [r["result"].get("output_throughput") for r in rows], "-o", color=s["color"])
    ttft.set_ylabel("TTFT (ms)")
    ttft.set_yscale("log")
    itl.set_ylabel("ITL, inter-token latency (ms)")
    good.set_ylabel("requests/s: goodput (solid), throughput (dotted)")
    tput.set_ylabel("output tokens/s")
    for ax in axes.flat:
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        if log_x:
            ax.set_xscale("log", base=2)
    handles = [Line2D([], [], color=s["color"], lw=3, label=s["name"]) for s in ss if _rows(s, family)]
    handles += [Line2D([], [], color="gray", linestyle=ls, marker=mk, label=f"p{q}")
                for q, (ls, mk) in PERCENTILE_STYLES.items()]  # fmt: skip
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 6), bbox_to_anchor=(0.5, 0.95))
    fig.suptitle(title)
    fig.text(0.01, 0.005, footer, fontsize=6, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 0.91))
    return fig


def probe_figure(ss: list[dict[str, Any]], title: str, footer: str) -> plt.Figure | None:
    if not any(s["probe"] for s in ss):
        return None
    fig, (lat, kv) = plt.subplots(1, 2, figsize=(13, 5.5))
    for s in ss:
        medians: dict[str, dict[float, float]] = {}
        for target, ls in (("decode", "--"), ("router", "-")):
            rows = sorted((r for r in s["probe"] if r["target"] == target), key=lambda r: r["point"]["x"])
            if not rows:
                continue
            x, med, lo, hi = [], [], [], []
            for r in rows:
                t = [1000 * v for v in r["result"].get("ttfts") or []] or [r["result"]["median_ttft_ms"]]
                x.append(r["point"]["x"])
                med.append(statistics.median(t))
                lo.append(med[-1] - min(t))
                hi.append(max(t) - med[-1])
            medians[target] = dict(zip(x, med, strict=True))
            name = s["name"] if target == "router" else s["name"].replace("P/D via router", "colocated on P/D's decode")
            lat.errorbar(x, med, yerr=[lo, hi], linestyle=ls, marker="o", capsize=3, color=s["color"], label=name)
            if target == "router" and "decode" in medians:  # issue #26's figure: P->D over colocated on decode
                for xi, m in medians["router"].items():
                    if medians["decode"].get(xi):
                        lat.annotate(f"{m / medians['decode'][xi]:.2f}x", (xi, m), fontsize=7, color=s["color"],
                                     textcoords="offset points", xytext=(5, 5))  # fmt: skip
            gb = [(r.get("nixl") or {}).get("gbps") for r in rows]
            if target == "router" and any(g is not None for g in gb):
                kv.plot(x, [g if g is not None else float("nan") for g in gb], "-o", color=s["color"], label=s["name"])
                for xi, r in zip(x, rows, strict=True):
                    mb = (r.get("nixl") or {}).get("mb_per_transfer")
                    if mb is not None:
                        kv.annotate(f"{mb:.0f} MB", (xi, (r.get("nixl") or {}).get("gbps") or 0), fontsize=7,
                                    textcoords="offset points", xytext=(4, 4))  # fmt: skip
    lat.set_xlabel("prompt tokens (concurrency 1)")
    lat.set_ylabel("time to first token (ms): median, min-max")
    lat.set_xscale("log", base=2)
    lat.set_yscale("log")
    kv.set_xlabel("prompt tokens")
    kv.set_ylabel("decode's KV transfer rate (GB/s, vllm:nixl_*)")
    kv.set_xscale("log", base=2)
    kv.set_yscale("log")
    for ax in (lat, kv):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.text(0.01, 0.005, footer, fontsize=6, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.06, 1, 0.94))
    return fig


def plot(results: list[tuple[dict[str, Any], str | None]], out_dir: Path, prefix: str = "load") -> list[Path]:
    """Write the PNGs; returns their paths (only families present in the results)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ss = series(results)
    first = results[0][0]
    slo = first.get("slo") or {}
    title = (f"{first.get('cr')} on {first.get('gpu') or '?'} ({first.get('hardware')}), {first.get('date')}; "
             f"goodput SLO: TTFT <= {slo.get('ttft_ms')} ms and TPOT <= {slo.get('tpot_ms')} ms")  # fmt: skip
    footer = "\n".join(f"{i + 1}: {r.get('burst_command') or r.get('command')}" for i, (r, _) in enumerate(results))
    written = []
    figs = [(f, family_figure(ss, f, title, footer)) for f in FAMILIES] + [("probe", probe_figure(ss, title, footer))]
    for name, fig in figs:
        if fig is None:
            continue
        path = out_dir / f"{prefix}-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--prefix", default="load")
    ap.add_argument("--tag", action="append", default=[], metavar="RESULT=TEXT", help="name a file's P/D series")
    args = ap.parse_args(argv)
    tags = dict(t.split("=", 1) for t in args.tag)
    results = [(json.loads(p.read_text()), tags.get(str(p))) for p in args.results]
    for path in plot(results, args.out_dir, args.prefix):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
