"""The hybrid profile: version table rows, env/args per role, and every cross-role rule (fail + pass)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec
from hpd_operator.errors import SpecError
from hpd_operator.modelinfo import KNOWN_MODELS
from hpd_operator.profile import compute_profile
from hpd_operator.profile_model import Profile
from hpd_operator.validation import Validated, validate

NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"


def spec(**kw: Any) -> HybridPDDeploymentSpec:
    obj: dict[str, Any] = {"model": {"name": NANO}}
    for k, v in kw.items():
        obj[k] = {**obj.get(k, {}), **v} if isinstance(v, dict) else v
    return HybridPDDeploymentSpec.model_validate(obj)


def check(s: HybridPDDeploymentSpec) -> Validated:
    """Every check, as the operator runs them before the profile (raises SpecError)."""
    return validate(HybridPDDeployment(spec=s))


def profile_of(s: HybridPDDeploymentSpec) -> Profile:
    return compute_profile(check(s))


def rules(err: SpecError) -> set[tuple[str, str]]:
    return {(v.field, v.rule) for v in err.violations}


def kv_config(args: tuple[str, ...]) -> dict[str, str]:
    return dict(json.loads(args[args.index("--kv-transfer-config") + 1]))


# --- env and args -------------------------------------------------------------------------------------------------
def test_prefill_gets_kv_producer_and_decode_kv_consumer() -> None:
    p = profile_of(spec())
    assert kv_config(p.prefill.args) == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert kv_config(p.decode.args) == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}


def test_load_failure_policy_only_when_not_default() -> None:
    p = profile_of(spec(kvTransfer={"loadFailurePolicy": "recompute"}))
    assert kv_config(p.decode.args)["kv_load_failure_policy"] == "recompute"


def test_side_channel_host_is_the_pod_ip_via_downward_api() -> None:
    env = profile_of(spec(kvTransfer={"sideChannelPort": 6100})).decode.env_k8s()
    names = [e["name"] for e in env]
    assert env[0] == {"name": "HPD_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    host = env[names.index("VLLM_NIXL_SIDE_CHANNEL_HOST")]
    assert host["value"] == "$(HPD_POD_IP)"
    assert names.index("HPD_POD_IP") < names.index("VLLM_NIXL_SIDE_CHANNEL_HOST")
    assert env[names.index("VLLM_NIXL_SIDE_CHANNEL_PORT")]["value"] == "6100"


def test_ds_layout_on_both_roles_for_hybrid_models() -> None:
    p = profile_of(spec())
    for rp in (p.prefill, p.decode):
        assert {"name": "VLLM_SSM_CONV_STATE_LAYOUT", "value": "DS"} in rp.env_k8s()


def test_attention_only_model_gets_no_hybrid_settings() -> None:
    p = profile_of(spec(model={"name": "meta-llama/Llama-3.1-8B", "hybrid": "none"}))
    assert not p.hybrid
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in [e.name for e in p.prefill.env]
    assert "--no-enable-prefix-caching" not in p.decode.args
    assert "--no-async-scheduling" not in p.decode.args


def test_unknown_auto_model_gets_hybrid_settings() -> None:
    p = profile_of(spec(model={"name": "someone/unknown-model"}))
    assert p.hybrid and "unknown" in p.hybrid_reason


def test_seed_args_in_order() -> None:
    s = spec(
        model={"maxModelLen": 8192},
        gpuMemoryUtilization=0.85,
        prefill={"tensorParallelSize": 2},
        decode={"tensorParallelSize": 2},
    )
    args = list(profile_of(s).decode.args)
    assert "--block-size" not in args  # vLLM picks the Mamba-aligned size; the same on both roles (equal TP)
    assert args[:12] == [
        "--model",
        NANO,
        "--served-model-name",
        NANO,
        "--port",
        "8000",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "8192",
        "--dtype",
        "auto",
    ]
    assert args[12:14] == ["--gpu-memory-utilization", "0.85"]
    assert args[-4:] == [
        "--no-enable-prefix-caching",
        "--no-disable-hybrid-kv-cache-manager",
        "--no-async-scheduling",
        "--enable-prompt-tokens-details",
    ]


def test_extra_args_global_then_role() -> None:
    p = profile_of(spec(extraArgs=["--max-num-seqs", "64"], decode={"extraArgs": ["--enforce-eager"]}))
    assert list(p.decode.args[-3:]) == ["--max-num-seqs", "64", "--enforce-eager"]
    assert list(p.prefill.args[-2:]) == ["--max-num-seqs", "64"]


def test_role_gpu_memory_utilization_overrides_global() -> None:
    p = profile_of(spec(gpuMemoryUtilization=0.8, decode={"gpuMemoryUtilization": 0.9}))
    assert p.decode.args[p.decode.args.index("--gpu-memory-utilization") + 1] == "0.9"
    assert p.prefill.args[p.prefill.args.index("--gpu-memory-utilization") + 1] == "0.8"


def test_pvc_source_gives_the_mount_path_as_model_on_both_roles() -> None:
    s = spec(model={"name": "nano", "source": {"pvc": {"claimName": "models", "path": "nano-fp8"}}})
    p = profile_of(s)
    assert p.model == "/models/nano-fp8"
    for rp in (p.prefill, p.decode):
        assert rp.args[:4] == ("--model", "/models/nano-fp8", "--served-model-name", "nano")


def test_chunk_size_from_the_built_in_table_reaches_the_runtime() -> None:
    env = {e.name: e.value for e in profile_of(spec()).prefill.env}
    assert env["HPD_SSD_CHUNK_SIZE"] == "128"
    assert env["HPD_WARMUP_PAIR_CHECK"] == "false"
    assert {e.name: e.value for e in profile_of(spec()).decode.env}["HPD_WARMUP_PAIR_CHECK"] == "true"


def test_user_env_follows_the_operators_settings_and_the_pods_identity_ends_the_env() -> None:
    p = profile_of(spec(env=[{"name": "NCCL_DEBUG", "value": "INFO"}]))
    assert [e.name for e in p.prefill.env[-3:]] == ["NCCL_DEBUG", "HPD_INSTANCE", "HPD_CACHE_DIR"]
    assert [e.name for e in p.decode.env[-3:]] == ["HPD_INSTANCE", "HPD_CACHE_DIR", "HPD_PREFILL_SERVICE"]


def test_the_profile_writes_every_hpd_env_entry_of_the_container() -> None:
    from hpd_operator.builders import build_all

    cr = HybridPDDeployment.model_validate(
        {"metadata": {"name": "m", "namespace": "ns"}, "spec": {"model": {"name": NANO}}}
    )
    p = compute_profile(validate(cr))
    assert {"name": "HPD_PREFILL_SERVICE", "value": "m-prefill.ns.svc"} in p.decode.env_k8s()
    for dep in (o for o in build_all(cr, p) if o["kind"] == "Deployment" and o["metadata"]["name"] != "m-router"):
        env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
        role = dep["metadata"]["labels"]["hybridpd.io/role"]
        gen = dep["metadata"]["labels"]["hybridpd.io/generation"]
        # the one entry the builder rewrites: decode's pair check asks its own generation's prefill Service
        own = {"name": "HPD_PREFILL_SERVICE", "value": f"m-prefill-{gen}.ns.svc"}
        assert [e for e in env if e["name"].startswith("HPD_")] == [
            own if e["name"] == "HPD_PREFILL_SERVICE" else e
            for e in p.role(role).env_k8s()
            if e["name"].startswith("HPD_")
        ]


def test_status_profile_lists_every_injection_with_a_reason() -> None:
    st = profile_of(spec()).status()
    assert st["vllmVersion"] == "0.20.0" and st["versionRow"] == "0.20"
    inj = st["injections"]
    assert isinstance(inj, list) and inj
    assert all(i["reason"] and i["role"] in ("prefill", "decode") for i in inj)


def test_compute_profile_is_pure() -> None:
    s = spec()
    assert profile_of(s) == profile_of(s)


def test_known_models_only_with_found_numbers() -> None:
    assert NANO in KNOWN_MODELS
    assert not any("47B" in k or "56B" in k for k in KNOWN_MODELS)


# --- cross-role rules: one failing and one passing case each -----------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "good", "field", "rule"),
    [
        (
            {"prefill": {"tensorParallelSize": 3}, "decode": {"tensorParallelSize": 2}, "model": {"name": "x/y"}},
            {"prefill": {"tensorParallelSize": 4}, "decode": {"tensorParallelSize": 2}, "model": {"name": "x/y"}},
            "spec.decode.tensorParallelSize",
            "tp-divides",
        ),
        (
            {"model": {"name": "x/y", "config": {"numAttentionHeads": 12}}, "decode": {"tensorParallelSize": 8}},
            {"model": {"name": "x/y", "config": {"numAttentionHeads": 12}}, "decode": {"tensorParallelSize": 4}},
            "spec.decode.tensorParallelSize",
            "attention-heads-divisible",
        ),
        (
            {
                "model": {"name": "x/y", "config": {"numKeyValueHeads": 3}},
                "decode": {"tensorParallelSize": 8},
                "prefill": {"tensorParallelSize": 8},
            },
            {
                "model": {"name": "x/y", "config": {"numKeyValueHeads": 2}},
                "decode": {"tensorParallelSize": 8},
                "prefill": {"tensorParallelSize": 8},
            },
            "spec.decode.tensorParallelSize",
            "kv-heads-divisible",
        ),
        (
            {
                "model": {"name": "x/y", "config": {"mambaNumHeads": 48}},
                "prefill": {"tensorParallelSize": 32},
                "decode": {"tensorParallelSize": 16},
            },
            {
                "model": {"name": "x/y", "config": {"mambaNumHeads": 48}},
                "prefill": {"tensorParallelSize": 8},
                "decode": {"tensorParallelSize": 16},
            },
            "spec.prefill.tensorParallelSize",
            "mamba-heads-divisible",
        ),
        (
            {"model": {"name": "x/y", "config": {"mambaNGroups": 2}}, "decode": {"tensorParallelSize": 4}},
            {
                "model": {"name": "x/y", "config": {"mambaNGroups": 1}},
                "decode": {"tensorParallelSize": 4},
                "blockSize": 1024,
                "vllmVersion": "0.25.1",  # 0.20 refuses replicated hetero TP (replicated-hetero-tp-unservable)
            },
            "spec.decode.tensorParallelSize",
            "mamba-groups-divisible",
        ),
        (
            {"model": {"name": "x/y", "config": {"hiddenSize": 1000}}, "decode": {"tensorParallelSize": 16}},
            {"model": {"name": "x/y", "config": {"hiddenSize": 1000}}, "decode": {"tensorParallelSize": 8}},
            "spec.decode.tensorParallelSize",
            "hidden-size-divisible",
        ),
        ({"blockSize": 136}, {"blockSize": 144}, "spec.blockSize", "block-size-multiple-of-16"),
        (
            {"decode": {"extraArgs": ["--speculative-config", '{"method":"mtp"}']}},
            {"decode": {"extraArgs": ["--max-num-seqs", "8"]}},
            "spec.decode.extraArgs[0]",
            "no-speculative-decoding",
        ),
        (
            {"extraArgs": ["--enable-prefix-caching"]},
            {"extraArgs": ["--enforce-eager"]},
            "spec.extraArgs[0]",
            "operator-owned-flag",
        ),
        (
            {"prefill": {"extraArgs": ["--dtype=float16"]}},
            {"model": {"dtype": "float16"}},
            "spec.prefill.extraArgs[0]",
            "operator-owned-flag",
        ),
        (
            {"prefill": {"extraArgs": ["--block_size", "64"]}},
            {"blockSize": 64},
            "spec.prefill.extraArgs[0]",
            "operator-owned-flag",
        ),
        (
            {"decode": {"extraArgs": ["--disable-log-stats"]}},
            {"decode": {"extraArgs": []}},
            "spec.decode.extraArgs[0]",
            "operator-owned-flag",
        ),
        (
            {"decode": {"extraArgs": ["--kv-transfer-config.kv_role", "kv_both"]}},
            {},
            "spec.decode.extraArgs[1]",
            "no-kv-both",
        ),
        (
            {"env": [{"name": "VLLM_SSM_CONV_STATE_LAYOUT", "value": "SD"}]},
            {"env": [{"name": "UCX_LOG_LEVEL", "value": "info"}]},
            "spec.env[0].name",
            "operator-owned-env",
        ),
        (
            {"env": [{"name": "HPD_ROLE", "value": "decode"}]},
            {"env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]},
            "spec.env[0].name",
            "operator-owned-env",
        ),
    ],
)
def test_cross_role_rule(bad: dict[str, Any], good: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(SpecError) as ei:
        check(spec(**bad))
    assert (field, rule) in rules(ei.value), ei.value.message
    assert field in ei.value.message
    profile_of(spec(**good))


def test_heterogeneous_tp_allowed_in_both_directions_on_every_version() -> None:
    """Nano's 2 KV heads replicate at TP 4: allowed (with a block size) from 0.21; 0.20 refuses it (next test)."""
    for version in ("0.22.0", "0.25.0", "0.33.0"):
        for p, d in ((4, 2), (2, 4)):
            prof = profile_of(
                spec(
                    vllmVersion=version,
                    blockSize=4096,
                    prefill={"tensorParallelSize": p},
                    decode={"tensorParallelSize": d},
                )
            )
            for rp in (prof.prefill, prof.decode):
                assert rp.args[rp.args.index("--block-size") + 1] == "4096"


