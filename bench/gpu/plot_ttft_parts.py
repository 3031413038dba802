"""A PNG of run.py's `ttft-parts` result: where P->D's time to first token goes, one request at a time and with more
in flight.

    python3 bench/gpu/plot_ttft_parts.py RESULT.json --out PNG [--run KEY]

RESULT.json: a bench/results file (result_file.py) or a lane's result.json; the run is the first with `ttft_parts`
(or --run). One panel per level of requests in flight (own y scale: the time grows with the level), a stacked bar per
prompt length: the router path's own components (run.py PARTS_STACK, `parts.stack`: medians over the rounds of the
means of each engine's histograms over each measured request), and beside it colocated on decode at the same level
(its HTTP time), with the excess written above. A last panel: each component's share of P->D's time, every level and
length, so what grows with the load shows as a band that widens. What a reader must not be misled by: a component
below zero (means over different windows can cross) is drawn as zero and listed in the footer with its value; a
level or length the run skipped is labelled so; the footer names the result file, the setup and the sample counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

STACK = ("prefill_queue", "prefill_compute", "descriptor_post", "transfer", "decode_wait", "decode_step",
         "engine_handoff", "router_http")  # fmt: skip
"""run.py's PARTS_STACK (this script imports nothing from run.py: run.py needs hpd_runtime)."""
LABELS = {
    "prefill_queue": "prefill: queue",
    "prefill_compute": "prefill: compute (scheduled to first token)",
    "descriptor_post": "decode: NIXL descriptor post",
    "transfer": "decode: NIXL transfer after the post",
    "decode_wait": "decode: queue outside the transfer",
    "decode_step": "decode: its own first step",
    "engine_handoff": "both engines: API server to scheduler queue and back",
    "router_http": "router, HTTP, API servers' parsing (the rest)",
}
COLORS = {
    "prefill_queue": "#c6dbef",
    "prefill_compute": "#2171b5",
    "descriptor_post": "#fd8d3c",
    "transfer": "#d94801",
    "decode_wait": "#fdd0a2",
    "decode_step": "#238b45",
    "engine_handoff": "#bcbddc",
    "router_http": "#969696",
}
COLOCATED = {"facecolor": "white", "edgecolor": "black", "hatch": "///"}


def pick_run(result: dict[str, Any], key: str | None) -> tuple[str, dict[str, Any]]:
    runs = result.get("runs") or {}
    if key is not None:
        return key, runs[key]
    for k, r in runs.items():
        if r.get("ttft_parts"):
            return k, r
    raise SystemExit("no run with ttft_parts in the result")


