"""bench/gpu/make_checkpoint.py: a deterministic tiny Nemotron-H checkpoint that vLLM 0.20.0 loads at TP=1 and TP=2.

The expected tensor map below is written out independently of the script, from the config math of vLLM 0.20.0's
NemotronH (nemotron_h.py + mamba_mixer2.py) and the HF checkpoint names (`backbone.*`, `embeddings`, `A_log`,
separate q/k/v) that its hf_to_vllm_mapper and load_weights translate. It was cross-checked once against the
real model: NemotronHForCausalLM built on CPU (TP=1 and TP=2 over gloo) and loaded from the generated file by
DefaultModelLoader, with no parameter missing or extra and the TP=2 shards equal to the TP=1 tensors.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu" / "make_checkpoint.py"
CONFIG = REPO / "bench" / "gpu" / "tiny-nemotron-h" / "config.json"


def run_script(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *extra],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The safetensors header (u64 LE length + JSON) and the size of the data section after it."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert isinstance(header, dict)
    return header, len(raw) - 8 - n


def expected_tensors() -> dict[str, tuple[int, ...]]:
    """Name -> full (TP=1) shape for the tiny config, from the config math (not from the script).

    d = hidden_size 512, vocab 2048; attention: 8 heads x head_dim 64 (q 512), 2 KV heads (k/v 128);
    MLP intermediate 1024; Mamba2: H = 16 heads x P = 64 -> I = 1024, G = 2 groups x N = 64 state -> G*N = 128,
    conv_dim = I + 2*G*N = 1280, in_proj rows = 2*I + 2*G*N + H = 2320 (z, x, B, C, dt), conv kernel 4.
    """
    d, vocab = 512, 2048
    q, kv, inter = 8 * 64, 2 * 64, 1024
    heads, m_inter, gn, kernel = 16, 16 * 64, 2 * 64, 4
    conv_dim = m_inter + 2 * gn
    assert conv_dim == 1280
    assert 2 * m_inter + 2 * gn + heads == 2320

    def mamba(p: str) -> dict[str, tuple[int, ...]]:
        return {
            f"{p}.mixer.in_proj.weight": (2320, d),
            f"{p}.mixer.conv1d.weight": (conv_dim, 1, kernel),
            f"{p}.mixer.conv1d.bias": (conv_dim,),
            f"{p}.mixer.A_log": (heads,),
            f"{p}.mixer.D": (heads,),
            f"{p}.mixer.dt_bias": (heads,),
            f"{p}.mixer.norm.weight": (m_inter,),
            f"{p}.mixer.out_proj.weight": (d, m_inter),
        }

    def mlp(p: str) -> dict[str, tuple[int, ...]]:
        return {f"{p}.mixer.up_proj.weight": (inter, d), f"{p}.mixer.down_proj.weight": (d, inter)}

    def attention(p: str) -> dict[str, tuple[int, ...]]:
        return {
            f"{p}.mixer.q_proj.weight": (q, d),
            f"{p}.mixer.k_proj.weight": (kv, d),
            f"{p}.mixer.v_proj.weight": (kv, d),
            f"{p}.mixer.o_proj.weight": (d, q),
        }

    out: dict[str, tuple[int, ...]] = {"backbone.embeddings.weight": (vocab, d)}
    for i, block in enumerate((mamba, mlp, mamba, attention, mamba, mlp)):  # "M-M*M-"
        out[f"backbone.layers.{i}.norm.weight"] = (d,)
        out.update(block(f"backbone.layers.{i}"))
    out["backbone.norm_f.weight"] = (d,)
    out["lm_head.weight"] = (vocab, d)
    return out


def bf16_to_float(bits: int) -> float:
    value: float = struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    return value


def test_tiny_config_is_what_the_expected_map_assumes_and_splits_at_tp2() -> None:
    cfg = json.loads(CONFIG.read_text())
    assert cfg["architectures"] == ["NemotronHForCausalLM"]
    assert cfg["hybrid_override_pattern"] == "M-M*M-"
    assert (cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]) == (512, 2048, 1024)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (8, 2, 64)
    assert (cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["mamba_n_groups"]) == (16, 64, 2)
    assert (cfg["ssm_state_size"], cfg["mamba_d_conv"], cfg["mamba_conv_bias"], cfg["use_bias"]) == (64, 4, True, False)
    assert cfg["tie_word_embeddings"] is False
    for key in ("num_attention_heads", "num_key_value_heads", "mamba_num_heads", "mamba_n_groups"):
        assert cfg[key] % 2 == 0, key
    assert cfg["mamba_num_heads"] % cfg["mamba_n_groups"] == 0


@pytest.fixture(scope="module")
def default_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The script run once with its defaults (the tiny config, seed 0), shared by the tests that read that output:
    each run writes the whole checkpoint in pure Python (seconds of CPU), so it is not repeated per test."""
    out = tmp_path_factory.mktemp("checkpoint") / "a"
    res = run_script(out)
    assert res.returncode == 0, res.stderr
    return out


