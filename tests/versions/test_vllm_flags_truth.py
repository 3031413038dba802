"""The generated flag lists and the abbreviation mirror against vLLM's OWN parser (the `vllm_parser` tier).

- drift: `python -m hpd_devcluster.vllm_flags --version V --check` regenerates the list from the venv's
  parser and fails when the committed <minor>.json differs.
- truth: ~1500 extraArgs cases (every prefix and spelling of every operator-owned option string, and seeded random
  prefixes, `_` spellings, `=value`, dotted JSON keys, `-O3`, negative numbers, stray values and junk flags) are
  read by the real `vllm serve` parser; for each, the mirror (hpd_operator.vllm_flags.resolve) must agree on
  whether the argv parses and on which settings (argparse dests) it names.
Setup (once, outside the repo): `hack/vllm-parser-env.sh 0.20.0`. Other versions: HPD_VLLM_PARSER_VERSIONS.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest

from hpd_devcluster.vllm_flags import main as generate
from hpd_operator.api import constants as c
from hpd_operator.vllm_flags import FlagTable, flag_table, resolve
from hpd_operator.vllm_flags import value_errors as value_errors_of

HERE = Path(__file__).resolve().parent
RESOLVE = HERE / "vllm_resolve.py"
RESOLUTION_ERRORS = re.compile(
    r"unrecognized arguments|ambiguous option|expected .*argument|ignored explicit|IndexError"
)
TYPED_VALUE_ERRORS = re.compile(r"invalid (int|float) value|invalid choice")
"""argparse's own words for a value its type or choices refuse (what the operator's value check mirrors)."""
VERSIONS = os.environ.get("HPD_VLLM_PARSER_VERSIONS", "0.20.0").split(",")

pytestmark = pytest.mark.vllm_parser


def parser_python(version: str) -> Path:
    from test_vllm_parser_truth import parser_python as venv  # tests/versions is on sys.path (rootdir-relative)

    return venv(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_flag_list_equals_a_regeneration_from_vllms_parser(version: str) -> None:
    py = parser_python(version)
    assert generate(["--version", version, "--python", str(py), "--check"]) == 0, (
        f"the committed flag list of vLLM {version} is stale: run "
        f"`python -m hpd_devcluster.vllm_flags --version {version}`"
    )


def owned_spellings(table: FlagTable) -> list[list[str]]:
    """Every prefix (>= 2 chars after the dashes) of every option string of every operator-owned setting, bare,
    with `=1`, with a separate value, and with `_` for `-`."""
    owned = {table.dest_of(f) for f in c.DENIED_FLAGS} - {None, "help", "config"}
    out: list[list[str]] = []
    for s, o in table.options.items():
        if o.dest not in owned:
            continue
        dashes = len(s) - len(s.lstrip("-"))
        for n in range(dashes + 1, len(s) + 1):
            p = s[:n]
            out += [[p], [p, "1"], [p + "=1"], [p.replace("-", "_").replace("_", "-", dashes), "1"]]
    return out


def random_cases(table: FlagTable, n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    strings = sorted(s for s in table.options if table.options[s].dest not in ("help", "config"))
    values = ["1", "0", "-1", "-0.5", "abc", '{"a":1}', "x y", "", "--", "-", "1k", "true"]
    out: list[list[str]] = []
    for _ in range(n):
        argv: list[str] = []
        for _ in range(rng.randint(1, 4)):
            s = rng.choice(strings)
            r = rng.random()
            if r < 0.5:
                s = s[: rng.randint(2, len(s))]
            elif r < 0.6:
                s = s.replace("-", "_").replace("_", "-", 2)
            elif r < 0.7 and s.startswith("--"):
                s = s + "." + rng.choice(["kv_role", "a.b", "x+"])
            elif r < 0.75:
                s = "--" + "".join(rng.choice("abcdefghij-_") for _ in range(rng.randint(1, 12)))
            elif r < 0.8:
                s = rng.choice(["-O3", "-O", "-O=2", "-Ox", "-t", "-d", "-q", "-h1"])
            if "help" in s.lstrip("-_")[:4] or s in ("--config", "--h", "--he", "--hel"):
                continue
            if rng.random() < 0.3:
                argv.append(f"{s}={rng.choice(values)}")
            else:
                argv.append(s)
                argv += [rng.choice(values) for _ in range(rng.choice([0, 1, 1, 1, 2]))]
        out.append(argv)
    return out


def truth(version: str, cases: list[list[str]], tmp: Path) -> list[dict[str, object]]:
    (tmp / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run(
        [str(parser_python(version)), str(RESOLVE), str(tmp / "cases.json"), str(tmp / "out.json")],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: list[dict[str, object]] = json.loads((tmp / "out.json").read_text())
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_the_mirror_reads_extra_args_exactly_as_vllms_parser_does(version: str, tmp_path: Path) -> None:
    table = flag_table(version)
    assert table is not None, f"no committed flag list for vLLM {version}"
    cases = owned_spellings(table) + random_cases(table, 1200, seed=13)
    real = truth(version, cases, tmp_path)
    wrong, value_errors, typed_caught = [], 0, 0
    for argv, r in zip(cases, real, strict=True):
        items = resolve(table, argv)
        if r["ok"] and not any(i.kind == "error" for i in items):  # the same flags: do the values agree?
            ours = [e for i in items for e in value_errors_of(table, i, argv)]
            theirs = [e for e in r["value_errors"] if TYPED_VALUE_ERRORS.search(str(e))]  # type: ignore[attr-defined]
            if ours and not r["value_errors"]:
                wrong.append(f"{argv}: the value check refuses {ours}; vLLM's parser accepts every value")
            if theirs and not ours:
                wrong.append(f"{argv}: vLLM's parser refuses {theirs}; the value check does not")
            typed_caught += bool(ours and theirs)
        if not r["ok"] and not RESOLUTION_ERRORS.search(str(r["error"])):
            value_errors += 1  # vLLM's own action rejected a value (e.g. JSON of --lora-modules): not about names
            continue
        ok = not any(i.kind == "error" for i in items)
        dests = sorted(i.dest for i in items if i.kind == "option" and i.dest and i.dest != "port")
        if ok != r["ok"] or (ok and dests != sorted(r["dests"])):  # type: ignore[call-overload]
            wrong.append(f"{argv}: mirror ok={ok} {dests}; vLLM ok={r['ok']} {r['dests']} {r['error']}")
    assert not wrong, f"{len(wrong)} of {len(cases)} cases differ:\n" + "\n".join(wrong[:40])
    assert typed_caught > 0, "no case exercised a typed value error: the corpus tests too little"
    assert value_errors < len(cases) // 20, f"{value_errors} cases were value errors: the corpus tests too little"