def rows(tp: dict[str, Any]) -> dict[int, dict[int, dict[str, Any]]]:
    """level -> length -> row (level 1: the top-level rows of version 1; the others: `under_load`)."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for k, row in tp.items():
        if k.isdigit() and isinstance(row, dict):
            out.setdefault(1, {})[int(k)] = row
    for c, level in (tp.get("under_load") or {}).items():
        for n, row in level.items():
            out.setdefault(int(c), {})[int(n)] = row
    return {c: dict(sorted(v.items())) for c, v in sorted(out.items())}


def samples_of(row: dict[str, Any]) -> str:
    """'n=5' (level 1: rounds), 'n=4 x ~16' under load (rounds x the median window's requests on decode)."""
    router = (row.get("all") or {}).get("router") or []
    win = sorted(r.get("window_requests", {}).get("decode", 0) for r in router)
    n = f"n={len(router)}"
    return f"{n} x ~{win[len(win) // 2]}" if win and win[-1] > 1 else n


def figure(result: dict[str, Any], source: str, run_key: str | None = None) -> tuple[Any, list[str]]:
    """The figure and the footer's list of components drawn as zero."""
    key, run = pick_run(result, run_key)
    table = rows(run["ttft_parts"])
    levels = list(table)
    fig, axes = plt.subplots(1, len(levels) + 1, figsize=(4.2 * (len(levels) + 1) + 1, 6.2), squeeze=False)
    clipped: list[str] = []
    shares: list[tuple[str, dict[str, float]]] = []
    for ax, c in zip(axes[0], levels, strict=False):
        lengths = list(table[c])
        for i, n in enumerate(lengths):
            row = table[c][n]
            parts = row.get("parts") or {}
            stack = parts.get("stack") or {}
            if "skipped" in row or not stack or any(stack.get(s) is None for s in STACK):
                ax.text(i, 0, "skipped" if "skipped" in row else "not measured", rotation=90, ha="center",
                        va="bottom", fontsize=8, color="tab:red")  # fmt: skip
                continue
            bottom = 0.0
            for s in STACK:
                v = float(stack[s])
                if v < 0:
                    clipped.append(f"c={c} {n} tokens {s} {v:.1f} ms")
                    v = 0.0
                ax.bar(i - 0.17, v, 0.32, bottom=bottom, color=COLORS[s], edgecolor="white", linewidth=0.4)
                bottom += v
            total = parts.get("router_total_ms")
            colo = parts.get("colocated_decode_ms")
            if colo is not None:
                ax.bar(i + 0.19, colo, 0.2, linewidth=0.6, **COLOCATED)
            label = f"{total:.0f} ms" if total is not None else ""
            if total is not None and colo is not None:
                label += f"\n{total - colo:+.0f} vs colocated"
            ax.text(i - 0.17, max(bottom, total or 0) * 1.01, label, ha="center", va="bottom", fontsize=7.5)
            shares.append((f"{c}\n{n // 1000}k", {s: max(float(stack[s]), 0.0) / bottom for s in STACK}))
        ax.set_xticks(range(len(lengths)), [f"{n:,}\n{samples_of(table[c][n])}" for n in lengths], fontsize=8)
        ax.set_xlim(-0.6, len(lengths) - 0.4)
        ax.set_xlabel("prompt tokens")
        ax.set_title(f"{c} request{'s' if c > 1 else ''} in flight", fontsize=10)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("time to first token (ms), medians")
    ax = axes[0][-1]
    for i, (_, sh) in enumerate(shares):
        bottom = 0.0
        for s in STACK:
            ax.bar(i, sh[s], 0.75, bottom=bottom, color=COLORS[s], edgecolor="white", linewidth=0.3)
            bottom += sh[s]
    ax.set_xticks(range(len(shares)), [name for name, _ in shares], fontsize=7)
    ax.set_xlabel("in flight / prompt tokens")
    ax.set_ylim(0, 1)
    ax.set_title("share of P->D's time", fontsize=10)
    handles = [Patch(color=COLORS[s], label=LABELS[s]) for s in reversed(STACK)]
    handles.append(Patch(label="colocated on decode, same in flight (right bar)", **COLOCATED))
    fig.legend(handles=handles, loc="upper center", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.995))
    setup = result.get("setup") or {}
    footer = (f"{source} (run {key}): {setup.get('model', '')}; vLLM {setup.get('vllm_version', '?')}, "
              f"{setup.get('mode', '?')} mode, {(setup.get('topology') or {}).get('name', '?')} topology, both roles "
              "on one GPU. P->D through vllm-router, 1-token requests; bars: medians over rounds (n) of each engine's "
              "histogram means over the measured request (under load: over every request finished meanwhile, "
              "x ~ how many, all of its kind).")  # fmt: skip
    if clipped:
        footer += " Drawn as 0 (below zero): " + "; ".join(clipped) + "."
    fig.text(0.01, 0.005, "\n".join(textwrap.wrap(footer, 210)), fontsize=6.5, va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 0.9))
    return fig, clipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("result", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--run", default=None, help="the run's key (default: the first with ttft_parts)")
    a = ap.parse_args(argv)
    fig, _ = figure(json.loads(a.result.read_text()), a.result.name, a.run)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
