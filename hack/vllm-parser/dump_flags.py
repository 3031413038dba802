"""Runs INSIDE a vLLM parser venv (hack/vllm-parser-env.sh): prints every option string of `vllm serve` as JSON.

    <venv>/bin/python hack/vllm-parser/dump_flags.py OUT.json     (vLLM logs to stdout, hence a file)

`python -m hpd_devcluster.vllm_flags` runs it and writes the operator's list from its output.
Builds the parser the way `vllm` itself does (vllm/entrypoints/cli/main.py: a FlexibleArgumentParser with
subparsers, then ServeSubcommand.subparser_init) with the CPU platform forced (no GPU needed,
shared/reference/vllm-argparse-on-cpu.md), and records for each option string its action's dest and nargs, and
where argparse checks the value: its type when plain int/float (or vLLM's `optional_type` of one, which also takes
"" and "None") and its choices.
Stdlib + vLLM only: it must not import hpd_operator (a different interpreter runs it); its folder holds nothing
else, so nothing in it shadows a module vLLM imports.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import sys
from typing import Any


def serve_parser() -> argparse.ArgumentParser:
    return parsers()[1]


def parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(the `vllm` parser, its `serve` subparser)."""
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    try:
        from vllm.entrypoints.cli import serve
    except ImportError:  # the server's own imports (not the parser's) may be missing in a parser-only venv
        try:
            from vllm.entrypoints.openai.cli_args import make_arg_parser
        except ModuleNotFoundError:  # 0.33 moved the serve CLI args
            from vllm.entrypoints.common.cli_args import make_arg_parser
        # What ServeSubcommand.subparser_init does (vllm/entrypoints/cli/serve.py), minus help texts.
        made: argparse.ArgumentParser = make_arg_parser(subparsers.add_parser("serve"))
        return top, made
    (cmd,) = [c for c in serve.cmd_init() if c.name == "serve"]
    parser: argparse.ArgumentParser = cmd.subparser_init(subparsers)
    return top, parser


def nargs_of(action: argparse.Action) -> int | str:
    if action.nargs is None:
        return 1
    if isinstance(action.nargs, int):
        return action.nargs
    return str(action.nargs)


def value_type(action: argparse.Action) -> str | None:
    """`int`, `float`, `int?`/`float?` (vLLM's optional_type: also "" and "None"), or None (not checked)."""
    t = action.type
    if t is int or t is float:
        return t.__name__
    if getattr(t, "__qualname__", "").startswith("optional_type."):
        inner = [c.cell_contents for c in (getattr(t, "__closure__", None) or ())]
        for base in (int, float):
            if base in inner:
                return base.__name__ + "?"
    return None


def describe(action: argparse.Action) -> dict[str, Any]:
    longs = [s for s in action.option_strings if s.startswith("--")]
    out: dict[str, Any] = {
        "dest": action.dest,
        "nargs": nargs_of(action),
        "canonical": (longs or action.option_strings)[0],
    }
    vtype = value_type(action)
    if vtype is not None:
        out["type"] = vtype
    if action.choices is not None and action.nargs != 0:
        out["choices"] = sorted(str(c) for c in action.choices)
    return out


def main() -> int:
    import vllm
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = serve_parser()
    if not parser.allow_abbrev:
        print("vllm serve parser has allow_abbrev=False: the abbreviation mirror would be wrong", file=sys.stderr)
    options: dict[str, dict[str, Any]] = {}
    for string, action in parser._option_string_actions.items():
        options[string] = describe(action)
    rewrite = inspect.getsource(FlexibleArgumentParser.parse_args)
    out = {
        "schema": 1,
        "vllm": vllm.__version__,
        "allow_abbrev": parser.allow_abbrev,
        "negative_number_options": bool(parser._has_negative_number_optionals),
        "rewrite_sha256": hashlib.sha256(rewrite.encode()).hexdigest(),
        "options": dict(sorted(options.items())),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
