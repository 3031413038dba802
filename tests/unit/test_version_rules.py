"""The version table: every minor 0.20-0.33 by rule, each rule's boundary on both sides, the InvalidSpec for a
version outside the table, and the warning when the image tag names another release."""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic
import pytest

from hpd_operator.api import constants as c
from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec
from hpd_operator.errors import SpecError
from hpd_operator.profile import compute_profile
from hpd_operator.profile_model import Profile
from hpd_operator.validation import validate
from hpd_operator.versions import VERSION_RULES, image_version_warning, version_row

NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"
HMA = "--no-disable-hybrid-kv-cache-manager"
NO_ASYNC = "--no-async-scheduling"


def profile_of(s: HybridPDDeploymentSpec) -> Profile:
    return compute_profile(validate(HybridPDDeployment(spec=s)))


def profile(version: str, **kw: Any) -> Profile:
    return profile_of(HybridPDDeploymentSpec.model_validate({"model": {"name": NANO}, "vllmVersion": version, **kw}))


def rule_keys(p: Profile) -> set[str]:
    return {r.rule for r in p.rules}


# --- the table itself ---------------------------------------------------------------------------------------------
def test_every_minor_from_0_20_to_0_33_has_a_row() -> None:
    assert (c.VLLM_MINORS[0], c.VLLM_MINORS[-1]) == (20, 33)
    for minor in c.VLLM_MINORS:
        row = version_row(f"0.{minor}.0")
        assert row.minor == f"0.{minor}" and row.rules


def test_every_rule_cites_an_upstream_number_and_stays_in_range() -> None:
    for r in VERSION_RULES:
        assert re.search(r"#\d{4,}", r.upstream), r.key
        assert c.VLLM_MINORS[0] <= r.first <= r.last <= c.VLLM_MINORS[-1], r.key
    assert len({r.key for r in VERSION_RULES}) == len(VERSION_RULES)


@pytest.mark.parametrize(
    ("alternatives"),
    [
        ("hybrid-kv-cache-manager-flag", None),
        ("no-async-scheduling", None),
        ("equal-block-size", "hetero-block-size"),
        ("no-builtin-ssd-warmup", "builtin-ssd-warmup"),
        ("replaced-prefill-never-released", "replaced-prefill-ttl", "replaced-prefill-released"),
        ("nixl-abort-timeout", "nixl-kv-lease"),
    ],
)
def test_complementary_rules_cover_every_minor_exactly_once(alternatives: tuple[str | None, ...]) -> None:
    """Where a topic has an answer for every version, exactly one rule of the topic applies to each minor."""
    for minor in c.VLLM_MINORS:
        row = version_row(f"0.{minor}")
        hits = [k for k in alternatives if k is not None and row.has(k)]
        assert len(hits) <= 1, (minor, hits)
        if None not in alternatives:
            assert len(hits) == 1, (minor, alternatives)


@pytest.mark.parametrize(
    ("version", "minor"), [("0.20.0", "0.20"), ("0.20.2", "0.20"), ("0.33", "0.33"), ("0.25.1", "0.25")]
)
def test_patch_versions_map_to_their_minor(version: str, minor: str) -> None:
    assert version_row(version).minor == minor
    assert profile(version).row == minor


def test_ds_layout_on_both_roles_in_every_version() -> None:
    for minor in (20, 26, 27, 33):
        p = profile(f"0.{minor}.0")
        for rp in (p.prefill, p.decode):
            assert {"name": "VLLM_SSM_CONV_STATE_LAYOUT", "value": "DS"} in rp.env_k8s()
        assert "ds-conv-state-layout" in rule_keys(p)


# --- boundaries ---------------------------------------------------------------------------------------------------
def test_hma_flag_through_0_21_not_from_0_22() -> None:
    for version, want in (("0.20.0", True), ("0.21.0", True), ("0.22.0", False), ("0.33.0", False)):
        p = profile(version)
        assert (HMA in p.prefill.args, HMA in p.decode.args) == (want, want), version
        assert ("hybrid-kv-cache-manager-flag" in rule_keys(p)) is want
    reason = next(i.reason for i in profile("0.21.0").decode.injections if i.setting == HMA)
    assert "rule hybrid-kv-cache-manager-flag (vLLM 0.20-0.21" in reason


def test_builtin_ssd_warmup_from_0_22() -> None:
    assert rule_keys(profile("0.21.0")) >= {"no-builtin-ssd-warmup"}
    assert "builtin-ssd-warmup" not in rule_keys(profile("0.21.0"))
    assert rule_keys(profile("0.22.0")) >= {"builtin-ssd-warmup"}
    assert "no-builtin-ssd-warmup" not in rule_keys(profile("0.22.0"))
    chunk = next(i.reason for i in profile("0.22.0").prefill.injections if i.setting == "HPD_SSD_CHUNK_SIZE")
    assert "#39822" in chunk and "seqlen = chunk_size" in chunk


