"""Which `vllm serve` flag an extraArgs item names, resolved exactly as vLLM's own parser resolves it (pure).

vLLM parses `vllm serve` argv with `FlexibleArgumentParser`, an `argparse.ArgumentParser` that first rewrites the
argv (`_` -> `-` in names, `-O3` -> `--optimization-level 3`, `--json-arg.key value` -> `--json-arg '{"key": ..}'`)
and then lets argparse match options, which accepts ANY unique prefix of a long option (`allow_abbrev=True`):
`--tensor-parallel 2`, `--enable-prefix`, `--no-async`, `--kv-transfer-conf.kv_role x`. A deny-list of exact
spellings (the CRD's CEL rule) cannot see those; this module can, because it knows every option string of the
version (`<minor>.json`, GENERATED from the real parser by `python -m hpd_devcluster.vllm_flags`, dev only).

    table = flag_table("0.20.0")                  # None when no list was generated for that version
    items = resolve(table, ["--tensor_par=2", "--enforce-eager"])
    [i.dest for i in items if i.kind == "option"] # ['tensor_parallel_size', 'enforce_eager']

Mirrored from vLLM 0.20's `FlexibleArgumentParser.parse_args` (vllm/utils/argparse_utils.py) and CPython's
`argparse._parse_optional` / `_get_option_tuples` / `consume_optional`; tests/versions/test_vllm_flags_truth.py
checks the mirror against the real parser, and the generated list records a hash of vLLM's rewrite code so a
version that changes it is noticed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Final, Literal

from hpd_operator.versions import parse_version

SCHEMA_VERSION: Final = 1
ZERO, ONE, OPTIONAL, ANY, AT_LEAST_ONE, REST = 0, 1, "?", "*", "+", "..."
Nargs = int | str

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_UNDERSCORE_SPAN = re.compile(r"(?<=--)[^.]*")


@dataclass(frozen=True)
class Option:
    dest: str
    """argparse `dest` of the action: every spelling of one setting (`--x`, `--no-x`, `-x`) shares it."""
    nargs: Nargs
    """0 (a switch), 1, '?', '*', '+', an int > 1, or '...' (takes the rest)."""
    canonical: str
    """The action's first long option string, for messages (`--tensor-parallel-size` for `-tp`)."""
    value_type: str | None = None
    """How argparse converts the value, where it can fail: `int`, `float`, or `int?`/`float?` (vLLM's
    optional_type, which also takes "" and "None"); None: not checked here."""
    choices: tuple[str, ...] | None = None
    """The values argparse accepts, when the action has choices."""

    def value_error(self, value: str) -> str | None:
        """Why vLLM's parser would refuse `value` for this option (None: it accepts it, as far as is known)."""
        if value == "--":  # argparse drops a `--` from an option's values
            return None
        optional_none = value in ("", "None") and self.choices is not None and "None" in self.choices
        if self.choices is not None and value not in self.choices and not optional_none:
            shown = ", ".join(self.choices[:12]) + (", ..." if len(self.choices) > 12 else "")
            return f"invalid choice {value!r} (choose from {shown})"
        vtype = self.value_type
        if vtype is None or (vtype.endswith("?") and value in ("", "None")):
            return None
        try:
            (int if vtype.rstrip("?") == "int" else float)(value)
        except ValueError:
            return f"invalid {vtype.rstrip('?')} value: {value!r}"
        return None


@dataclass(frozen=True)
class FlagTable:
    """Every option string of one vLLM version's `vllm serve` parser."""

    vllm_version: str
    options: dict[str, Option]
    negative_number_options: bool = False
    """argparse treats `-1` as a value only when no option string looks like a negative number."""

    def canonical(self, dest: str) -> str:
        return next((o.canonical for o in self.options.values() if o.dest == dest), dest)

    def dest_of(self, flag: str) -> str | None:
        o = self.options.get(flag)
        return o.dest if o is not None else None


Kind = Literal["option", "value", "error"]


@dataclass(frozen=True)
class Item:
    """What vLLM makes of one extraArgs item: an option (with the dest it sets), a value, or an error."""

    index: int
    kind: Kind
    text: str
    dest: str | None = None
    option_string: str | None = None
    """The option string argparse settled on (the full name an abbreviation stands for)."""
    message: str = ""
    values: list[int] = field(default_factory=list)
    """Indexes of the items consumed as this option's values."""


