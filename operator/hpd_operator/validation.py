"""Every check of a parsed CR beyond pydantic's field constraints, behind one entry point (pure).

    valid = validate(cr)          # raises SpecError naming every violated field at once; else a Validated
    profile = compute_profile(valid)

The caller runs parse (hpd_operator.api.parse: schema + metadata.name) -> validate -> profile -> build; the
profile only renders what `validate` accepted and resolved. What `validate` checks, in this order:
- the model's numbers against the TP sizes and the vLLM version (operator only: CEL cannot know the model):
  heads and groups a TP size does not divide, and heterogeneous TP that replicates KV heads or Mamba groups, which
  vLLM 0.20 cannot serve and 0.21-0.26 only with spec.blockSize;
- the rule table (hpd_operator.api.rules: the same rules the CRD's CEL runs, TP sizes that divide one another
  among them) on every node of the spec;
- each role's `spec.extraArgs + spec.<role>.extraArgs` resolved with the flag list of spec.vllmVersion
  (hpd_operator.vllm_flags): operator-owned flags in ANY spelling vLLM accepts (abbreviations, `_` for `-`, `--no-`
  forms, `--flag=value`, `--json-flag.key value`), flags that version does not know, ambiguous abbreviations,
  values without a flag or flags without their value, kv_both, speculative decoding with hybrid P/D.
It also says what is accepted but risky (Validated.warnings: status.profile.warnings and a Warning Event): an
image tag naming another release than spec.vllmVersion, an explicit block size where vLLM may raise it.

Every problem is a SpecViolation naming the field (`spec.decode.extraArgs[2]`), raised together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from hpd_operator.api import constants as c
from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec, ModelConfigSpec, PodTemplate, RoleSpec
from hpd_operator.api.rules import Scope, violations
from hpd_operator.errors import SpecError, SpecViolation
from hpd_operator.modelinfo import ModelInfo, model_info
from hpd_operator.versions import (
    BLOCK_SIZE_FIXED_MINOR,
    VersionRow,
    image_version_warning,
    kv_both_since,
    parse_version,
    version_row,
)
from hpd_operator.vllm_flags import FlagTable, Item, available_versions, flag_table, resolve, value_errors
from hpd_runtime import contract

REGENERATE = "python -m hpd_devcluster.vllm_flags --version {v}"
"""The command that writes a flag list (dev only: the generator needs vLLM's parser venv, hack/vllm-parser-env.sh)."""


@dataclass(frozen=True)
class Validated:
    """A CR that passed every check, with what the checks resolved: the profile renders from this alone."""

    cr: HybridPDDeployment
    row: VersionRow
    """The version table's rules for spec.vllmVersion."""
    model: ModelInfo
    warnings: tuple[str, ...] = ()
    """Accepted but risky settings: shown in the Ready condition's message and posted once as a Warning Event."""

    @property
    def spec(self) -> HybridPDDeploymentSpec:
        return self.cr.spec


def validate(cr: HybridPDDeployment) -> Validated:
    """Every check of `cr`'s spec, once; raises SpecError with all violations in a stable order."""
    spec = cr.spec
    row = version_row(spec.vllm_version)
    model = model_info(spec)
    problems = check_model(spec, row, model) + check_parallelism(spec, row, model) + check_spec(spec)
    problems += check_extra_args(spec, hybrid=model.hybrid)
    if problems:
        raise SpecError(problems)
    return Validated(cr=cr, row=row, model=model, warnings=spec_warnings(spec, row, hybrid=model.hybrid))


# ---------------------------------------------------------------------------------------------------------------
# The model's numbers against TP and the vLLM version
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _TpRule:
    rule: str
    number: Callable[[ModelConfigSpec], int | None]
    ok: Callable[[int, int], bool]
    """(the config number, the TP size) -> whether vLLM can split it."""
    text: str


_TP_RULES: Final = (
    _TpRule(
        rule="attention-heads-divisible",
        number=lambda m: m.num_attention_heads,
        ok=lambda n, t: n % t == 0,
        text="num_attention_heads {n} is not divisible by TP {t}",
    ),
    _TpRule(
        rule="kv-heads-divisible",
        number=lambda m: m.num_key_value_heads,
        ok=lambda n, t: n % t == 0 or t % n == 0,
        text="num_key_value_heads {n} and TP {t}: one must divide the other",
    ),
    _TpRule(
        rule="mamba-heads-divisible",
        number=lambda m: m.mamba_num_heads,
        ok=lambda n, t: n % t == 0,
        text="mamba_num_heads {n} is not divisible by TP {t}",
    ),
    _TpRule(
        rule="mamba-groups-divisible",
        number=lambda m: m.mamba_n_groups,
        ok=lambda n, t: n % t == 0 or n == 1,
        text="n_groups {n} is not divisible by TP {t} (and is not 1)",
    ),
    _TpRule(
        rule="hidden-size-divisible",
        number=lambda m: m.hidden_size,
        ok=lambda n, t: n % t == 0,
        text="hidden_size {n} is not divisible by TP {t}",
    ),
)
_TP_SIZES: Final = (1, 2, 4, 8, 16, 32, 64)
"""The TP sizes suggested in messages."""


def check_model(spec: HybridPDDeploymentSpec, row: VersionRow, model: ModelInfo) -> list[SpecViolation]:
    """Heterogeneous TP on this version, then each role's TP against the heads and groups (nothing without the
    model's numbers). TP sizes that do not divide one another are the rule table's (tp-divides)."""
    if model.config is None:
        return []
    out = _check_hetero_tp(spec, row, model, model.config)
    for role in contract.ROLES:
        tp, field = spec.role(role).tensor_parallel_size, f"spec.{role}.tensorParallelSize"
        out += _check_role_tp(tp, field, model.config, model.config_source)
    return out


def _check_hetero_tp(
    spec: HybridPDDeploymentSpec, row: VersionRow, model: ModelInfo, cfg: ModelConfigSpec
) -> list[SpecViolation]:
    """Different TP sizes whose larger one replicates KV heads or Mamba groups (hetero TP itself is allowed in
    every version, rule hetero-tp-mamba2)."""
    p, d = spec.prefill.tensor_parallel_size, spec.decode.tensor_parallel_size
    top = max(p, d)
    replicated = [
        f"the {n} {what}"
        for n, what in ((cfg.num_key_value_heads, "KV heads"), (cfg.mamba_n_groups, "Mamba groups"))
        if n is not None and top > n
    ]
    if not (model.hybrid and p != d and replicated):
        return []
    pair = f"prefill TP {p} and decode TP {d}: at TP {top} " + " and ".join(replicated) + f" ({model.config_source})"
    if row.has("replicated-hetero-tp-unservable"):
        return [
            SpecViolation(
                "spec.decode.tensorParallelSize" if d > p else "spec.prefill.tensorParallelSize",
                "replicated-hetero-tp-unservable",
                f"{pair} are replicated, and vLLM {row.minor} cannot serve that pair: without spec.blockSize the roles "
                "derive different block sizes (NIXL refuses), and with one that makes them equal P->D output was NaN "
                f"({row.cite('replicated-hetero-tp-unservable')}); use equal TP sizes, sizes that split the heads, "
                "or vLLM 0.27+",
            )
        ]
    if spec.block_size is None and row.equal_block_size_required:
        return [
            SpecViolation(
                "spec.blockSize",
                "block-size-required-for-replicated-heads",
                f"{pair} are replicated, so vLLM's own attention block size differs between the roles and vLLM "
                f"{row.minor} rejects the pair ({row.cite('equal-block-size')}); set spec.blockSize (a multiple of "
                "16) to at least the larger 'Setting attention block size' value vLLM logs for the two TP sizes, "
                "or use vLLM 0.27+",
            )
        ]
    return []


def _check_role_tp(tp: int, field: str, cfg: ModelConfigSpec, source: str) -> list[SpecViolation]:
    """One role's TP size against every config number vLLM splits across ranks."""
    known = [(r, n) for r in _TP_RULES if (n := r.number(cfg)) is not None]
    valid = ", ".join(str(t) for t in _TP_SIZES if all(r.ok(n, t) for r, n in known))
    return [
        SpecViolation(field, r.rule, r.text.format(n=n, t=tp) + f" ({source}); valid TP sizes: {valid}")
        for r, n in known
        if not r.ok(n, tp)
    ]


# ---------------------------------------------------------------------------------------------------------------
# Pipeline parallelism against the vLLM version and the model (a pipeline-parallel decode is a rule-table row)
# ---------------------------------------------------------------------------------------------------------------
PP_FIELD: Final = "spec.prefill.pipelineParallelSize"


def check_parallelism(spec: HybridPDDeploymentSpec, row: VersionRow, model: ModelInfo) -> list[SpecViolation]:
    """A pipeline-parallel prefill: only where NIXL reads a producer's stages (vLLM 0.27+), and only for models
    without a hybrid KV cache layout (vLLM refuses Mamba/HMA layouts under PP > 1)."""
    pp = spec.prefill.pipeline_parallel_size
    if pp == 1:
        return []
    spread = "use pipelineParallelSize 1 and spread a replica over nodes with tensorParallelSize (gpusPerNode)"
    if not row.has("nixl-pipeline-parallel-prefill"):
        return [
            SpecViolation(
                PP_FIELD,
                "pipeline-parallel-prefill-version",
                f"vLLM {row.minor} moves no KV from a pipeline-parallel prefill over NIXL "
                f"[{row.cite('nixl-no-pipeline-parallel')}]; {spread}, or vLLM 0.27+ for an attention-only model",
            )
        ]
    if model.hybrid:
        return [
            SpecViolation(
                PP_FIELD,
                "pipeline-parallel-hybrid",
                f"vLLM {row.minor} refuses NIXL transfers from a pipeline-parallel replica of a hybrid model (its Mamba "
                f"state and hybrid KV cache layout) [{row.cite('nixl-pipeline-parallel-prefill')}]; {spread}",
            )
        ]
    return []


# ---------------------------------------------------------------------------------------------------------------
# The rule table
# ---------------------------------------------------------------------------------------------------------------
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
        run("autoscaling", rs.autoscaling, f"spec.{role}.autoscaling")
        for i, m in enumerate(rs.autoscaling.metrics if rs.autoscaling is not None else ()):
            run("autoscalingMetric", m, f"spec.{role}.autoscaling.metrics[{i}]")
        _check_pod_template(rs, f"spec.{role}.podTemplate", out)
    run("resources", spec.router.resources, "spec.router.resources")
    run("kvTransfer", spec.kv_transfer, "spec.kvTransfer")
    run("cache", spec.cache, "spec.cache")
    run("ratio", spec.ratio, "spec.ratio")
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


def _index(field: str) -> int:
    return int(field.rsplit("[", 1)[1].rstrip("]")) if "[" in field else -1


def _value_errors(table: FlagTable, item: Item, args: list[str], where: list[tuple[str, int]]) -> list[SpecViolation]:
    """Values argparse would refuse for this option (a type it cannot convert, a value outside its choices): vLLM
    exits 2 at startup and the pod restarts forever, so refuse them here, naming the item."""
    out = []
    for i, canonical, why in value_errors(table, item, args):
        msg = f"{canonical} {why}: vLLM's parser would exit at startup (the pod would restart forever)"
        out.append(SpecViolation(f"{where[i][0]}[{where[i][1]}]", "vllm-arg-value", msg))
    return out


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
        if item.kind == "option" and item.dest is not None and item.dest not in reserved:
            out += _value_errors(table, item, args, where)
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
                    f"kv_consumer; kv_both is deprecated from vLLM {kv_both_since()})",
                )
            )
    return out