def test_rerun_is_byte_identical_and_tensors_match_the_loader(default_checkpoint: Path, tmp_path: Path) -> None:
    a, b = default_checkpoint, tmp_path / "b"
    res = run_script(b)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in a.iterdir()) == ["config.json", "model.safetensors"]
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "config.json").read_bytes() == CONFIG.read_bytes()  # already has torch_dtype: copied verbatim

    header, data_len = read_header(a / "model.safetensors")
    assert header.pop("__metadata__") == {"format": "pt"}
    assert {name: tuple(t["shape"]) for name, t in header.items()} == expected_tensors()
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    spans = sorted(tuple(t["data_offsets"]) for t in header.values())
    assert spans[0][0] == 0
    assert spans[-1][1] == data_len
    assert all(prev[1] == nxt[0] for prev, nxt in itertools.pairwise(spans))  # contiguous, no gaps
    for t in header.values():
        assert t["data_offsets"][1] - t["data_offsets"][0] == 2 * math.prod(t["shape"])


def test_values(default_checkpoint: Path) -> None:
    raw = (default_checkpoint / "model.safetensors").read_bytes()
    header, _ = read_header(default_checkpoint / "model.safetensors")
    base = 8 + struct.unpack("<Q", raw[:8])[0]

    def values(name: str) -> list[float]:
        start, end = header[name]["data_offsets"]
        return [bf16_to_float(u) for (u,) in struct.iter_unpack("<H", raw[base + start : base + end])]

    a_log = values("backbone.layers.0.mixer.A_log")
    assert [round(math.exp(x)) for x in a_log] == list(range(1, 17))  # A = -1 .. -16
    assert values("backbone.layers.0.mixer.D") == [1.0] * 16
    assert set(values("backbone.layers.2.mixer.norm.weight")) == {1.0}
    assert set(values("backbone.norm_f.weight")) == {1.0}
    dt = [math.log1p(math.exp(x)) for x in values("backbone.layers.0.mixer.dt_bias")]  # softplus
    assert 0.0009 < dt[0] < dt[-1] < 0.11
    w = values("backbone.layers.3.mixer.q_proj.weight")
    mean = sum(w) / len(w)
    std = math.sqrt(sum((x - mean) ** 2 for x in w) / len(w))
    assert abs(mean) < 1e-3
    assert 0.019 < std < 0.021
    assert w != values("backbone.layers.3.mixer.o_proj.weight")  # tensors differ
    assert values("lm_head.weight") != values("backbone.embeddings.weight")


def test_seed_changes_the_weights(default_checkpoint: Path, tmp_path: Path) -> None:
    assert run_script(tmp_path / "b", "--seed", "7").returncode == 0
    assert (default_checkpoint / "model.safetensors").read_bytes() != (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()


def test_torch_dtype_added_only_when_missing(tmp_path: Path) -> None:
    cfg = json.loads(CONFIG.read_text())
    del cfg["torch_dtype"]
    src = tmp_path / "config.json"
    src.write_text(json.dumps(cfg))
    assert run_script(tmp_path / "out", "--config", str(src)).returncode == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == {**cfg, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("mamba_n_groups", 3),
        ("num_key_value_heads", 3),
        ("num_attention_heads", 7),
        ("mamba_num_heads", 15),
        ("hybrid_override_pattern", "M-M*ME"),
        ("hybrid_override_pattern", "M-M*M"),
        ("attention_bias", True),
    ],
)
def test_rejects_configs_that_do_not_split_at_tp2(tmp_path: Path, key: str, value: object) -> None:
    cfg = {**json.loads(CONFIG.read_text()), key: value}
    src = tmp_path / "config.json"
    src.write_text(json.dumps(cfg))
    res = run_script(tmp_path / "out", "--config", str(src))
    assert res.returncode == 2
    assert "make_checkpoint:" in res.stderr
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_replicated_kv_head_and_group_config_is_accepted(tmp_path: Path) -> None:
    """1 KV head and 1 Mamba group at TP 2: vLLM 0.20 replicates both (QKVParallelLinear; MambaMixer2 allows
    n_groups == 1), which is the replicated-heads pair of issue #16 (bench/gpu/tiny-nemotron-h-rep)."""
    rep = CONFIG.parent.parent / "tiny-nemotron-h-rep" / "config.json"
    cfg = json.loads(rep.read_text())
    assert (cfg["num_key_value_heads"], cfg["mamba_n_groups"]) == (1, 1)
    assert run_script(tmp_path / "out", "--config", str(rep)).returncode == 0
    assert (tmp_path / "out" / "model.safetensors").stat().st_size > 0
