"""Typed spec errors: each names the field path, the rule and what would be valid.

The operator puts `str(error)` into the `Ready=False, reason=InvalidSpec` condition and an Event; `render`
prints the same text and exits 2.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pydantic


@dataclass(frozen=True)
class SpecViolation:
    field: str
    """Field path, e.g. `spec.decode.tensorParallelSize`."""
    rule: str
    """Short rule id, e.g. `tp-divides`."""
    message: str
    """What is wrong and what would be valid."""

    def __str__(self) -> str:
        return f"{self.field}: {self.message} [{self.rule}]"


class SpecError(ValueError):
    """One or more violations of the spec; `violations` holds them all, in a stable order."""

    def __init__(self, violations: SpecViolation | Sequence[SpecViolation]) -> None:
        vs = (violations,) if isinstance(violations, SpecViolation) else tuple(violations)
        if not vs:
            raise ValueError("SpecError needs at least one violation")
        self.violations: tuple[SpecViolation, ...] = vs
        super().__init__(self.message)

    @classmethod
    def one(cls, field: str, rule: str, message: str) -> SpecError:
        return cls(SpecViolation(field, rule, message))

    @property
    def field(self) -> str:
        return self.violations[0].field

    @property
    def rule(self) -> str:
        return self.violations[0].rule

    @property
    def message(self) -> str:
        if len(self.violations) == 1:
            return str(self.violations[0])
        return f"{len(self.violations)} problems in the spec:\n" + "\n".join(f"- {v}" for v in self.violations)

    @classmethod
    def from_validation_error(cls, err: pydantic.ValidationError, prefix: str = "spec") -> SpecError:
        """Turn pydantic's error into ours, with camelCase field paths (`spec.decode.tensorParallelSize`)."""
        out = []
        for e in err.errors():
            out.append(SpecViolation(_path(prefix, e["loc"]), f"schema:{e['type']}", _pydantic_message(e)))
        return cls(out)


def _path(prefix: str, loc: Iterable[int | str]) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _pydantic_message(e: object) -> str:
    d = e if isinstance(e, dict) else {}
    msg = str(d.get("msg", "invalid"))
    if d.get("type") == "extra_forbidden":
        return "unknown field (check the spelling; fields are camelCase)"
    if d.get("type") == "literal_error":
        return msg.replace("Input should be", "must be one of")
    return msg
