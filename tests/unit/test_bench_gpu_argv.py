"""bench/gpu/run.py takes its command lines from `python -m hpd_operator render` output; these checks run on the CPU
so the GPU runs start from argv that is exactly what the operator applies, with only the one-host substitutions."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "gpu"


def load_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_run", BENCH / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


run = load_run()


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "hpd_operator", "render", "-f", str(BENCH / "sample-crs.yaml"), "-o", "json"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_bench_argv_is_the_rendered_container_with_only_host_substitutions(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    roles = run.role_commands(rendered, "tiny-eager", tmp_path / "model", tmp_path / "cache")
    for name, role in roles.items():
        ctr = run.rendered_container(rendered, "tiny-eager", name)
        assert role.argv[: len(ctr["command"])] == ctr["command"] == ["python3", "-m", "hpd_runtime", "launch", "--"]
        got, want = role.argv[len(ctr["command"]) :], list(ctr["args"])
        changed = {want[i] for i in range(len(want)) if got[i] != want[i]}
        assert len(got) == len(want) and changed == {"8000", "tiny-nemotron-h"}  # --port and --model values only
        assert arg(got, "--model") == str(tmp_path / "model") and arg(got, "--port") == str(run.PORTS[name]["vllm"])
        rendered_env = {e["name"]: e.get("value") for e in ctr["env"]}
        substituted = {k for k in rendered_env if role.env.get(k) != rendered_env[k]}
        assert substituted <= {
            "HPD_POD_IP", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "HPD_MODEL", "HPD_VLLM_PORT",
            "HPD_RUNTIME_PORT", "HPD_CACHE_DIR", "HPD_PREFILL_SERVICE",
        }  # fmt: skip
        assert role.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"  # $(HPD_POD_IP) expanded as the kubelet does
        assert role.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS" and role.env["CUDA_VISIBLE_DEVICES"] == "0"
        assert "--block-size" not in got and "--enforce-eager" in got
    assert "--enable-prompt-tokens-details" in roles["decode"].argv
    assert roles["decode"].env["HPD_PREFILL_RUNTIME_PORT"] == str(run.PORTS["prefill"]["runtime"])


def test_the_known_bad_cr_passes_block_size_128_to_both_roles(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    roles = run.role_commands(rendered, "tiny-eager-block128", tmp_path, tmp_path)
    assert all(arg(r.argv, "--block-size") == "128" for r in roles.values())


@pytest.mark.parametrize(("cr", "gpus"), [("tiny-p2d1-fixed", ("0,1", "0")), ("tiny-p1d2-fixed", ("0", "0,1"))])
def test_hetero_tp_argv_keeps_nvlink_multicast_off(
    rendered: list[dict[str, Any]], tmp_path: Path, cr: str, gpus: tuple[str, str]
) -> None:
    roles = run.role_commands(rendered, cr, tmp_path / "ckpt", tmp_path / "cache")
    for i, name in enumerate(("prefill", "decode")):
        args, env = roles[name].argv, roles[name].env
        assert "--load-format" not in args  # the same checkpoint at both TP sizes
        assert env["CUDA_VISIBLE_DEVICES"] == gpus[i]
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["NVSHMEM_DISABLE_NVLS"] == "1"


def test_block_sizes_are_read_from_vllms_log(tmp_path: Path) -> None:
    """Lines as vLLM 0.20.0 logged them on the H200 (bench/results/2026-11-29-gpu-diagnose-pd-v2.json)."""
    log = tmp_path / "p.log"
    log.write_text(
        "(EngineCore pid=1) INFO [interface.py:606] Setting attention block size to 528 tokens to ensure that "
        "attention page size is >= mamba page size.\n"
        "(EngineCore pid=1) INFO [worker.py:343] User-specified logical block size (528) does not match physical "
        "kernel block size (16). Using the latter.\n"
    )
    roles = {
        "prefill": run.Role("prefill", [], {}, 1, log=log),
        "decode": run.Role("decode", [], {}, 1, log=tmp_path / "d"),
    }
    (tmp_path / "d").write_text("")
    assert run.block_sizes(roles) == {
        "prefill": {"attention": 528, "kernel": 16},
        "decode": {"attention": None, "kernel": None},
    }


@pytest.mark.parametrize("cr", ["tiny-eager", "tiny-compile", "tiny-eager-v025"])
def test_shape_lengths_are_unseen_and_control_lengths_warmed_by_the_runtimes_own_plan(
    rendered: list[dict[str, Any]], tmp_path: Path, cr: str
) -> None:
    """The shapes step reads first/steady at lengths the warmup never sent against lengths it did send: both sets
    must hold for the warmup plan the runtime computes from the rendered decode container (its env and argv)."""
    from hpd_runtime.config import load_config
    from hpd_runtime.warmup import plan_warmup

    role = run.role_commands(rendered, cr, tmp_path / "model", tmp_path / "cache")["decode"]
    vllm_args = role.argv[role.argv.index("--") + 1 :]
    plan = plan_warmup(load_config(role.env, vllm_args))
    sent = {len(p.tokens) for p in (*plan.sequential, *plan.concurrent, *plan.shapes, *plan.batch)}
    assert not sent & set(run.SHAPE_LENGTHS), "a 'never seen' length is in the warmup plan"
    assert set(run.CONTROL_LENGTHS) <= {len(p.tokens) for p in plan.shapes}, "a control length is not warmed"


def test_the_rendered_env_turns_the_gemm_warmup_on_and_the_plugin_is_discoverable_to_vllm(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The operator renders HPD_GEMM_WARMUP_TOKENS=auto (spec.warmup.everyLength, default on) and the bench installs
    the plugin as the image does: the PYTHONPATH each role gets declares the entry point that vLLM's plugin loader
    (importlib.metadata, group vllm.general_plugins) finds and loads, hpd_runtime.gemm_warmup.register.
    @no-gemm-warmup (the A/B baseline) removes the env."""
    from hpd_runtime import contract, gemm_warmup

    roles = run.role_commands(rendered, "tiny-eager", tmp_path / "model", tmp_path / "cache")
    for role in roles.values():
        assert role.env[contract.ENV_GEMM_WARMUP_TOKENS] == "auto", "the operator no longer renders the GEMM warmup"
        assert gemm_warmup.requested_tokens(role.env) == 0  # 0: up to the scheduler's max_num_batched_tokens
        baseline = run.Role(role.name, role.argv, dict(role.env), role.tp)
        assert "HPD_GEMM_WARMUP_TOKENS" in run.disable_gemm_warmup(baseline)
        assert gemm_warmup.requested_tokens(baseline.env) is None
        run.install_gemm_warmup_plugin(role, tmp_path)
        probe = (
            "import importlib.metadata as m, json;"
            "eps = [e for e in m.entry_points(group='vllm.general_plugins')];"
            "print(json.dumps([[e.name, e.value, e.load().__module__ + '.' + e.load().__name__] for e in eps]))"
        )
        # -S and cwd: no site-packages and no repo-root egg-info, so only what PYTHONPATH declares is found
        env = {"PYTHONPATH": role.env["PYTHONPATH"] + ":" + str(REPO / "images" / "runtime"), "PATH": "/usr/bin:/bin"}
        out = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True,
                             check=True, env=env, cwd=tmp_path)  # fmt: skip
        found = [e for e in json.loads(out.stdout) if e[0] == "hpd_gemm_warmup"]
        assert found == [["hpd_gemm_warmup", "hpd_runtime.gemm_warmup:register", "hpd_runtime.gemm_warmup.register"]]


