"""`python -m hpd_operator <command>`: `render` now; `run` (the kopf operator) plugs in the same way."""

from __future__ import annotations

import argparse
import sys

from hpd_operator import render


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpd-operator", description="hybrid-pd-operator")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    render.add_parser(sub)
    # A subcommand module provides add_parser(sub) that sets `func(ns) -> int` (e.g. run.add_parser for kopf).
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    code: int = ns.func(ns)
    return code


if __name__ == "__main__":
    sys.exit(main())