# ---------------------------------------------------------------------------------------------------------------
# Loading the generated lists
# ---------------------------------------------------------------------------------------------------------------
def value_errors(table: FlagTable, item: Item, args: list[str]) -> list[tuple[int, str, str]]:
    """(argv index, the option's canonical name, why) for each value of the option `item` that argparse would refuse
    (its type or choices, as far as the list records them; JSON sub-keys `--x.k v` are not checked)."""
    option = table.options.get(item.option_string or "")
    if item.kind != "option" or option is None:
        return []
    name, eq, inline = item.text.partition("=")
    if name.startswith("--") and "." in name:  # vLLM turns `--x.k v` into `--x '{"k": v}'`: never an int or a choice
        checked = option.value_type is not None or option.choices is not None
        return [(item.index, option.canonical, "takes one plain value, not JSON sub-keys")] if checked else []
    values = [(item.index, inline)] if eq else [(i, args[i]) for i in item.values]
    return [(i, option.canonical, why) for i, v in values if (why := option.value_error(v)) is not None]


def minor_of(version: str) -> str:
    """`0.20.0` -> `0.20`, the name of its list (`version` itself when it is no version)."""
    v = parse_version(version, prefix=True)
    return v.series if v is not None else version


def available_versions() -> tuple[str, ...]:
    """The minor versions with a generated list, e.g. ('0.20',)."""
    names = [p.name for p in resources.files(__name__).iterdir() if p.name.endswith(".json")]
    return tuple(sorted((n.removesuffix(".json") for n in names), key=_order))


def _order(series: str) -> tuple[int, int]:
    v = parse_version(series)
    return (v.major, v.minor) if v is not None else (-1, -1)


@cache
def flag_table(version: str) -> FlagTable | None:
    """The list for `version`'s minor (`0.20.0` -> 0.20.json), or None when none was generated."""
    res = resources.files(__name__).joinpath(f"{minor_of(version)}.json")
    if not res.is_file():
        return None
    return table_from_json(json.loads(res.read_text()))


def table_from_json(data: dict[str, Any]) -> FlagTable:
    if data.get("schema") != SCHEMA_VERSION:  # pragma: no cover - a list from a newer generator
        raise ValueError(f"vLLM flag list schema {data.get('schema')!r} != {SCHEMA_VERSION}")
    opts = {
        s: Option(
            dest=o["dest"],
            nargs=o["nargs"],
            canonical=o["canonical"],
            value_type=o.get("type"),
            choices=tuple(o["choices"]) if o.get("choices") is not None else None,
        )
        for s, o in data["options"].items()
    }
    return FlagTable(
        vllm_version=data["vllm"],
        options=opts,
        negative_number_options=bool(data.get("negative_number_options", False)),
    )


# ---------------------------------------------------------------------------------------------------------------
# vLLM's rewrite (FlexibleArgumentParser.parse_args, vLLM 0.20)
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Token:
    text: str
    origin: int
    """Index of the extraArgs item it came from."""


def _rewrite(args: list[str]) -> tuple[list[_Token], list[Item]]:
    """vLLM's argv rewrite: returns the tokens argparse sees (with their source index) and rewrite errors."""
    toks: list[_Token] = []
    errors: list[Item] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            toks.append(_Token("--help", i))
        elif arg.startswith("--"):
            if "=" in arg:
                key, value = arg.split("=", 1)
                toks.append(_Token(_UNDERSCORE_SPAN.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
                                   + "=" + value, i))  # fmt: skip
            else:
                toks.append(_Token(_UNDERSCORE_SPAN.sub(lambda m: m.group(0).replace("_", "-"), arg, count=1), i))
        elif arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            toks += [_Token("--optimization-level", i), _Token(level, i)]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            toks.append(_Token("--optimization-level", i))
        else:
            toks.append(_Token(arg, i))
    # --json-arg.key value / --json-arg.key=value: folded into ONE `--json-arg <json>` per key, appended at the end
    # in first-seen order (vLLM's dict_args); the JSON is a value token like any other.
    out: list[_Token] = []
    dotted: dict[str, int] = {}
    skip: set[int] = set()
    for j, t in enumerate(toks):
        if j in skip:
            continue
        if t.text.startswith("-") and "." in t.text:
            key, sep, _ = t.text.partition("=")
            if sep and "." not in key:
                out.append(t)
                continue
            if not sep:
                if j + 1 >= len(toks):
                    errors.append(Item(t.origin, "error", args[t.origin], message="needs a value (vLLM takes the next "
                                       "item as the value of a dotted option and fails without one)"))  # fmt: skip
                    continue
                skip.add(j + 1)
            dotted.setdefault(key.split(".", 1)[0], t.origin)
            continue
        out.append(t)
    for key, origin in dotted.items():
        out += [_Token(key, origin), _Token("{}", origin)]
    return out, errors


