"""PNGs of bench/load/run_load.py results: P/D and colocated on the same axes.

    python3 bench/load/plot.py RESULT.json [RESULT.json ...] --out-dir DIR [--prefix NAME] [--tag RESULT.json=TEXT]

One figure per load family in the results (`concurrency`: fixed concurrencies on the mixed prompt lengths; `rate`:
open-loop request rates on them; `length`: fixed prompt lengths at one concurrency), each with four panels: TTFT
p50/p90/p99, ITL p50/p90/p99, goodput at the results' SLO beside request throughput, output token throughput. And
`probe`: time to first token at concurrency 1 against prompt length (median, min-max bars over the answered requests),
P->D through the router (annotated with its ratio over the colocated deployment at the same length, the baseline the
docs quote), colocated on P/D's decode, the colocated deployment, with decode's KV transfer rate and bytes per request.

What a reader must not be misled by: every point says how many requests it counts (n under the x ticks, or beside
the probe's points), a point with failed requests gets a red ring and "k failed", a point its result file marks
invalid is drawn hollow and labelled so, failed requests never enter a latency (vLLM saves them as 0 ms), rates and
throughput axes start at zero, each side keeps one colour in every figure (P/D blue, colocated green, a second P/D
series such as a before-the-fix baseline orange), and the title and footer name each result file and its setup.
A series is one side of one result file, tagged with the file's plan variant (or --tag).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

FAMILIES = {
    "concurrency": ("concurrent requests (max in flight)", False),
    "rate": ("request rate (req/s, Poisson arrivals)", False),
    "length": ("prompt tokens", True),
}
PERCENTILE_STYLES = {"50": ("-", "o"), "90": ("--", "s"), "99": (":", "^")}
SIDE_NAMES = {"pd": "P/D via router", "colocated": "colocated x2, round robin"}
SIDE_COLORS = {"pd": ("tab:blue", "tab:orange", "tab:purple"), "colocated": ("tab:green", "tab:olive", "tab:cyan")}
FAILED = "tab:red"


def series(results: list[tuple[dict[str, Any], str | None]]) -> list[dict[str, Any]]:
    """(result, tag) -> one entry per side: its name, colour (by side, then by order among that side's series),
    sweep rows and probe rows. A run without a result (hung, crashed) is left out here and listed in the footer."""
    out: list[dict[str, Any]] = []
    for result, given in results:
        tag = given if given is not None else result.get("variant")
        for side, rec in result.get("sides", {}).items():
            name = SIDE_NAMES.get(side, side) + (f" [{tag}]" if tag and side == "pd" else "")
            ok = lambda rows: [r for r in rows if r.get("result") and (r.get("status") or {}).get("ok")]  # noqa: E731
            palette = SIDE_COLORS.get(side, ("tab:gray",))
            color = palette[sum(s["side"] == side for s in out) % len(palette)]
            out.append({"name": name, "side": side, "points": ok(rec.get("points", [])),
                        "probe": ok(rec.get("probe", [])), "color": color,
                        "lost": [r["point"]["name"] for r in rec.get("points", []) + rec.get("probe", [])
                                 if r not in ok([r])]})  # fmt: skip
    return out


def counts(row: dict[str, Any]) -> tuple[int, int]:
    """(answered, sent) of one run: its `requests` when the file has them, else vLLM's completed + failed."""
    req = row.get("requests")
    if req:
        return int(req["answered"]), int(req["sent"])
    r = row.get("result") or {}
    return int(r.get("completed") or 0), int(r.get("completed") or 0) + int(r.get("failed") or 0)


def answered_ttfts(result: dict[str, Any]) -> list[float]:
    """The TTFTs (ms) of the requests that were answered: vLLM saves a failed request's TTFT as 0 and its error
    text in `errors` at the same index."""
    ttfts, errors = result.get("ttfts") or [], result.get("errors") or []
    return [1000 * t for i, t in enumerate(ttfts) if not (i < len(errors) and errors[i]) and t > 0]


def mark_failures(ax: plt.Axes, x: list[float], y: list[float | None], rows: list[dict[str, Any]]) -> None:
    """A red ring and "k failed" at each point with failed requests; "invalid" at a point its file marks so."""
    for xi, yi, r in zip(x, y, rows, strict=True):
        if yi is None:
            continue
        answered, sent = counts(r)
        if sent > answered:
            ax.plot([xi], [yi], "o", ms=11, mfc="none", mec=FAILED, mew=1.5)
            seen = getattr(ax, "_hpd_failed", {})  # stack the labels of several series at one x
            ax._hpd_failed = {**seen, xi: seen.get(xi, 0) + 1}  # type: ignore[attr-defined]
            ax.annotate(f"{sent - answered} of {sent} failed", (xi, yi), fontsize=6, color=FAILED,
                        textcoords="offset points", xytext=(8, -10 - 8 * seen.get(xi, 0)))  # fmt: skip
        if r.get("invalid") and xi not in getattr(ax, "_hpd_invalid", set()):  # once per x and panel, at the top
            ax._hpd_invalid = {*getattr(ax, "_hpd_invalid", set()), xi}  # type: ignore[attr-defined]
            ax.annotate("invalid (see file)", (xi, 1.0), xycoords=("data", "axes fraction"), fontsize=6,
                        color=FAILED, ha="right", va="top", textcoords="offset points", xytext=(-4, -2))  # fmt: skip


def margins(
    fig: Any, title: str, footer: str, legend_rows: int = 0, below: float = 0.0
) -> tuple[float, float, float, float]:
    """The axes' rectangle: room for the footer's lines (and `below` inches of legends) below and the title's (and a
    figure legend's) above."""
    inch = fig.get_figheight()
    bottom = (0.15 + below + 0.1 * (footer.count("\n") + 1)) / inch
    top = 1 - (0.15 + 0.22 * (title.count("\n") + 1) + 0.3 * legend_rows) / inch
    return (0, bottom, 1, top)


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
    sent_at: dict[float, set[int]] = {}
    for s in ss:
        rows = _rows(s, family)
        if not rows:
            continue
        x = [r["point"]["x"] for r in rows]
        for r in rows:
            sent_at.setdefault(r["point"]["x"], set()).add(counts(r)[1])
        for q, (ls, mk) in PERCENTILE_STYLES.items():
            for ax, metric in ((ttft, "ttft"), (itl, "itl")):
                y = [r["result"].get(f"p{q}_{metric}_ms") for r in rows]
                ax.plot(x, y, linestyle=ls, marker=mk, color=s["color"])
                hollow = [(xi, yi) for xi, yi, r in zip(x, y, rows, strict=True) if r.get("invalid")]
                if hollow:
                    ax.plot(*zip(*hollow, strict=True), mk, ms=9, mfc="white", mec=s["color"], linestyle="none")
                if q == "99":
                    mark_failures(ax, x, y, rows)
        goodput = [r["result"].get("request_goodput") or 0 for r in rows]
        good.plot(x, goodput, "-o", color=s["color"])
        good.plot(x, [r["result"].get("request_throughput") for r in rows], ":", marker=".", color=s["color"])
        mark_failures(good, x, goodput, rows)
        out_tput = [r["result"].get("output_throughput") for r in rows]
        tput.plot(x, out_tput, "-o", color=s["color"])
        mark_failures(tput, x, out_tput, rows)
    ttft.set_ylabel("TTFT (ms), answered requests")
    ttft.set_yscale("log")
    itl.set_ylabel("ITL, inter-token latency (ms)")
    good.set_ylabel("requests/s: goodput (solid), throughput (dotted)")
    tput.set_ylabel("output tokens/s")
    ticks = sorted(sent_at)
    for ax in axes.flat:
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{x:g}\nn={'/'.join(str(n) for n in sorted(sent_at[x]))}" for x in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
    for ax in (itl, good, tput):  # rates and throughput from zero: a gap is drawn at its true size
        ax.set_ylim(bottom=0)
    handles = [Line2D([], [], color=s["color"], lw=3, label=s["name"]) for s in ss if _rows(s, family)]
    handles += [Line2D([], [], color="gray", linestyle=ls, marker=mk, label=f"p{q}")
                for q, (ls, mk) in PERCENTILE_STYLES.items()]  # fmt: skip
    handles += [Line2D([], [], color=FAILED, marker="o", mfc="none", linestyle="none", label="requests failed")]
    top = 1 - (0.15 + 0.22 * (title.count("\n") + 1)) / fig.get_figheight()
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 6), bbox_to_anchor=(0.5, top))
    fig.suptitle(title)
    fig.text(0.01, 0.005, footer, fontsize=6, family="monospace", va="bottom")
    fig.tight_layout(rect=margins(fig, title, footer, legend_rows=1))
    return fig


