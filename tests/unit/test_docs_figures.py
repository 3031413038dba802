"""Every figure-bearing line of README.md and docs/*.md that quotes a measurement links the result file it comes
from (a Markdown link to an existing file under bench/results/), in its own paragraph, list item or table, or in the
lead paragraph of its section (a section that names its sources once). What counts as quoting a measurement: a
ratio (`1.43x`), a latency or rate with its unit (`ms`, `GB/s`, `req/s`, `tok/s`, `nats`), or "N of M" answers,
requests or prompts; a list introduced by a paragraph (no blank line between) shares that paragraph's links. A
figure that is a setting (a default, a threshold, a poll interval) carries SETTING on its line, invisible when
rendered. Code blocks are not read. And no user doc cites this project's issue
numbers: they describe the product, not its tracker (upstream references such as `vllm#49238` are fine)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PENDING: dict[str, str] = {}
"""Docs whose figures another change is reworking: their figure check is expected to fail until then (remove the entry
when the doc passes; pytest reports XPASS)."""
FIGURE_CASES = [pytest.param(d, id=d.name, marks=[pytest.mark.xfail(reason=PENDING[d.name])] if d.name in PENDING
                             else []) for d in DOCS]  # fmt: skip
FIGURE = re.compile(
    r"\d(?:\.\d+)?x\b"  # a ratio
    r"|\d(?:[\d,]*\d)?(?:\.\d+)? ?(?:ms|GB/s|MB/s|req/s|tok/s|tokens/s|nats)\b"  # a latency, rate or gap
    r"|\b\d[\d,]* of \d[\d,]* (?:answers|requests|prompts)\b",
    re.IGNORECASE,
)
SETTING = "<!-- setting, not a measurement -->"
RESULT_LINK = re.compile(r"\]\(([^)\s]*bench/results/[^)\s]+\.json)\)")
OWN_ISSUE = re.compile(r"(?<![\w/#.-])(?<!PR )#\d+\b")
"""A bare `#N`: this project's tracker. Upstream references name their project (`vllm#49238`, `router#279`, "PR #2208"
of a named repository)."""


@dataclass
class Block:
    """A paragraph, list item or table (with the paragraph right above it), and the section it is in."""

    section: int
    lines: list[tuple[int, str]]
    intro: Block | None = None

    def links(self, doc: Path) -> list[str]:
        own = [m for _, text in self.lines for m in RESULT_LINK.findall(text) if (doc.parent / m).resolve().is_file()]
        return own or (self.intro.links(doc) if self.intro is not None else [])


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    section, fenced, state = 0, False, ""  # state: what the block being read is ("" after a blank line)
    intro: Block | None = None  # the paragraph right above the list being read
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("#") or not line.strip():
            section += line.startswith("#")
            state, intro = "", None
            continue
        kind = "table" if line.startswith("|") else "item" if re.match(r"\s*(?:[-*]|\d+\.) ", line) else "text"
        if kind == "item":
            if state == "text":
                intro = out[-1]
            out.append(Block(section, [], intro))
            state = "item"
        elif not state or (kind == "text" and state == "table") or (kind == "table" and state == "item"):
            out.append(Block(section, []))
            state = kind
        elif kind == "table":
            state = "table"  # a table goes with the paragraph that introduces it
        out[-1].lines.append((n, line))
    return out


def unlinked_figures(doc: Path) -> list[str]:
    bs = blocks(doc.read_text())
    lead: dict[int, Block] = {}
    for b in bs:
        lead.setdefault(b.section, b)
    out = []
    for b in bs:
        if b.links(doc) or lead[b.section].links(doc):
            continue
        out += [f"{doc.name}:{n}: {text.strip()[:100]}" for n, text in b.lines
                if FIGURE.search(text) and SETTING not in text]  # fmt: skip
    return out


def own_issue_numbers(doc: Path) -> list[str]:
    out = []
    fenced = False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        fenced ^= line.startswith("```")
        if not fenced and not line.startswith("```") and OWN_ISSUE.search(line):
            out.append(f"{doc.name}:{n}: {line.strip()[:100]}")
    return out


@pytest.mark.parametrize("doc", FIGURE_CASES)
def test_every_quoted_measurement_links_its_result_file(doc: Path) -> None:
    assert unlinked_figures(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_user_docs_cite_no_issue_numbers_of_this_project(doc: Path) -> None:
    assert own_issue_numbers(doc) == []


def test_the_check_finds_an_unlinked_figure_and_accepts_a_linked_one(tmp_path: Path) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "r.json").write_text("{}")
    docs = tmp_path / "docs"
    docs.mkdir()
    doc = docs / "d.md"
    doc.write_text(
        "# A\n\nP->D took 1.43x colocated.\n\n"
        "# B\n\nFrom [the run](../bench/results/r.json):\n\n- TTFT p99 751 ms\n- 3 of 5 requests answered\n\n"
        "# C\n\n- KV at 14 GB/s ([file](../bench/results/missing.json))\n\n```\n# 2.0x in a code block\n```\n"
        f"The floor defaults to 5 GB/s. {SETTING}\n"
        "Issue #26 said so; vllm#49238 and ucx PR #7566 are fine.\n"
    )
    assert [x.split(":")[1] for x in unlinked_figures(doc)] == ["3", "14"]
    assert [x.split(":")[1] for x in own_issue_numbers(doc)] == ["20"]
