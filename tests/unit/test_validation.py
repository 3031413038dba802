"""extraArgs as vLLM's parser reads them, per version, and the rule table's Python twins (pure, no cluster).

The flag lists are generated from the real parsers (vllm_flags/<minor>.json); tests/versions/test_vllm_flags_truth.py
checks the resolver against vLLM itself. Here: every spelling of every operator-owned flag is refused, every flag a
version does not know is refused, and the flags users may pass still pass.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpd_operator.api import constants as c
from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec
from hpd_operator.api.parse import parse_cr
from hpd_operator.api.rules import RULES, quantity
from hpd_operator.errors import SpecError
from hpd_operator.profile import compute_profile
from hpd_operator.validation import Validated, check_args, check_spec, reserved_dests, validate
from hpd_operator.vllm_flags import FlagTable, available_versions, flag_table, resolve

NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"
VERSIONS = available_versions()
TABLES = {v: t for v in VERSIONS if (t := flag_table(v)) is not None}


def spec(**kw: Any) -> HybridPDDeploymentSpec:
    return HybridPDDeploymentSpec.model_validate({"model": {"name": NANO}, **kw})


def check(s: HybridPDDeploymentSpec) -> Validated:
    """The operator's one entry point for every check (raises SpecError)."""
    return validate(HybridPDDeployment(spec=s))


def rules_of(err: SpecError) -> set[tuple[str, str]]:
    return {(v.field, v.rule) for v in err.violations}


def test_a_flag_list_exists_for_the_default_version_and_is_the_real_parsers() -> None:
    assert "0.20" in VERSIONS
    t = TABLES["0.20"]
    assert t.vllm_version == "0.20.0"
    assert t.options["-tp"].dest == t.options["--tensor-parallel-size"].dest == "tensor_parallel_size"
    assert t.options["--no-enable-prefix-caching"].dest == "enable_prefix_caching"
    assert t.options["--enforce-eager"].nargs == 0 and t.options["--max-num-seqs"].nargs == 1


# --- the bypasses ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arg", "owned"),
    [
        (["--tensor-parallel", "2"], "--tensor-parallel-size"),
        (["--enable-prefix"], "--enable-prefix-caching"),
        (["--async-sched"], "--async-scheduling"),
        (["--por", "9000"], "--port"),
        (["--served-model", "x"], "--served-model-name"),
        (["--kv-transfer-conf", '{"kv_role":"kv_producer"}'], "--kv-transfer-config"),
        (["--kv-transfer-conf.kv_role", "kv_producer"], "--kv-transfer-config"),
        (["--tensor_par=2"], "--tensor-parallel-size"),
        (["-t", "2"], "-tp"),
        (["--no-enable-prefix"], "--no-enable-prefix-caching"),
        (["--gpu-mem=0.5"], "--gpu-memory-utilization"),
    ],
)
def test_abbreviations_of_owned_flags_are_refused_naming_the_item_and_the_full_flag(arg: list[str], owned: str) -> None:
    with pytest.raises(SpecError) as ei:
        check(spec(decode={"extraArgs": ["--enforce-eager", *arg]}))
    assert ("spec.decode.extraArgs[1]", "operator-owned-flag") in rules_of(ei.value), ei.value.message
    assert owned in ei.value.message


def test_unknown_flag_is_refused_with_the_version_named() -> None:
    with pytest.raises(SpecError) as ei:
        check(spec(extraArgs=["--no-such-flag"]))
    assert rules_of(ei.value) == {("spec.extraArgs[0]", "unknown-vllm-flag")}
    assert "vLLM 0.20.0 has no such option" in ei.value.message


@pytest.mark.parametrize(
    ("args", "field", "text"),
    [
        (["--enforce-eager", "yes"], "spec.extraArgs[1]", "a value without an option"),
        (["--max-num-seqs"], "spec.extraArgs[0]", "needs a value"),
        (["--enforce-eager=1"], "spec.extraArgs[0]", "takes no value"),
        (["--max"], "spec.extraArgs[0]", "ambiguous option"),
        (["--", "--enforce-eager"], "spec.extraArgs[1]", "a value without an option"),
        (["--enforce-eager", "--"], "spec.extraArgs[1]", "a bare `--`"),
        (["--compilation-config.level"], "spec.extraArgs[0]", "needs a value"),
        (["--max-num-seqs", "\N{ROCKET}"], "spec.extraArgs[1]", "--max-num-seqs invalid int value: '\N{ROCKET}'"),
        (["--max_num_seqs=lots"], "spec.extraArgs[0]", "--max-num-seqs invalid int value: 'lots'"),
        (["--kv-cache-dtype", "fp9"], "spec.extraArgs[1]", "--kv-cache-dtype invalid choice 'fp9' (choose from auto,"),
        (["--gpu-mem", "0.9"], "spec.extraArgs[0]", "operator-owned"),
    ],
)
def test_argv_vllm_would_exit_on_is_refused(args: list[str], field: str, text: str) -> None:
    with pytest.raises(SpecError) as ei:
        check(spec(extraArgs=args))
    assert field in {v.field for v in ei.value.violations} and text in ei.value.message, ei.value.message


