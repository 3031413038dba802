"""The shape the code keeps (issue #25): small single-purpose functions in what ships.

No function in operator/ or images/runtime/ is longer than 60 lines, decorators and docstring included (ruff has no
length rule; its C901 bounds the branching, pyproject.toml). The layers and the absence of import circles are
import-linter's contracts (pyproject.toml [tool.importlinter], `lint-imports` in hack/test.sh).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = (REPO / "operator", REPO / "images" / "runtime")
MAX_FUNCTION_LINES = 60


def functions() -> Iterator[tuple[str, int]]:
    """(`path:qualified.name`, lines) of every function and method under ROOTS."""
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            yield from _walk(ast.parse(path.read_text()), f"{path.relative_to(REPO)}:")


def _walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
            yield prefix + child.name, (child.end_lineno or child.lineno) - first + 1
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from _walk(child, f"{prefix}{child.name}.")


def test_no_function_in_what_ships_is_over_60_lines() -> None:
    found = list(functions())
    assert len(found) > 300, "the scan found too few functions: are ROOTS right?"
    long = [f"{name} ({n} lines)" for name, n in found if n > MAX_FUNCTION_LINES]
    assert not long, f"split these into named steps (at most {MAX_FUNCTION_LINES} lines each): {long}"


def test_the_length_rule_counts_decorators_and_nested_functions() -> None:
    src = "@d\ndef outer():\n    def inner():\n        pass\n    return inner\n"
    assert dict(_walk(ast.parse(src), "m:")) == {"m:outer": 5, "m:outer.inner": 2}
