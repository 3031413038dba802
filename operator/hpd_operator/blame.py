"""Pure: which field of the CR a field of a refused child came from, for the ApplyFailed message.

The apiserver names the child's field (`spec.template.spec.containers[0].env[18].name: Invalid value: ...`); the CR
author wrote `spec.env[0].name`. A child's list items that the CR contributes carry the name the author gave them
(env vars, volumes, volume mounts, image pull secrets ...), so the child's path is walked in the desired manifest to
the deepest named list item, and the CR's spec is searched for the item of that name in a list of the same key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

CHILD_FIELD = re.compile(r"(?<![\w.])((?:spec|metadata)(?:\.[A-Za-z][\w-]*|\[\d+\])+)")
"""A field path as the apiserver writes it in a validation message."""
_TOKEN = re.compile(r"\.([A-Za-z][\w-]*)|\[(\d+)\]")


def _tokens(path: str) -> list[str | int]:
    first, _, rest = path.partition(".")
    out: list[str | int] = [first]
    for key, index in _TOKEN.findall("." + rest if rest else ""):
        out.append(int(index) if index else key)
    return out


def _named_item(desired: Mapping[str, Any], tokens: list[str | int]) -> tuple[str, str, list[str | int]] | None:
    """(list key, item name, the tokens after that item) of the deepest named list item on the path."""
    found = None
    node: Any = desired
    for i, tok in enumerate(tokens):
        if isinstance(tok, int):
            if not isinstance(node, list) or tok >= len(node):
                break
            node = node[tok]
            if isinstance(node, Mapping) and isinstance(node.get("name"), str) and i > 0:
                found = (str(tokens[i - 1]), str(node["name"]), tokens[i + 1 :])
        else:
            if not isinstance(node, Mapping) or tok not in node:
                break
            node = node[tok]
    return found


def _lists(node: Any, path: str) -> Iterator[tuple[str, str, list[Any]]]:
    """(path, key, list) of every list under `node`."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            sub = f"{path}.{k}"
            if isinstance(v, list):
                yield sub, str(k), v
                for i, item in enumerate(v):
                    yield from _lists(item, f"{sub}[{i}]")
            else:
                yield from _lists(v, sub)


def _suffix(tokens: list[str | int]) -> str:
    return "".join(f"[{t}]" if isinstance(t, int) else f".{t}" for t in tokens)


def cr_field(child_path: str, desired: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """The CR field (`spec.env[0].name`) behind `child_path` of the child `desired`, if the CR wrote it."""
    hit = _named_item(desired, _tokens(child_path))
    if hit is None:
        return None
    key, name, rest = hit
    for path, list_key, items in _lists(spec, "spec"):
        if list_key != key:
            continue
        for i, item in enumerate(items):
            if isinstance(item, Mapping) and item.get("name") == name:
                return f"{path}[{i}]{_suffix(rest)}"
    return None


def hint(message: str, desired: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """`message` with the CR's field appended after each child field the CR wrote (`... (spec.env[0].name)`)."""
    fields = []
    for m in CHILD_FIELD.finditer(message):
        f = cr_field(m.group(1), desired, spec)
        if f is not None and f not in fields:
            fields.append(f)
    return message if not fields else f"{message} [the CR's field: {', '.join(fields)}]"