def test_a_dangling_dotted_flag_in_spec_extra_args_takes_the_roles_first_item() -> None:
    """vLLM sees spec.extraArgs + spec.<role>.extraArgs as one argv."""
    check(spec(extraArgs=["--compilation-config.level"], prefill={"extraArgs": ["3"]},
                         decode={"extraArgs": ["3"]}))  # fmt: skip
    with pytest.raises(SpecError) as ei:
        check(spec(extraArgs=["--compilation-config.level"], prefill={"extraArgs": ["3"]}))
    assert ("spec.extraArgs[0]", "vllm-argv") in rules_of(ei.value)


@pytest.mark.parametrize(
    "args",
    [
        ["--enforce-eager", "--max-num-seqs", "64"],
        ["--max-num-seqs=64", "--max_num_batched_tokens", "8192"],
        ["--compilation-config.cudagraph_mode", "FULL_DECODE_ONLY"],
        ["-O3"],
        ["--enable-chunked-prefill", "--no-enforce-eager"],
        ["--model-impl", "vllm"],
        ["--max-num-seqs", "8", "--seed", "7"],
    ],
)
def test_flags_users_may_pass_still_pass(args: list[str]) -> None:
    p = compute_profile(check(spec(decode={"extraArgs": args})))
    assert list(p.decode.args[-len(args) :]) == args


def test_speculative_flags_only_refused_for_hybrid_models() -> None:
    with pytest.raises(SpecError) as ei:
        check(spec(decode={"extraArgs": ["--speculative-conf", "{}"]}))
    assert ("spec.decode.extraArgs[0]", "no-speculative-decoding") in rules_of(ei.value)
    check(spec(model={"name": "x/y", "hybrid": "none"}, decode={"extraArgs": ["--speculative-conf", "{}"]}))


def test_a_version_without_a_flag_list_cannot_take_extra_args() -> None:
    check(spec(vllmVersion="0.22.0"))  # no extraArgs: nothing to check
    with pytest.raises(SpecError) as ei:
        check(spec(vllmVersion="0.22.0", decode={"extraArgs": ["--enforce-eager"]}))
    assert rules_of(ei.value) == {("spec.decode.extraArgs", "vllm-flag-list-missing")}
    assert "python -m hpd_devcluster.vllm_flags --version 0.22.0" in ei.value.message


# --- every spelling of every owned flag, every version -------------------------------------------------------------
def owned_option_strings(t: FlagTable) -> list[str]:
    dests = reserved_dests(t)
    return sorted(s for s, o in t.options.items() if o.dest in dests)


@pytest.mark.parametrize("version", sorted(TABLES))
def test_every_abbreviation_of_every_owned_flag_is_refused(version: str) -> None:
    """All prefixes (as far as they leave the dashes) of every option string of every operator-owned setting, in
    the four shapes vLLM reads: bare, with a value, `=value`, and with `_` for `-`. None may pass."""
    t = TABLES[version]
    owned = owned_option_strings(t)
    assert len(owned) >= 20
    checked = 0
    for s in owned:
        dashes = len(s) - len(s.lstrip("-"))
        for n in range(dashes + 1, len(s) + 1):
            p = s[:n]
            under = p[:dashes] + p[dashes:].replace("-", "_")
            for argv in ([p], [p, "1"], [p + "=1"], [under, "1"]):
                assert check_args(t, argv, hybrid=True), f"vLLM {version}: {argv} passed"
                checked += 1
            items = resolve(t, [p, "1"])
            if items[0].kind == "option":  # a unique prefix: it must be refused as the owned flag it names
                got = check_args(t, [p, "1"], hybrid=True)
                assert {v.rule for v in got} <= {"operator-owned-flag", "no-speculative-decoding", "vllm-argv"}, got
    assert checked > 1000


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(sorted(TABLES)), name=st.from_regex(r"--[a-z][a-z0-9_-]{0,30}", fullmatch=True))
def test_every_flag_vllm_does_not_know_is_refused(version: str, name: str) -> None:
    t = TABLES[version]
    norm = "--" + name[2:].replace("_", "-")
    known = [s for s in t.options if s.startswith(norm)]
    got = check_args(t, [name, "1"], hybrid=True)
    if not known:
        assert [v.rule for v in got] == ["unknown-vllm-flag"], got
    elif len(known) > 1 and norm not in t.options:
        assert got and got[0].rule == "vllm-argv" and "ambiguous" in got[0].message


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from(sorted(TABLES)), data=st.data())
def test_any_unique_prefix_of_a_free_flag_is_read_as_that_flag(version: str, data: st.DataObject) -> None:
    t = TABLES[version]
    owned = set(reserved_dests(t)) | {"help"}
    free = sorted(s for s, o in t.options.items() if s.startswith("--") and o.dest not in owned)
    s = data.draw(st.sampled_from(free))
    n = data.draw(st.integers(min_value=3, max_value=len(s)))
    p = s[:n]
    matches = {o for o in t.options if o.startswith(p)}
    items = resolve(t, [p + "=1"])
    if p in t.options or len(matches) == 1:
        assert items[0].option_string == (p if p in t.options else s)
    else:
        assert items[0].kind == "error" and "ambiguous" in items[0].message