def test_block_size_unset_passes_no_flag_and_set_passes_the_same_on_both_roles() -> None:
    unset = profile_of(spec())
    assert "--block-size" not in unset.prefill.args and "--block-size" not in unset.decode.args
    assert not [i for i in unset.status()["injections"] if i["setting"] == "--block-size"]
    both = profile_of(spec(blockSize=1024))
    assert [rp.args[rp.args.index("--block-size") + 1] for rp in (both.prefill, both.decode)] == ["1024", "1024"]


@pytest.mark.parametrize(
    ("config", "tps", "replicated"),
    [
        ({"numKeyValueHeads": 2, "mambaNGroups": 8}, (4, 2), "the 2 KV heads"),
        ({"numKeyValueHeads": 8, "mambaNGroups": 1}, (1, 2), "the 1 Mamba groups"),
    ],
)
def test_hetero_tp_that_replicates_heads_needs_an_explicit_block_size(
    config: dict[str, int], tps: tuple[int, int], replicated: str
) -> None:
    """vLLM's own block size follows the per-rank Mamba page over the per-rank attention page; when one TP size
    replicates KV heads or Mamba groups the two roles get different sizes and 0.20 NIXL rejects hybrid pairs whose
    block sizes differ. The operator asks for spec.blockSize instead of letting the pods fail at the handshake."""
    body = {"model": {"name": "x/y", "config": config}, "prefill": {"tensorParallelSize": tps[0]},
            "decode": {"tensorParallelSize": tps[1]}, "vllmVersion": "0.25.1"}  # fmt: skip
    with pytest.raises(SpecError) as ei:
        check(spec(**body))
    assert ("spec.blockSize", "block-size-required-for-replicated-heads") in rules(ei.value)
    assert replicated in ei.value.message
    profile_of(spec(**body, blockSize=2048))  # an explicit size on both roles is accepted
    profile_of(spec(**{**body, "decode": {"tensorParallelSize": tps[0]}}))  # equal TP: vLLM's own size