def probe_figure(ss: list[dict[str, Any]], title: str, footer: str) -> plt.Figure | None:
    if not any(s["probe"] for s in ss):
        return None
    fig, (lat, kv) = plt.subplots(1, 2, figsize=(13, 7))
    baseline: dict[float, float] = {}  # the colocated deployment's median per length: the docs' baseline
    drawn = []
    for s in ss:
        for target, ls in (("decode", "--"), ("router", "-")):
            rows = sorted((r for r in s["probe"] if r["target"] == target), key=lambda r: r["point"]["x"])
            if not rows:
                continue
            x, med, lo, hi = [], [], [], []
            for r in rows:
                t = answered_ttfts(r["result"]) or [r["result"]["median_ttft_ms"]]
                x.append(r["point"]["x"])
                med.append(statistics.median(t))
                lo.append(med[-1] - min(t))
                hi.append(max(t) - med[-1])
            if s["side"] == "colocated" and target == "router":
                baseline.update(zip(x, med, strict=True))
            name = s["name"] if target == "router" else s["name"].replace("P/D via router", "colocated on P/D's decode")
            sent = sorted({counts(r)[1] for r in rows})
            name += f" (n={'/'.join(map(str, sent))} per length)"
            lat.errorbar(x, med, yerr=[lo, hi], linestyle=ls, marker="o", capsize=3, color=s["color"], label=name)
            mark_failures(lat, x, med, rows)
            if target == "router" and s["side"] == "pd":
                drawn.append((s, dict(zip(x, med, strict=True))))
            gb = [(r.get("nixl") or {}).get("gbps") for r in rows]
            if target == "router" and any(g is not None for g in gb):
                kv.plot(x, [g if g is not None else float("nan") for g in gb], "-o", color=s["color"], label=s["name"])
                for xi, r in zip(x, rows, strict=True):
                    nixl = r.get("nixl") or {}
                    if nixl.get("gbps") is not None:
                        kv.annotate(f"{nixl['gbps']:.2f} GB/s, {nixl.get('mb_per_transfer', 0):.0f} MB",
                                    (xi, nixl["gbps"]), fontsize=7, textcoords="offset points", xytext=(4, 4))  # fmt: skip
    for s, med in drawn:  # P->D over the colocated deployment at the same length (the ratio the docs quote)
        for xi, m in med.items():
            if baseline.get(xi):
                lat.annotate(f"{m / baseline[xi]:.2f}x colocated", (xi, m), fontsize=7, color=s["color"],
                             textcoords="offset points", xytext=(5, 5))  # fmt: skip
    lat.set_xlabel("prompt tokens (concurrency 1)")
    lat.set_ylabel("time to first token (ms): median, min-max of the answered requests")
    lat.set_xscale("log", base=2)
    lat.set_yscale("log")
    kv.set_xlabel("prompt tokens")
    kv.set_ylabel("decode's KV transfer rate (GB/s, vllm:nixl_*)")
    kv.set_xscale("log", base=2)
    kv.set_ylim(bottom=0)
    for ax in (lat, kv):
        ax.grid(True, alpha=0.3)
    handles, labels = lat.get_legend_handles_labels()  # one legend below both panels: no curve is hidden
    foot = (0.15 + 0.1 * (footer.count("\n") + 1)) / fig.get_figheight()
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, foot), ncol=2, fontsize=7)
    kv.text(0.02, 0.55, "colours as in the legend below", transform=kv.transAxes, fontsize=7, color="gray")
    fig.suptitle(title)
    fig.text(0.01, 0.005, footer, fontsize=6, family="monospace", va="bottom")
    fig.tight_layout(rect=margins(fig, title, footer, below=0.2 + 0.17 * -(-len(labels) // 2)))
    return fig


def setup_line(result: dict[str, Any]) -> str:
    """What ran, from the result's `setup` (model, vLLM version, mode, GPUs per role, shared GPU / PID namespace)."""
    s = result.get("setup")
    if not s:
        return f"{result.get('cr')} on {result.get('gpu') or '?'} ({result.get('hardware')}): setup not recorded"
    gpus = ", ".join(f"{role} GPU {'+'.join(map(str, g))}" for role, g in s["gpus_per_role"].items())
    shared = {True: "shared", False: "not shared", None: "not recorded"}
    return (f"{s['model']}; vLLM {s['vllm_version']} {s['mode']} mode; {s['machine']}: {gpus}; "
            f"GPU {shared[s['roles_share_gpu']]}, PID namespace {shared[s['roles_share_pid_namespace']]}")  # fmt: skip


def plot(
    results: list[tuple[dict[str, Any], str | None]],
    out_dir: Path,
    prefix: str = "load",
    names: list[str] | None = None,
) -> list[Path]:
    """Write the PNGs; returns their paths (only families present in the results). `names`: each result's file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ss = series(results)
    first = results[0][0]
    slo = first.get("slo") or {}
    title = (f"{first.get('date')}; goodput SLO: TTFT <= {slo.get('ttft_ms')} ms and TPOT <= {slo.get('tpot_ms')} ms\n"
             + textwrap.fill(setup_line(first), 125))  # fmt: skip
    lines = []
    for i, (r, _) in enumerate(results):
        name = names[i] if names else f"result {i + 1}"
        lines.append(textwrap.fill(f"{i + 1}: {name}: {r.get('burst_command') or r.get('command')}", 230))
        if i and setup_line(r) != setup_line(first):
            lines.append(textwrap.fill(f"   setup: {setup_line(r)}", 230))
    lost = [f"{s['name']}: {', '.join(s['lost'])}" for s in ss if s["lost"]]
    footer = "\n".join(lines + ([f"runs without a result (not drawn): {'; '.join(lost)}"] if lost else []))
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
    for path in plot(results, args.out_dir, args.prefix, names=[str(p) for p in args.results]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