def test_side_channel_host_compile_key_note_through_0_21() -> None:
    def host_reason(v: str) -> str:
        return next(i.reason for i in profile(v).prefill.injections if i.setting == "VLLM_NIXL_SIDE_CHANNEL_HOST")

    assert "compile-cache key" in host_reason("0.21.0")
    assert "compile-cache key" not in host_reason("0.22.0")


def test_kv_both_warning_from_0_23() -> None:
    def kv_reason(v: str) -> str:
        return next(i.reason for i in profile(v).decode.injections if i.setting == "--kv-transfer-config")

    assert "kv-both-deprecated" not in rule_keys(profile("0.22.1"))
    assert "deprecated" not in kv_reason("0.22.1")
    assert "kv-both-deprecated" in rule_keys(profile("0.23.0"))
    assert "#43874" in kv_reason("0.23.0")
    for v in ("0.22.1", "0.23.0", "0.33.0"):  # never emitted
        assert "kv_both" not in " ".join(profile(v).prefill.args + profile(v).decode.args)


def test_kv_both_in_extra_args_is_rejected_naming_0_23() -> None:
    with pytest.raises(SpecError) as ei:
        profile("0.33.0", decode={"extraArgs": ["--kv-transfer-config.kv_role", "kv_both"]})
    assert "deprecated from vLLM 0.23" in ei.value.message


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(1, 1), (2, 2), (2, 1)])
def test_no_async_scheduling_through_0_25_not_from_0_26(prefill_tp: int, decode_tp: int) -> None:
    kw = {"prefill": {"tensorParallelSize": prefill_tp}, "decode": {"tensorParallelSize": decode_tp}}
    old, new = profile("0.25.1", **kw), profile("0.26.0", **kw)
    assert NO_ASYNC in old.decode.args
    assert (NO_ASYNC in old.prefill.args) is (prefill_tp > 1)  # #36687: prefill too when its TP > 1
    assert NO_ASYNC not in new.decode.args and NO_ASYNC not in new.prefill.args
    assert "no-async-scheduling" in rule_keys(old) and "no-async-scheduling" not in rule_keys(new)
    reason = next(i.reason for i in old.decode.injections if i.setting == NO_ASYNC)
    assert "#45357" in reason and "#48481" in reason


def _hetero(version: str, **kw: Any) -> Profile:
    """Prefill TP 4 replicates Nano's 2 KV heads; decode TP 2 does not."""
    return profile(version, prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 2}, **kw)


def test_equal_block_size_required_through_0_26_lifted_in_0_27() -> None:
    with pytest.raises(SpecError) as ei:
        _hetero("0.26.0")
    assert ei.value.rule == "block-size-required-for-replicated-heads"
    assert "rule equal-block-size" in ei.value.message and "#49612" in ei.value.message
    assert "equal-block-size" in rule_keys(_hetero("0.26.0", blockSize=4096))
    p = _hetero("0.27.0")  # #49612: vLLM pairs different block sizes itself
    assert "--block-size" not in p.prefill.args and "--block-size" not in p.decode.args
    assert "hetero-block-size" in rule_keys(p) and "equal-block-size" not in rule_keys(p)


def test_replaced_prefill_release_note_per_version() -> None:
    notes = {v: {r.rule: r for r in profile(v).rules} for v in ("0.20.0", "0.24.0", "0.25.1", "0.32.0", "0.33.0")}
    assert "replaced-prefill-never-released" in notes["0.20.0"] and "replaced-prefill-never-released" in notes["0.24.0"]
    assert "replaced-prefill-ttl" in notes["0.25.1"] and "replaced-prefill-ttl" in notes["0.32.0"]
    assert "1 h" in notes["0.25.1"]["replaced-prefill-ttl"].note
    assert "replaced-prefill-released" in notes["0.33.0"] and "replaced-prefill-ttl" not in notes["0.33.0"]
    assert "pull" in notes["0.33.0"]["replaced-prefill-released"].note
    assert all("#49238" in n[k].upstream for n in notes.values() for k in n if k.startswith("replaced-prefill"))


def test_0_27_is_the_first_without_hybrid_caveats() -> None:
    assert "hybrid-pd-fixes-complete" not in rule_keys(profile("0.26.0"))
    p = profile("0.27.0")
    assert "hybrid-pd-fixes-complete" in rule_keys(p)
    assert HMA not in p.decode.args and NO_ASYNC not in p.decode.args