@pytest.mark.parametrize("block_size", [None, 1056, 4096])
@pytest.mark.parametrize(("config", "tps"), [({"numKeyValueHeads": 1, "mambaNGroups": 1}, (2, 1)),
                                             ({"numKeyValueHeads": 2, "mambaNGroups": 8}, (2, 4))])  # fmt: skip
def test_vllm_0_20_refuses_hetero_tp_that_replicates_heads(
    config: dict[str, int], tps: tuple[int, int], block_size: int | None
) -> None:
    """Measured on two H200s (bench/results/2026-11-29-gpu-issue16-replicated-block1056.json): TP 2 -> TP 1 with
    1 KV head and 1 Mamba group and --block-size 1056 on both gave NaN P->D on 13/16 pair-check prompts, and without
    a block size the roles derive different sizes, which 0.20's NIXL refuses. No spec.blockSize makes it work."""
    body: dict[str, Any] = {"model": {"name": "x/y", "config": config}, "prefill": {"tensorParallelSize": tps[0]},
                            "decode": {"tensorParallelSize": tps[1]}}  # fmt: skip
    if block_size is not None:
        body["blockSize"] = block_size
    with pytest.raises(SpecError) as ei:
        check(spec(**body))
    field = "spec.decode.tensorParallelSize" if tps[1] > tps[0] else "spec.prefill.tensorParallelSize"
    assert (field, "replicated-hetero-tp-unservable") in rules(ei.value), ei.value.message
    assert "P->D output was NaN" in ei.value.message and "vLLM 0.27+" in ei.value.message
    profile_of(spec(**{**body, "vllmVersion": "0.33.0", "blockSize": None}))  # 0.27+ pairs the sizes itself