# ---------------------------------------------------------------------------------------------------------------
# argparse's option matching (CPython 3.11/3.12 `_parse_optional`, allow_abbrev=True)
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Match:
    option_string: str | None
    explicit: str | None
    """The text after `=` (or after a one-letter short option), None when there is none."""


def _matches(table: FlagTable, s: str) -> list[_Match]:
    """argparse `_get_option_tuples`."""
    out: list[_Match] = []
    if s.startswith("--"):
        prefix, sep, explicit = s.partition("=")
        for o in table.options:
            if o.startswith(prefix):
                out.append(_Match(o, explicit if sep else None))
    elif s.startswith("-") and len(s) > 1:
        short, short_explicit = s[:2], s[2:]
        for o in table.options:
            if o == short:
                out.append(_Match(o, short_explicit))
            elif o.startswith(s):
                out.append(_Match(o, None))
    return out


def classify(table: FlagTable, s: str) -> _Match | str | None:
    """argparse `_parse_optional`: None = a value (positional); a _Match (option_string None = unknown option);
    a str = argparse's error message (ambiguous abbreviation)."""
    if not s or not s.startswith("-"):
        return None
    if s in table.options:
        return _Match(s, None)
    if len(s) == 1:
        return None
    head, sep, tail = s.partition("=")
    if sep and head in table.options:
        return _Match(head, tail)
    found = _matches(table, s)
    if len(found) > 1:
        return f"ambiguous option: {s} could match " + ", ".join(str(m.option_string) for m in found)
    if len(found) == 1:
        return found[0]
    if _NEGATIVE_NUMBER.match(s) and not table.negative_number_options:
        return None
    if " " in s:
        return None
    return _Match(None, None)


def resolve(table: FlagTable, args: list[str]) -> list[Item]:
    """Every extraArgs item as vLLM reads it: options (with dest), their values, and errors (unknown option,
    ambiguous abbreviation, missing or stray value). Items come back in order of the option they belong to."""
    toks, items = _rewrite(args)
    kinds = [classify(table, t.text) for t in toks]
    j, dashdash = 0, False
    while j < len(toks):
        t, k = toks[j], kinds[j]
        j += 1
        if t.text == "--" and not dashdash:
            # After the operator's own options argparse cannot place a `--` (vLLM exits with 'unrecognized
            # arguments: --'), and every later item becomes a stray value.
            dashdash = True
            items.append(Item(t.origin, "error", args[t.origin], message="a bare `--` (vLLM exits with "
                              "'unrecognized arguments: --')"))  # fmt: skip
            continue
        if dashdash:
            k = None
        if k is None:
            items.append(Item(t.origin, "error", args[t.origin], message="a value without an option before it "
                              "(vLLM exits with 'unrecognized arguments')"))  # fmt: skip
            continue
        if isinstance(k, str) or k.option_string is None:
            msg = k if isinstance(k, str) else f"vLLM {table.vllm_version} has no such option"
            items.append(Item(t.origin, "error", args[t.origin], message=msg))
            while j < len(toks) and kinds[j] is None and toks[j].text != "--":
                j += 1  # its values: one error is enough (vLLM stops at the first)
            continue
        opt = table.options[k.option_string]
        base = Item(t.origin, "option", args[t.origin], dest=opt.dest, option_string=k.option_string)
        n = opt.nargs
        if k.explicit is not None:
            if n == ZERO:
                items.append(_with(base, kind="error", message=f"{k.option_string} takes no value"))
            else:
                items.append(base)
            continue
        following: list[int] = []
        while j < len(toks) and kinds[j] is None and toks[j].text != "--":
            following.append(j)
            j += 1
        want_min, want_max = _arity(n)
        take = following[:want_max] if want_max is not None else following
        if len(take) < want_min:
            items.append(_with(base, kind="error", message=f"{k.option_string} needs a value"))
        else:
            items.append(_with(base, values=[toks[x].origin for x in take]))
        j -= len(following) - len(take)
    return sorted(items, key=lambda it: it.index)


def _arity(n: Nargs) -> tuple[int, int | None]:
    if isinstance(n, int):
        return n, n
    return {OPTIONAL: (0, 1), ANY: (0, None), AT_LEAST_ONE: (1, None), REST: (0, None)}.get(n, (1, 1))


def _with(item: Item, **kw: Any) -> Item:
    d = {f: getattr(item, f) for f in item.__dataclass_fields__}
    d.update(kw)
    return Item(**d)