def test_the_real_size_cr_is_compile_mode_tp1_with_a_tokenizer_and_no_gemm_sweep(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """nemotron-h-8b (issues #26/#27): Nemotron-H-8B-Base-8K's shapes, P/D as users run it (compile mode, TP 1), both
    roles and later two colocated replicas on one H200 (2 x 0.44 of it), served with a tokenizer for the load
    generator's text prompts, the GEMM sweep off for the bench only (its CR says so)."""
    from hpd_runtime import contract

    model_dir = run.model_dir_for(rendered, "nemotron-h-8b", None, tmp_path)
    assert model_dir == tmp_path / "model-nemotron-h-8b"  # a copy: bench/gpu/nemotron-h-8b stays config only
    config = json.loads((BENCH / "nemotron-h-8b" / "config.json").read_text())
    assert json.loads((model_dir / "config.json").read_text()) == config
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == config["vocab_size"] == 131072
    assert not (BENCH / "nemotron-h-8b" / "tokenizer.json").exists()
    roles = run.role_commands(rendered, "nemotron-h-8b", model_dir, tmp_path / "cache")
    for role in roles.values():
        args = role.argv
        assert "--enforce-eager" not in args and "--skip-tokenizer-init" not in args
        assert arg(args, "--tensor-parallel-size") == "1" and arg(args, "--gpu-memory-utilization") == "0.44"
        assert int(arg(args, "--max-model-len") or 0) >= 9216 <= config["max_position_embeddings"]
        assert arg(args, "--load-format") == "dummy" and arg(args, "--model") == str(model_dir)
        assert contract.ENV_GEMM_WARMUP_TOKENS not in role.env  # spec.warmup.everyLength false
    # the CR's model numbers (the operator's TP checks) are the config's
    cr = next(
        d
        for d in yaml.safe_load_all((BENCH / "sample-crs.yaml").read_text())
        if d and d["metadata"]["name"] == "nemotron-h-8b"
    )
    spec = cr["spec"]["model"]["config"]
    assert (spec["numAttentionHeads"], spec["numKeyValueHeads"], spec["mambaNumHeads"], spec["mambaNGroups"],
            spec["hiddenSize"], spec["ssdChunkSize"], spec["hybridOverridePattern"]) == (
        config["num_attention_heads"], config["num_key_value_heads"], config["mamba_num_heads"], config["n_groups"],
        config["hidden_size"], config["chunk_size"], config["hybrid_override_pattern"])  # fmt: skip
    assert len(config["hybrid_override_pattern"]) == config["num_hidden_layers"] == 52
    # a CR served with --skip-tokenizer-init keeps the config directory itself
    assert run.model_dir_for(rendered, "tiny-eager", None, tmp_path) == BENCH / "tiny-nemotron-h"


def test_word_tokenizer_files_and_encoding(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_word_tokenizer", BENCH / "word_tokenizer.py")
    assert spec is not None and spec.loader is not None
    word_tokenizer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(word_tokenizer)
    word_tokenizer.write(tmp_path, 10)
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    unk = word_tokenizer.UNK
    assert tok["model"]["vocab"] == {unk: 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, 10)}}
    assert [t["content"] for t in tok["added_tokens"] if t["special"]] == [unk, "<s>", "</s>"]
    # vLLM refuses a text prompt over max_input_tokens * (the longest word) characters: with the real model's vocabulary
    # a prompt of its longest ordinary words and their joining spaces must stay under that bound
    longest = max(len(w) for w in word_tokenizer.tokenizer_json(131072)["model"]["vocab"])  # type: ignore[index]
    assert longest >= len(" ".join([word_tokenizer.word(131071)] * 8192)) / 8192 * 1.5
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert word_tokenizer.encode(f"t5 t9  t3\nxyz </s> {unk}") == [5, 9, 3, 0, 2, 0]
    with pytest.raises(ValueError):
        word_tokenizer.tokenizer_json(3)