def test_known_model_is_checked_without_a_config_block() -> None:
    with pytest.raises(SpecError) as ei:
        check(spec(decode={"tensorParallelSize": 16}, prefill={"tensorParallelSize": 16}))
    assert ("spec.decode.tensorParallelSize", "mamba-groups-divisible") in rules(ei.value)
    assert "valid TP sizes: 1, 2, 4, 8" in ei.value.message


def test_speculative_decoding_allowed_for_attention_only_models() -> None:
    profile_of(spec(model={"name": "x/y", "hybrid": "none"}, decode={"extraArgs": ["--speculative-config", "{}"]}))


def test_all_violations_are_reported_at_once() -> None:
    with pytest.raises(SpecError) as ei:
        check(spec(blockSize=24, extraArgs=["--port", "9000"], env=[{"name": "HPD_X"}]))
    assert {r for _, r in rules(ei.value)} == {"block-size-multiple-of-16", "operator-owned-flag", "operator-owned-env"}
    assert ei.value.message.startswith("3 problems in the spec")


def test_decode_reports_cached_tokens_for_the_pair_check() -> None:
    p = profile_of(spec())
    assert "--enable-prompt-tokens-details" in p.decode.args
    assert "--enable-prompt-tokens-details" not in p.prefill.args
    assert any(i.setting == "--enable-prompt-tokens-details" for i in p.decode.injections)
    off = profile_of(spec(warmup={"pairCheck": False}))
    assert "--enable-prompt-tokens-details" not in off.decode.args


