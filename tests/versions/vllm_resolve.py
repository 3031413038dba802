"""Runs INSIDE a vLLM parser venv: how vLLM's own CLI reads each extraArgs case (truth for the vllm_flags mirror).

    <venv>/bin/python tests/versions/vllm_resolve.py cases.json out.json

cases.json: a list of argv lists (the extraArgs, without `vllm serve --model m`). out.json: per case
{"ok": bool, "dests": [dest of every action argparse took, in order], "error": text, "value_errors": [argparse's
message for each value its type or choices refused]}. Values errors do not stop the parse (a spy around argparse's
`_get_values` records the action and the error and goes on), so "ok"/"dests" are about which flag each item names,
and "value_errors" about the values, which the operator checks separately.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "vllm-parser"))
import dump_flags as _dump

SKIP = {"model_tag", "subparser", "port"}


def main() -> int:
    cases: list[list[str]] = json.loads(Path(sys.argv[1]).read_text())
    top, _ = _dump.parsers()
    seen: list[str] = []
    refused: list[str] = []
    real = argparse.ArgumentParser._get_values

    def spy(self: argparse.ArgumentParser, action: argparse.Action, arg_strings: list[str]) -> Any:
        if action.dest not in SKIP:
            seen.append(action.dest)
        try:
            return real(self, action, arg_strings)
        except argparse.ArgumentError as e:
            refused.append(str(e))
            return None

    argparse.ArgumentParser._get_values = spy  # type: ignore[method-assign]
    out = []
    for case in cases:
        seen.clear()
        refused.clear()
        err = io.StringIO()
        ok, msg = True, ""
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                top.parse_args(["serve", "--model", "m", "--port", "8000", *case])  # as in the pod: options first
            except SystemExit as e:
                ok, msg = False, f"exit {e.code}: {err.getvalue().strip().splitlines()[-1:]}"
            except Exception as e:  # vLLM's own rewrite can raise (IndexError on a dangling dotted flag)
                ok, msg = False, f"{type(e).__name__}: {e}"
        out.append({"ok": ok, "dests": list(seen), "error": msg, "value_errors": list(refused)})
    Path(sys.argv[2]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