@pytest.mark.parametrize(
    ("variant", "want"),
    [
        ("env+UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n (was 'y')"),
        ("env-UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "removed UCX_CUDA_IPC_ENABLE_GET_ZCOPY"),  # the profile renders it
        ("env-HPD_NOT_RENDERED", "removed nothing (HPD_NOT_RENDERED was not set)"),
        ("env-VLLM_SSM_CONV_STATE_LAYOUT", "removed VLLM_SSM_CONV_STATE_LAYOUT"),
        ("env+VLLM_SSM_CONV_STATE_LAYOUT=SD", "VLLM_SSM_CONV_STATE_LAYOUT=SD (was 'DS')"),
    ],
)
def test_env_variants_set_or_remove_one_entry_on_both_roles(
    rendered: list[dict[str, Any]], tmp_path: Path, variant: str, want: str
) -> None:
    roles = run.role_commands(rendered, "nemotron-h-8b", tmp_path, tmp_path)
    before = {n: dict(r.env) for n, r in roles.items()}
    assert run.apply_variant(roles, variant) == {"prefill": want, "decode": want}
    name = variant[4:].partition("=")[0]
    for n, r in roles.items():
        assert {k: v for k, v in r.env.items() if k != name} == {k: v for k, v in before[n].items() if k != name}
        assert r.env.get(name) == (variant.partition("=")[2] if variant.startswith("env+") else None)
    with pytest.raises(SystemExit, match="unknown plan variant"):
        run.apply_variant(roles, "env+1BAD=x")


def test_a_pair_cr_runs_the_pair_pods_containers_with_their_rendered_ports(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """nemotron-h-8b-pair (processNamespace Pair): no role Deployments; each role is the pair pod's container of its
    name, ports and env as rendered (one network namespace, distinct ports already): only the model, cache, pod IP,
    runtime host and the measurement env change; decode keeps the rendered 127.0.0.1 prefill (default ports)."""
    cr = "nemotron-h-8b-pair"
    pod = run.pair_pod(rendered, cr)
    assert pod is not None and pod["shareProcessNamespace"] is True
    assert run.pair_pod(rendered, "nemotron-h-8b") is None
    roles = run.role_commands(rendered, cr, tmp_path / "model", tmp_path / "cache")
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"prefill", "decode", "router"}
    for name, role in roles.items():
        ctr = containers[name]
        assert run.rendered_container(rendered, cr, name) == ctr
        got, want = role.argv[len(ctr["command"]) :], list(ctr["args"])
        assert role.argv[: len(ctr["command"])] == ctr["command"]
        changed = {want[i] for i in range(len(want)) if got[i] != want[i]}
        assert len(got) == len(want) and changed == {"nemotron-h-8b"}  # --model only (the served name stays)
        rendered_env = {e["name"]: e["value"] for e in ctr["env"] if "value" in e}
        substituted = {k for k in rendered_env if role.env.get(k) != rendered_env[k]}
        assert substituted == {"VLLM_NIXL_SIDE_CHANNEL_HOST", "HPD_MODEL", "HPD_CACHE_DIR"}
        assert role.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == role.env["HPD_POD_IP"] == "127.0.0.1"
        assert role.env["CUDA_VISIBLE_DEVICES"] == "0"
    d = roles["decode"].env
    assert d["HPD_PREFILL_SERVICE"] == "127.0.0.1" and "HPD_PREFILL_PORT" not in d  # the runtime's defaults: 8000
    assert arg(roles["prefill"].argv, "--port") == "8000" and arg(roles["decode"].argv, "--port") == "8100"
    # the script's checks reach the pod's ports while the run lasts, and the lane's after
    before = (json.dumps(run.PORTS), json.dumps(run.ROUTER_PORTS))
    with run.pair_ports(rendered, cr):
        assert run.PORTS["prefill"] == {"vllm": 8000, "runtime": 8081, "side": 5600}
        assert run.PORTS["decode"] == {"vllm": 8100, "runtime": 8181, "side": 5650}
        assert run.ROUTER_PORTS["http"] == 8200 and run.router_url() == "http://127.0.0.1:8200/v1/completions"
    assert (json.dumps(run.PORTS), json.dumps(run.ROUTER_PORTS)) == before
    assert run.host_substitutions(rendered, f"{cr}:cold+load") == run.PAIR_HOST_SUBSTITUTIONS
    assert run.host_substitutions(rendered, "tiny-eager:cold") == run.HOST_SUBSTITUTIONS


def test_the_pair_pods_router_is_its_rendered_argv_on_loopback(rendered: list[dict[str, Any]]) -> None:
    """The in-pod router container, not the CR's router Deployment (service discovery over the pair pods): its
    args as rendered, static 127.0.0.1 URLs of the pod's engines, but for the loopback binds."""
    cr = "nemotron-h-8b-pair"
    argv = run.pair_router_argv(rendered, cr)
    want = list(run.pair_container(rendered, cr, "router")["args"])
    assert argv[:3] == [sys.executable, "-c", run.ROUTER_MAIN]
    got = argv[3:]
    assert len(got) == len(want)
    assert {(w, g) for w, g in zip(want, got, strict=True) if w != g} == {("0.0.0.0", "127.0.0.1")}
    assert arg(got, "--prefill") == "http://127.0.0.1:8000" and arg(got, "--decode") == "http://127.0.0.1:8100"
    assert "--vllm-pd-disaggregation" in got and "--service-discovery" not in got
    try:  # a second lane: every port shifted, the URLs with them
        run.PORT_OFFSET[0] = 1000
        shifted = run.pair_router_argv(rendered, cr)[3:]
        assert arg(shifted, "--port") == "9200" and arg(shifted, "--prefill") == "http://127.0.0.1:9000"
        assert arg(shifted, "--decode") == "http://127.0.0.1:9100" and arg(shifted, "--prometheus-port") == "30000"
    finally:
        run.PORT_OFFSET[0] = 0