# --- the rule table's Python twins -------------------------------------------------------------------------------
def cr(name: str, **kw: Any) -> dict[str, Any]:
    return {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment", "metadata": {"name": name},
            "spec": {"model": {"name": NANO}, **kw}}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("a.b", "name-dns-1035"),
        ("1a", "name-dns-1035"),
        ("A", "name-dns-1035"),
        ("a" * 56, "name-dns-1035"),
        ("a-prefill", "name-no-child-suffix"),
        ("x-decode", "name-no-child-suffix"),
        ("x-router", "name-no-child-suffix"),
        ("x-engines", "name-no-child-suffix"),
        ("a-prefill-1a2b3c4d", "name-no-generation-suffix"),
        ("a-decode-00000000", "name-no-generation-suffix"),
    ],
)
def test_cr_names_that_would_make_invalid_or_colliding_children_are_refused(name: str, rule: str) -> None:
    with pytest.raises(SpecError) as ei:
        parse_cr(cr(name))
    assert (".metadata.name".lstrip("."), rule) in {(v.field, v.rule) for v in ei.value.violations}
    assert isinstance(parse_cr(cr("a-prefil")), HybridPDDeployment)
    assert isinstance(parse_cr(cr("a-prefill-v2")), HybridPDDeployment)


@pytest.mark.parametrize(
    ("patch", "field", "rule"),
    [
        ({"kvTransfer": {"sideChannelPort": 8000}}, "spec.kvTransfer.sideChannelPort", "side-channel-port-free"),
        ({"kvTransfer": {"sideChannelPort": 8081}}, "spec.kvTransfer.sideChannelPort", "side-channel-port-free"),
        (
            {"decode": {"tensorParallelSize": 4, "resources": {"limits": {"nvidia.com/gpu": 1}}},
             "prefill": {"tensorParallelSize": 4}, "blockSize": 1024},
            "spec.decode.resources.limits",
            "gpus-cover-tensor-parallel-size",
        ),
        (
            {"prefill": {"resources": {"limits": {"memory": "1Gi"}, "requests": {"memory": "2Gi"}}}},
            "spec.prefill.resources.requests.memory",
            "requests-within-limits",
        ),
        (
            {"model": {"name": NANO, "maxModelLen": 1024}, "warmup": {"promptLengths": [512, 1024]}},
            "spec.warmup.promptLengths[1]",
            "warmup-prompt-shorter-than-max-model-len",
        ),
        (
            {"decode": {"podTemplate": {"spec": {"hostPID": True}}}},
            "spec.decode.podTemplate.spec.hostPID",
            "podTemplate.spec-hostPID-not-allowed",
        ),
        (
            {"decode": {"podTemplate": {"spec": {"containers": [{"name": "vllm", "args": ["x"]}]}}}},
            "spec.decode.podTemplate.spec.containers[0].args",
            "podTemplate.spec.containers[]-args-not-allowed",
        ),
        (
            {"prefill": {"podTemplate": {"spec": {"volumes": [{"name": "r", "hostPath": {"path": "/"}}]}}}},
            "spec.prefill.podTemplate.spec.volumes[0].hostPath",
            "podTemplate.spec.volumes[]-hostPath-not-allowed",
        ),
        (
            {"decode": {"podTemplate": {"spec": {"volumes": [{"name": "e", "emptyDir": {}}, {"name": "t", "projected":
                {"sources": [{"configMap": {"name": "c"}}, {"serviceAccountToken": {"path": "token"}}]}}]}}}},
            "spec.decode.podTemplate.spec.volumes[1].projected.sources[1].serviceAccountToken",
            "podTemplate.spec.volumes[].projected.sources[]-serviceAccountToken-not-allowed",
        ),
        (
            {"decode": {"podTemplate": {"metadata": {"annotations": {
                "container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}}}}},
            "spec.decode.podTemplate.metadata.annotations[container.apparmor.security.beta.kubernetes.io/vllm]",
            "pod-template-no-security-annotations",
        ),
        (
            {"prefill": {"podTemplate": {"spec": {"priorityClassName": "system-node-critical"}}}},
            "spec.prefill.podTemplate.spec.priorityClassName",
            "pod-template-no-system-priority",
        ),
    ],
)  # fmt: skip
def test_rule_twins_name_the_field(patch: dict[str, Any], field: str, rule: str) -> None:
    s = spec(**patch)
    assert (field, rule) in {(v.field, v.rule) for v in check_spec(s)}
    with pytest.raises(SpecError) as ei:
        check(s)
    assert field in ei.value.message


def test_every_rule_has_a_unique_id_and_a_cel_rule_or_a_reason_why_not() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    assert {r.id for r in RULES if r.cel is None} == {
        "gpus-cover-tensor-parallel-size",
        "gpus-cover-pod-share",
        "requests-within-limits",
        "pair-placement-agrees",
    }


@pytest.mark.parametrize(
    ("q", "value"),
    [(4, 4), ("4", 4), ("500m", 0.5), ("64Gi", 64 * 2**30), ("1k", 1000), ("1e3", 1000), ("2E", 2 * 10**18)],
)
def test_quantity(q: int | str, value: float) -> None:
    assert quantity(q) == pytest.approx(value)


@pytest.mark.parametrize("q", ["abc", "-1", "1.5.5", "inf", "NaN", ""])
def test_not_a_quantity(q: str) -> None:
    assert quantity(q) is None


def test_pod_template_merge_keeps_the_operators_container_and_labels() -> None:
    from hpd_operator.builders import build_all

    doc = cr("m", decode={"podTemplate": {
        "metadata": {"labels": {"team": "a"}},
        "spec": {"runtimeClassName": "nvidia", "volumes": [{"name": "extra", "configMap": {"name": "c"}}],
                 "containers": [{"name": "vllm", "volumeMounts": [{"name": "extra", "mountPath": "/extra"}]}]},
    }})  # fmt: skip
    c_ = parse_cr(doc)
    objs = build_all(c_, compute_profile(validate(c_)))
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].startswith("m-decode-"))
    pod = dep["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert pod["runtimeClassName"] == "nvidia" and {"name": "extra", "configMap": {"name": "c"}} in pod["volumes"]
    assert {"name": "extra", "mountPath": "/extra"} in ctr["volumeMounts"]
    assert ctr["command"][:3] == ["python3", "-m", "hpd_runtime"] and ctr["readinessProbe"] and ctr["ports"]
    assert dep["spec"]["template"]["metadata"]["labels"]["team"] == "a"
    assert c.DENIED_FLAGS  # the deny-list stays the one source of reasons


@pytest.mark.parametrize(
    ("pod_template", "field"),
    [
        ({"metadata": {"labels": "oops"}}, "spec.decode.podTemplate.metadata.labels"),
        ({"spec": {"containers": "vllm"}}, "spec.decode.podTemplate.spec.containers"),
        ({"spec": {"hostPID": "yes"}}, "spec.decode.podTemplate.spec.hostPID"),
        ({"spec": {"volumes": [{"name": "v", "nfs": {"server": "x"}}]}}, "spec.decode.podTemplate.spec.volumes.0.nfs"),
    ],
)
def test_a_malformed_pod_template_stored_before_the_schema_is_an_invalid_spec_naming_the_field(
    pod_template: dict[str, Any], field: str
) -> None:
    """An object the apiserver stored under an older, looser CRD reaches the operator as-is: it must become a
    SpecError naming the field (the InvalidSpec condition), never an exception elsewhere."""
    with pytest.raises(SpecError) as ei:
        validate(parse_cr(cr("m", decode={"podTemplate": pod_template})))
    assert any(v.field.replace("[", ".").replace("]", "").startswith(field) for v in ei.value.violations), (
        ei.value.message
    )