# ---------------------------------------------------------------------------------------------------------------
# Accepted, with a warning
# ---------------------------------------------------------------------------------------------------------------
def spec_warnings(spec: HybridPDDeploymentSpec, row: VersionRow, *, hybrid: bool) -> tuple[str, ...]:
    """What is accepted but risky: an image tag naming another vLLM release, a block size vLLM may raise."""
    tag = image_version_warning(spec.image, spec.vllm_version) if spec.image is not None else None
    return ((tag,) if tag else ()) + block_size_warnings(spec, row, hybrid)


def block_size_warnings(spec: HybridPDDeploymentSpec, row: VersionRow, hybrid: bool) -> tuple[str, ...]:
    """A warning when a user block size may be raised by vLLM on a version where that corrupted P->D.

    Whether vLLM raises it depends on the Mamba page size (conv + SSM state bytes per sequence: ssm_state_size,
    mamba_head_dim, conv_kernel, the state dtype) against the attention page per token (head_dim): spec.model.config
    carries none of those numbers, so the operator cannot tell a safe value (>= vLLM's own size, e.g. 528 or 1056
    for the tiny Nemotron-H) from a raised one (128 -> 640); it warns on every explicit value instead, and the
    decode pair check is what refuses Ready when P->D output differs."""
    if spec.block_size is None or not hybrid:
        return ()
    v = parse_version(row.minor)
    if v is not None and (v.major, v.minor) >= BLOCK_SIZE_FIXED_MINOR:
        return ()
    return (
        f"spec.blockSize={spec.block_size}: vLLM {row.minor} raises a block size below the model's Mamba-aligned "
        "size (e.g. 128 -> 640 tokens on a 64-token kernel block), and on vLLM 0.20 that corrupted P->D output "
        "(token 0 repeated); the Mamba page size cannot be computed from spec.model.config, so this value is not "
        "checked here. Remove spec.blockSize unless the TP sizes need it; the decode pair check keeps decode not "
        "Ready if P->D output differs from local",
    )