def test_status_lists_the_rules_that_applied_with_their_upstream_numbers() -> None:
    st = profile("0.25.1").status()
    rules = {r["rule"]: r for r in st["rules"]}  # type: ignore[attr-defined]
    assert rules["no-async-scheduling"]["versions"] == "0.20-0.25"
    assert "#48481" in rules["no-async-scheduling"]["upstream"]
    assert "hybrid-kv-cache-manager-flag" not in rules
    assert st["warnings"] == []


def test_attention_only_models_get_only_the_rules_that_are_not_hybrid_specific() -> None:
    p = profile_of(
        HybridPDDeploymentSpec.model_validate({"model": {"name": "x/llama", "hybrid": "none"}, "vllmVersion": "0.20.0"})
    )
    assert "ds-conv-state-layout" not in rule_keys(p) and "no-async-scheduling" not in rule_keys(p)
    assert "side-channel-host-in-compile-key" in rule_keys(p)


# --- outside the table --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.19.0", "0.34.0", "1.0.0", "0.3.0", "latest", "0.20.0rc1"])
def test_version_outside_the_table_is_rejected_naming_the_range(version: str) -> None:
    with pytest.raises(pydantic.ValidationError) as ei:
        HybridPDDeploymentSpec.model_validate({"model": {"name": NANO}, "vllmVersion": version})
    assert ei.value.errors()[0]["loc"] == ("vllmVersion",)
    assert "from 0.20 to 0.33" in str(ei.value)
    err = SpecError.from_validation_error(ei.value)
    assert err.field == "spec.vllmVersion"


@pytest.mark.parametrize("version", ["0.19.0", "0.34", "1.20.0"])
def test_the_table_rejects_a_version_outside_it_naming_the_field(version: str) -> None:
    with pytest.raises(SpecError) as ei:
        version_row(version)
    assert ei.value.field == "spec.vllmVersion" and ei.value.rule == "supported-vllm-version"
    assert "0.20 to 0.33" in ei.value.message


def test_crd_rule_for_vllm_version_is_the_same_regex() -> None:
    field = HybridPDDeploymentSpec.model_json_schema(by_alias=True)["properties"]["vllmVersion"]
    (rule,) = field["x-kubernetes-validations"]
    assert "from 0.20 to 0.33" in rule["message"]
    cel_regex = rule["rule"].split("'")[1].replace("\\\\", "\\")
    assert cel_regex == c.vllm_version_regex()
    for v in ("0.20.0", "0.27", "0.33.1"):
        assert re.fullmatch(cel_regex, v)
    for v in ("0.19.0", "0.34.0", "0.2.0", "10.20.0"):
        assert not re.fullmatch(cel_regex, v)


# --- image vs version ---------------------------------------------------------------------------------------------
def test_image_defaults_to_our_image_of_the_version() -> None:
    assert HybridPDDeploymentSpec.model_validate({"model": {"name": NANO}}).image == c.DEFAULT_VLLM_IMAGE
    s = HybridPDDeploymentSpec.model_validate({"model": {"name": NANO}, "vllmVersion": "0.33.0"})
    assert s.image == "ghcr.io/hybridpd/vllm-runtime:0.33.0"
    assert profile("0.33.0").warnings == ()


def test_image_tag_contradicting_the_version_is_a_warning_naming_both() -> None:
    p = profile("0.20.0", image="ghcr.io/hybridpd/vllm-runtime:0.25.1")
    (w,) = p.warnings
    assert "0.25.1" in w and "0.20.0" in w and "spec.vllmVersion" in w and "spec.image" in w
    assert p.status()["warnings"] == [w]
    assert HMA in p.decode.args  # not fatal: the flags still follow spec.vllmVersion


@pytest.mark.parametrize(
    ("image", "version", "warns"),
    [
        ("vllm/vllm-openai:v0.25.1", "0.25.1", False),
        ("vllm/vllm-openai:v0.25.1", "0.25", False),
        ("example.com:5000/vllm:0.25.1-cu130", "0.25.1", False),
        ("example.com:5000/vllm:0.25.1-cu130", "0.25.0", True),
        ("registry/vllm:0.33", "0.33.0", False),
        ("registry/vllm:0.33", "0.27.1", True),
        ("registry/vllm:latest", "0.20.0", False),
        ("registry/vllm@sha256:" + "a" * 64, "0.20.0", False),
        ("registry:5000/vllm", "0.20.0", False),
        ("registry/vllm:nightly-2026-11-01", "0.20.0", False),
    ],
)
def test_image_tag_parsing(image: str, version: str, warns: bool) -> None:
    assert (image_version_warning(image, version) is not None) is warns


def test_generated_argv_kv_config_is_the_same_json_on_every_version() -> None:
    for minor in c.VLLM_MINORS:
        args = profile(f"0.{minor}.0").decode.args
        kv = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
