"""The operator's checks of a parsed CR, beyond what pydantic's field constraints already enforce (pure).

- `check_cr(cr)`: the rule table (hpd_operator.api.rules: the same rules the CRD's CEL runs) on every node of the
  CR, then the extraArgs of both roles as vLLM's parser reads them.
- `check_extra_args(spec, hybrid=...)`: each role's `spec.extraArgs + spec.<role>.extraArgs` resolved with the
  flag list of spec.vllmVersion (hpd_operator.vllm_flags): operator-owned flags in ANY spelling vLLM accepts
  (abbreviations, `_` for `-`, `--no-` forms, `--flag=value`, `--json-flag.key value`), flags that version does not
  know, ambiguous abbreviations, and values without a flag or flags without their value.

Every problem is a SpecViolation naming the field (`spec.decode.extraArgs[2]`); the caller raises them together.
"""

from __future__ import annotations

from typing import Any

from hpd_operator.api import constants as c
from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec, PodTemplate, RoleSpec
from hpd_operator.api.rules import Scope, violations
from hpd_operator.errors import SpecViolation
from hpd_operator.vllm_flags import FlagTable, available_versions, flag_table, resolve
from hpd_runtime import contract

REGENERATE = "python -m hpd_operator.vllm_flags.generate --version {v}"


def _kv_both_since() -> str:
    """When vLLM deprecated kv_both, from the version table (one source; imported here: profile imports us)."""
    from hpd_operator.profile import VERSION_RULES

    rule = next(r for r in VERSION_RULES if r.key == "kv-both-deprecated")
    return f"0.{rule.first}, {rule.upstream}"


def check_cr(cr: HybridPDDeployment) -> list[SpecViolation]:
    """The rule table on the whole CR (metadata.name included)."""
    return violations("root", cr, "") + check_spec(cr.spec)


def check_spec(spec: HybridPDDeploymentSpec) -> list[SpecViolation]:
    """The rule table on every node of the spec, in schema order."""
    out: list[SpecViolation] = []

    def run(scope: Scope, obj: Any, path: str) -> None:
        if obj is not None:
            out.extend(violations(scope, obj, path))

    run("spec", spec, "spec")
    run("model", spec.model, "spec.model")
    run("modelSource", spec.model.source, "spec.model.source")
    for role in contract.ROLES:
        rs = spec.role(role)
        run("role", rs, f"spec.{role}")
        run("resources", rs.resources, f"spec.{role}.resources")
        _check_pod_template(rs, f"spec.{role}.podTemplate", out)
    run("resources", spec.router.resources, "spec.router.resources")
    run("kvTransfer", spec.kv_transfer, "spec.kvTransfer")
    run("cache", spec.cache, "spec.cache")
    return out


def _check_pod_template(rs: RoleSpec, path: str, out: list[SpecViolation]) -> None:
    pt: PodTemplate | None = rs.pod_template
    if pt is None:
        return
    if pt.metadata is not None:
        out.extend(violations("podMetadata", pt.metadata, f"{path}.metadata"))
    if pt.spec is None:
        return
    out.extend(violations("podSpec", pt.spec, f"{path}.spec"))
    for i, ct in enumerate(pt.spec.containers or []):
        out.extend(violations("container", ct, f"{path}.spec.containers[{i}]"))
    for i, vol in enumerate(pt.spec.volumes or []):
        out.extend(violations("volume", vol, f"{path}.spec.volumes[{i}]"))
        for j, src in enumerate((vol.projected.sources if vol.projected else None) or []):
            out.extend(violations("projection", src, f"{path}.spec.volumes[{i}].projected.sources[{j}]"))


