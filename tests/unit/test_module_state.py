"""No module of the operator keeps state between calls: the operator's state has one owner, the Controller created in
`run` (hpd_operator.controller), and everything else is passed in. A module-level store (a dict filled by handlers, a
list holding the current settings, a lock guarding a module dict, a `global`) is what this test refuses:

- no `global` statement anywhere in the package;
- no module-level container (a dict, list or set display or comprehension, or dict()/list()/set()/defaultdict()...)
  that code anywhere in the package changes: item assignment or deletion, or a mutating method (append, update, pop,
  setdefault, ...) called on it through its module-level name;
- no module-level lock or instance of the operator's stateful classes (a lock at module level guards module state).

Constant tables (a dict literal nobody writes to) pass. prometheus_client's metrics are process-wide by its design
(its default registry), so module-level metric objects are the one kind of shared object allowed (metrics.py).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "hpd_operator"
CONTAINERS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "bytearray"}
MUTATORS = {
    "append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add", "discard",
    "appendleft", "popleft", "sort", "reverse",
}  # fmt: skip
STATEFUL = {"Lock", "RLock", "Event", "Condition", "Cache", "WorkQueue", "Controller", "Memory", "Discovery"}


def _called(value: ast.expr) -> str | None:
    if not isinstance(value, ast.Call):
        return None
    f = value.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _module_names(tree: ast.Module) -> Iterator[tuple[str, ast.expr, int]]:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    yield t.id, node.value, node.lineno
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node.value, node.lineno


def _is_container(value: ast.expr) -> bool:
    displays = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    return isinstance(value, displays) or _called(value) in CONTAINERS


def _mutated(trees: list[ast.Module]) -> set[str]:
    """Names (bare or as `module.NAME`) whose items are assigned/deleted or on which a mutating method is called."""
    out: set[str] = set()

    def name_of(e: ast.expr) -> str | None:
        return e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else None

    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
                out.add(name_of(node.value) or "")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                out.add(name_of(node.func.value) or "")
    return out


def module_state(sources: dict[str, str]) -> list[str]:
    """What holds state at module level in these sources (path -> text)."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    mutated = _mutated(list(trees.values()))
    found: list[str] = []
    for path, tree in trees.items():
        found += [
            f"{path}:{n.lineno}: global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)
        ]
        for name, value, line in _module_names(tree):
            if _is_container(value) and name in mutated:
                found.append(f"{path}:{line}: {name} is a module-level container that is changed")
            elif _called(value) in STATEFUL:
                found.append(f"{path}:{line}: {name} = {_called(value)}(...) at module level")
    return found


def test_the_operator_keeps_no_module_level_state() -> None:
    sources = {str(p.relative_to(REPO)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    assert len(sources) > 40, "the scan found too few modules: is PACKAGE right?"
    found = module_state(sources)
    assert not found, f"give this state to hpd_operator.controller.Controller (or pass it in): {found}"


def test_the_scan_finds_each_kind_of_module_state() -> None:
    stores = {
        "a.py": "SEEN: dict[str, int] = {}\ndef f(k):\n    SEEN[k] = 1\n",
        "b.py": "_CURRENT = [0]\n",
        "c.py": "from a import b\ndef g():\n    b._CURRENT.append(1)\n",
        "d.py": "import threading\n_LOCK = threading.Lock()\n",
        "e.py": "X = 0\ndef h():\n    global X\n    X = 1\n",
        "f.py": "CACHE = Cache()\n",
        "g.py": "TABLE = {'a': 1}\ndef k():\n    return TABLE['a']\n",  # a constant table: allowed
    }
    found = module_state(stores)
    assert sorted(f.split(":")[0] for f in found) == ["a.py", "b.py", "d.py", "e.py", "f.py"], found