def test_every_length_turns_the_gemm_row_sweep_on_in_both_roles_by_default() -> None:
    """issue #12: the first request of a prompt length no warmup prompt had paid cuBLAS's per-row-count algorithm
    choice (+4 to +11 ms on the H200) until hpd_runtime.gemm_warmup ran every row count inside vLLM's startup."""
    p = profile_of(spec())
    for rp in (p.prefill, p.decode):
        env = {e["name"]: e.get("value") for e in rp.env_k8s()}
        assert env["HPD_GEMM_WARMUP_TOKENS"] == "auto"
        assert env["HPD_GEMM_WARMUP_SECONDS"] == "300"
        assert any(i.setting == "HPD_GEMM_WARMUP_TOKENS" and "row count" in i.reason for i in rp.injections)
    short = profile_of(spec(warmup={"timeoutSeconds": 60})).prefill.env_k8s()
    assert {"name": "HPD_GEMM_WARMUP_SECONDS", "value": "60"} in short  # never longer than the warmup's own budget
    for off in ({"everyLength": False}, {"enabled": False}):
        q = profile_of(spec(warmup=off))
        names = {e["name"] for rp in (q.prefill, q.decode) for e in rp.env_k8s()}
        assert not names & {"HPD_GEMM_WARMUP_TOKENS", "HPD_GEMM_WARMUP_SECONDS"}, off


@pytest.mark.parametrize(("version", "warned"), [("0.20.0", True), ("0.25.1", True), ("0.33.0", False)])
def test_an_explicit_block_size_on_a_hybrid_model_warns_where_a_raised_block_corrupted_pd(
    version: str, warned: bool
) -> None:
    p = profile_of(spec(blockSize=128, vllmVersion=version))
    assert bool(p.warnings) == warned
    if warned:
        assert "spec.blockSize=128" in p.warnings[0] and "cannot be computed from spec.model.config" in p.warnings[0]
    assert profile_of(spec()).warnings == ()
