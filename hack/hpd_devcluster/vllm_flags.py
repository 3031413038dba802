"""Generate the `vllm serve` flag list of one vLLM version FROM vLLM's OWN PARSER, in its parser venv (dev only:
the operator's wheel carries the lists, operator/hpd_operator/vllm_flags/<minor>.json, not this generator).

    python -m hpd_devcluster.vllm_flags --version 0.20.0            # writes operator/hpd_operator/vllm_flags/0.20.json
    python -m hpd_devcluster.vllm_flags --version 0.20.0 --check    # exit 1 when the committed list differs
    python -m hpd_devcluster.vllm_flags --version 0.33.0 --python /path/to/venv/bin/python

The venv is the one hack/vllm-parser-env.sh makes (${HPD_VLLM_PARSER_CACHE:-~/.cache/hybrid-pd}/vllm-parser-<v>);
hack/vllm-parser/dump_flags.py runs inside it and builds the parser exactly as `vllm serve` does. Any version's
venv works: the list is named after the minor version (`0.33.0` -> 0.33.json), which is what spec.vllmVersion
selects.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hpd_operator.vllm_flags import minor_of

REPO = Path(__file__).resolve().parents[2]
LISTS = REPO / "operator" / "hpd_operator" / "vllm_flags"
DUMP = REPO / "hack" / "vllm-parser" / "dump_flags.py"
COMMAND = "python -m hpd_devcluster.vllm_flags"


def venv_python(version: str) -> Path:
    """Where hack/vllm-parser-env.sh puts the venv of `version` (the same lookup as the version truth test)."""
    root = Path(
        os.environ.get("HPD_VLLM_PARSER_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hybrid-pd"
    )
    return root / f"vllm-parser-{version}" / "bin" / "python"


def output_path(version: str) -> Path:
    return LISTS / f"{minor_of(version)}.json"


def render(python: Path) -> str:
    """The list as committed: the dump of the venv's parser, pretty-printed with sorted option strings."""
    if not python.exists():
        raise FileNotFoundError(f"{python} does not exist: run `hack/vllm-parser-env.sh <version>` first")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "flags.json"
        proc = subprocess.run(
            [str(python), str(DUMP), str(out)], capture_output=True, text=True, timeout=900, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{DUMP.name} failed in {python} (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        data = json.loads(out.read_text())
    header = {"_generated": f"by `{COMMAND} --version {data['vllm']}`; do not edit"}
    return json.dumps({**header, **data}, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("--version", required=True, help="vLLM version of the parser venv, e.g. 0.20.0")
    p.add_argument("--python", type=Path, help="the venv's python (default: the hack/vllm-parser-env.sh location)")
    p.add_argument("--check", action="store_true", help="exit 1 when the committed list differs from a regeneration")
    p.add_argument("--output", type=Path, help="default: operator/hpd_operator/vllm_flags/<minor>.json")
    ns = p.parse_args(argv)
    python = ns.python or venv_python(ns.version)
    target = ns.output or output_path(ns.version)
    try:
        text = render(python)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if ns.check:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is stale: run `{COMMAND} --version {ns.version}`", file=sys.stderr)
            return 1
        print(f"{target} is up to date")
        return 0
    target.write_text(text)
    print(f"wrote {target} ({len(json.loads(text)['options'])} option strings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
