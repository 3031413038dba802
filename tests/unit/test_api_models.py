"""The typed spec: camelCase, defaults, bounds, unknown fields, the deny-list matcher."""

from __future__ import annotations

import re

import pydantic
import pytest

from hpd_operator.api import constants as c
from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec, HybridPDDeploymentStatus
from hpd_operator.errors import SpecError


def spec(**kw: object) -> HybridPDDeploymentSpec:
    return HybridPDDeploymentSpec.model_validate({"model": {"name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"}, **kw})


def test_defaults_are_what_a_user_expects() -> None:
    s = spec()
    assert s.vllm_version == "0.20.0"
    assert s.image == "ghcr.io/hybridpd/vllm-runtime:0.20.0"
    assert s.block_size is None  # vLLM picks the Mamba-aligned block size (an explicit 128 broke P->D on 0.20)
    assert s.kv_transfer.side_channel_port == 5600
    assert s.kv_transfer.load_failure_policy == "fail"
    assert s.router.replicas == 1
    assert s.router.image == "ghcr.io/hybridpd/vllm-router:0.1.17"
    assert (s.prefill.replicas, s.decode.replicas) == (1, 1)
    assert (s.prefill.tensor_parallel_size, s.decode.tensor_parallel_size) == (1, 1)
    assert s.warmup.enabled and s.warmup.pair_check
    assert s.model.hybrid == "auto" and s.model.dtype == "auto"
    assert s.cache.type == "emptyDir"


def test_camel_case_in_yaml_snake_case_in_python() -> None:
    s = spec(decode={"tensorParallelSize": 4, "extraArgs": ["--enforce-eager"]}, kvTransfer={"sideChannelPort": 6000})
    assert s.decode.tensor_parallel_size == 4
    assert s.decode.extra_args == ["--enforce-eager"]
    dumped = s.model_dump(by_alias=True, exclude_defaults=True)
    assert dumped["decode"]["tensorParallelSize"] == 4
    assert dumped["kvTransfer"]["sideChannelPort"] == 6000


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"decode": {"replicas": -1}}, "spec.decode.replicas"),
        ({"prefill": {"tensorParallelSize": 0}}, "spec.prefill.tensorParallelSize"),
        ({"model": {"name": ""}}, "spec.model.name"),
        ({"kvTransfer": {"sideChannelPort": 80}}, "spec.kvTransfer.sideChannelPort"),
        ({"model": {"name": "m", "dtype": "fp4"}}, "spec.model.dtype"),
        ({"decode": {"tensorParalelSize": 2}}, "spec.decode.tensorParalelSize"),
        ({"vllmVersion": "latest"}, "spec.vllmVersion"),
        ({"gpuMemoryUtilization": 0}, "spec.gpuMemoryUtilization"),
    ],
)
def test_bad_input_names_the_field_path(patch: dict[str, object], loc: str) -> None:
    obj = {"model": {"name": "m"}, **patch}
    with pytest.raises(pydantic.ValidationError) as ei:
        HybridPDDeploymentSpec.model_validate(obj)
    err = SpecError.from_validation_error(ei.value)
    assert loc in [v.field for v in err.violations], err.message


def test_unknown_field_is_rejected_with_a_hint() -> None:
    with pytest.raises(pydantic.ValidationError) as ei:
        HybridPDDeploymentSpec.model_validate({"model": {"name": "m"}, "tensor_parallel": 2})
    assert "unknown field" in SpecError.from_validation_error(ei.value).message


def test_spec_is_frozen() -> None:
    s = spec()
    with pytest.raises(pydantic.ValidationError):
        s.block_size = 64  # type: ignore[misc]


def test_whole_cr_parses_with_status() -> None:
    cr = HybridPDDeployment.model_validate(
        {
            "apiVersion": "hybridpd.io/v1alpha1",
            "kind": "HybridPDDeployment",
            "metadata": {"name": "x", "namespace": "ns", "uid": "u"},
            "spec": {"model": {"name": "m"}},
            "status": {
                "phase": "Ready",
                "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady"}],
                "decode": {"replicas": 1, "readyReplicas": 1, "summary": "1/1", "selector": "a=b"},
            },
        }
    )
    assert cr.metadata.name == "x"
    assert cr.status is not None and cr.status.decode is not None and cr.status.decode.summary == "1/1"


def test_status_dumps_camel_case() -> None:
    st = HybridPDDeploymentStatus.model_validate({"observedGeneration": 3, "endpoint": "http://x:8000"})
    assert st.model_dump(by_alias=True, exclude_none=True)["observedGeneration"] == 3


@pytest.mark.parametrize(
    ("arg", "flag"),
    [
        ("--block-size", "--block-size"),
        ("--block_size=32", "--block-size"),
        ("--kv-transfer-config.kv_role", "--kv-transfer-config"),
        ("-tp", "-tp"),
        ("-tp=2", "-tp"),
        ("--enforce-eager", "--enforce-eager"),
        ("128", None),
        ("-1", None),
        ('{"a":1}', None),
    ],
)
def test_normalize_flag(arg: str, flag: str | None) -> None:
    assert c.normalize_flag(arg) == flag


@pytest.mark.parametrize(
    "arg",
    [
        "--model",
        "--block-size=16",
        "--block_size",
        "--kv-transfer-config.kv_role",
        "-tp",
        "--speculative-config",
        "--disable-log-stats",
        "--enable-prefix-caching",
    ],
)
def test_denied_regex_matches_what_the_profile_denies(arg: str) -> None:
    assert re.match(c.denied_flags_regex(), arg)
    assert c.normalize_flag(arg) in c.DENIED_FLAGS


@pytest.mark.parametrize("arg", ["--enforce-eager", "--model-impl", "--max-num-seqs=64", "128", "--tokenizer-mode"])
def test_denied_regex_lets_other_flags_through(arg: str) -> None:
    assert not re.match(c.denied_flags_regex(), arg)
    assert c.normalize_flag(arg) not in c.DENIED_FLAGS


def test_operator_default_images_fill_only_what_the_cr_leaves_out() -> None:
    from hpd_operator.api.parse import parse_cr

    doc = {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment", "metadata": {"name": "x"}}
    omitted = parse_cr({**doc, "spec": {"model": {"name": "m"}}}, vllm_image="reg/v:1", router_image="reg/r:2")
    assert omitted.spec.image == "reg/v:1" and omitted.spec.router.image == "reg/r:2"
    explicit = parse_cr(
        {**doc, "spec": {"model": {"name": "m"}, "image": "mine/v:3", "router": {"image": "mine/r:4", "replicas": 2}}},
        vllm_image="reg/v:1",
        router_image="reg/r:2",
    )
    assert explicit.spec.image == "mine/v:3" and explicit.spec.router.image == "mine/r:4"
    assert explicit.spec.router.replicas == 2
    router_only = parse_cr({**doc, "spec": {"model": {"name": "m"}, "router": {"replicas": 3}}}, router_image="reg/r:2")
    assert router_only.spec.router.image == "reg/r:2" and router_only.spec.router.replicas == 3