# ---------------------------------------------------------------------------------------------------------------
# extraArgs
# ---------------------------------------------------------------------------------------------------------------
def check_extra_args(spec: HybridPDDeploymentSpec, *, hybrid: bool) -> list[SpecViolation]:
    """Both roles' extraArgs as vLLM spec.vllmVersion reads them (see the module doc)."""
    fields = [("spec.extraArgs", spec.extra_args)] + [(f"spec.{r}.extraArgs", spec.role(r).extra_args) for r in
                                                      contract.ROLES]  # fmt: skip
    if not any(args for _, args in fields):
        return []
    table = flag_table(spec.vllm_version)
    if table is None:
        have = ", ".join(available_versions()) or "none"
        return [
            SpecViolation(
                field,
                "vllm-flag-list-missing",
                f"this operator has no flag list for vLLM {spec.vllm_version} (it has: {have}), so extraArgs cannot "
                f"be checked; generate one with `{REGENERATE.format(v=spec.vllm_version)}`",
            )
            for field, args in fields
            if args
        ]
    seen: dict[tuple[str, str], SpecViolation] = {}
    for role in contract.ROLES:
        # vLLM sees spec.extraArgs, then the role's: a dangling dotted flag in the first takes the second's first item.
        where = [("spec.extraArgs", i) for i in range(len(spec.extra_args))]
        where += [(f"spec.{role}.extraArgs", i) for i in range(len(spec.role(role).extra_args))]
        for v in check_args(table, spec.extra_args + spec.role(role).extra_args, hybrid=hybrid, where=where):
            seen.setdefault((v.field, v.rule), v)
    return sorted(seen.values(), key=lambda v: (v.field.split("[")[0], _index(v.field), v.rule))


def unique(vs: list[SpecViolation]) -> list[SpecViolation]:
    """The first violation of each (field, rule), in order."""
    seen: dict[tuple[str, str], SpecViolation] = {}
    for v in vs:
        seen.setdefault((v.field, v.rule), v)
    return list(seen.values())


def _index(field: str) -> int:
    return int(field.rsplit("[", 1)[1].rstrip("]")) if "[" in field else -1


def reserved_dests(table: FlagTable) -> dict[str, str]:
    """dest -> why the operator owns it, for every DENIED_FLAGS entry this vLLM version has."""
    out: dict[str, str] = {}
    for flag, why in c.DENIED_FLAGS.items():
        dest = table.dest_of(flag)
        if dest is not None:
            out.setdefault(dest, why)
    return out


def check_args(
    table: FlagTable, args: list[str], *, hybrid: bool, where: list[tuple[str, int]] | None = None
) -> list[SpecViolation]:
    """One argv (as vLLM gets it) against `table`; `where[i]` = (field, index) of args[i] for the messages."""
    where = where if where is not None else [("extraArgs", i) for i in range(len(args))]
    reserved = reserved_dests(table)
    speculative = {table.dest_of(f) for f in c.SPECULATIVE_FLAGS} - {None}
    out: list[SpecViolation] = []
    for item in resolve(table, args):
        field = f"{where[item.index][0]}[{where[item.index][1]}]"
        if item.kind == "error":
            rule = "unknown-vllm-flag" if "has no such option" in item.message else "vllm-argv"
            out.append(SpecViolation(field, rule, f"{item.text!r}: {item.message}"))
            continue
        if item.kind != "option" or item.dest is None or item.dest not in reserved:
            continue
        if item.dest in speculative and not hybrid:
            continue
        rule = "no-speculative-decoding" if item.dest in speculative else "operator-owned-flag"
        spelled = (
            "" if item.text.split("=", 1)[0] == item.option_string else f" (vLLM reads it as {item.option_string})"
        )
        out.append(SpecViolation(field, rule, f"{item.text!r}{spelled} is not allowed here: {reserved[item.dest]}"))
    for i, arg in enumerate(args):
        if "kv_both" in arg:
            out.append(
                SpecViolation(
                    f"{where[i][0]}[{where[i][1]}]",
                    "no-kv-both",
                    "kv_role kv_both is not used for P/D (prefill is kv_producer, decode is "
                    f"kv_consumer; kv_both is deprecated from vLLM {_kv_both_since()})",
                )
            )
    return out
