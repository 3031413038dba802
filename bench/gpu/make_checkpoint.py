"""Write a tiny Nemotron-H checkpoint with fixed (seeded) random weights: config.json + model.safetensors.

Why: `--load-format dummy` draws different weights per tensor-parallel size, so a TP=1 and a TP=2 instance
of the tiny model would not compute the same function. This script writes one real checkpoint that both load.

    python3 bench/gpu/make_checkpoint.py --out /tmp/tiny-nemotron-h            # default config: tiny-nemotron-h/

Stdlib only (no torch, numpy or safetensors), so it runs on any python3 >= 3.11; re-running it with the same
config and seed writes byte-identical files. No tokenizer files: vLLM runs with --skip-tokenizer-init.

Tensor names are the HF checkpoint names of the real nvidia/Nemotron-H checkpoints (`backbone.*`), which
vLLM 0.20.0 maps with NemotronHForCausalLM.hf_to_vllm_mapper (prefix backbone -> model; substrings
A_log -> A, embeddings -> embed_tokens) and NemotronHModel.load_weights (q_proj/k_proj/v_proj -> qkv_proj).
Shapes are the full (TP=1) shapes; vLLM's loaders shard them for TP>1. With H = mamba_num_heads,
P = mamba_head_dim, G = mamba_n_groups, N = ssm_state_size, K = mamba_d_conv, d = hidden_size:

    mamba intermediate I = H * P                conv_dim = I + 2 * G * N
    mixer.in_proj.weight   [2*I + 2*G*N + H, d]  (order z, x, B, C, dt; MambaMixer2's MergedColumnParallelLinear)
    mixer.conv1d.weight    [conv_dim, 1, K]      (depthwise Conv1d layout; vLLM unsqueezes its [conv_dim, K] to this)
    mixer.conv1d.bias      [conv_dim]            (if mamba_conv_bias)
    mixer.A_log, mixer.D, mixer.dt_bias  [H]
    mixer.norm.weight      [I]                   (gated group RMSNorm)
    mixer.out_proj.weight  [d, I]
    attention: q_proj [nh*hd, d], k_proj/v_proj [nkv*hd, d], o_proj [d, nh*hd]   (no biases in vLLM 0.20.0)
    MLP:       up_proj [inter, d], down_proj [d, inter]                           (relu2, not gated)
    each layer i also has backbone.layers.{i}.norm.weight [d]; and backbone.embeddings.weight [vocab, d],
    backbone.norm_f.weight [d], lm_head.weight [vocab, d] (vLLM 0.20.0 never ties lm_head to the embeddings)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "tiny-nemotron-h" / "config.json"
DEFAULT_SEED = 20261129
MATRIX_STD = 0.02
TP_SIZES = (1, 2)  # the tensor-parallel sizes this checkpoint must load under
DT_MIN, DT_MAX = 0.001, 0.1  # NemotronHConfig defaults (mamba_dt_min / mamba_dt_max)


# --- the tensor list -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    init: str  # "normal" | "ones" | "a_log" | "dt_bias"
    std: float = 0.0


def _int(cfg: dict[str, Any], key: str) -> int:
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"config {key}={value!r}: expected a positive integer")
    return value


def check_config(cfg: dict[str, Any]) -> None:
    """Raise ValueError unless vLLM 0.20.0 can shard this config at every TP size in TP_SIZES."""
    if cfg.get("architectures") != ["NemotronHForCausalLM"]:
        raise ValueError(f"architectures={cfg.get('architectures')!r}: expected ['NemotronHForCausalLM']")
    pattern = cfg["hybrid_override_pattern"]
    if not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-E"):
        raise ValueError(f"hybrid_override_pattern={pattern!r}: expected a non-empty string of M, *, -, E")
    if "E" in pattern:
        raise ValueError("MoE layers ('E') are not supported by this script (the tiny model has none)")
    if len(pattern) != _int(cfg, "num_hidden_layers"):
        raise ValueError(
            f"hybrid_override_pattern has {len(pattern)} layers, num_hidden_layers={cfg['num_hidden_layers']}"
        )
    if cfg.get("attention_bias", False):
        raise ValueError("attention_bias=true: vLLM 0.20.0's NemotronHAttention has no biases and could not load them")
    sizes = {
        "num_attention_heads": _int(cfg, "num_attention_heads"),
        "num_key_value_heads": _int(cfg, "num_key_value_heads"),
        "mamba_num_heads": _int(cfg, "mamba_num_heads"),
        "mamba_n_groups": _int(cfg, "mamba_n_groups"),
        "hidden_size": _int(cfg, "hidden_size"),
        "vocab_size": _int(cfg, "vocab_size"),
    }
    sizes.update({f"intermediate_size[{i}]": v for i, v in enumerate(_intermediate_sizes(cfg))})
    for tp in TP_SIZES:
        for key, value in sizes.items():
            if value % tp == 0 or _replicated_ok(key, value, tp):
                continue
            raise ValueError(f"config {key}={value} is not divisible by tensor-parallel size {tp}")
    if sizes["mamba_num_heads"] % sizes["mamba_n_groups"]:
        raise ValueError("mamba_num_heads must be a multiple of mamba_n_groups (heads of a group stay on one rank)")
    if sizes["num_attention_heads"] % sizes["num_key_value_heads"]:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


def _replicated_ok(key: str, value: int, tp: int) -> bool:
    """vLLM 0.20.0 replicates what it cannot split: KV heads when TP is a multiple of their count
    (QKVParallelLinear), Mamba groups when there is one group (MambaMixer2: n_groups == 1 or divisible by TP)."""
    if key == "num_key_value_heads":
        return tp % value == 0
    return key == "mamba_n_groups" and value == 1


def _intermediate_sizes(cfg: dict[str, Any]) -> list[int]:
    """One MLP width per '-' layer (NemotronHMLPDecoderLayer: an int, a 1-list, or one entry per MLP layer)."""
    n_mlp = str(cfg["hybrid_override_pattern"]).count("-")
    value = cfg["intermediate_size"]
    values = value if isinstance(value, list) else [value]
    if len(values) == 1:
        values = values * n_mlp
    if len(values) != n_mlp:
        raise ValueError(f"intermediate_size has {len(values)} entries for {n_mlp} MLP layers")
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"intermediate_size entry {v!r}: expected a positive integer")
    return list(values)


def tensor_specs(cfg: dict[str, Any]) -> list[TensorSpec]:
    """Every tensor of the HF checkpoint, in layer order, with its full (TP=1) shape."""
    check_config(cfg)
    d = _int(cfg, "hidden_size")
    vocab = _int(cfg, "vocab_size")
    n_heads = _int(cfg, "num_attention_heads")
    n_kv = _int(cfg, "num_key_value_heads")
    head_dim = cfg.get("head_dim") or d // n_heads
    m_heads = _int(cfg, "mamba_num_heads")
    m_head_dim = _int(cfg, "mamba_head_dim")
    groups = _int(cfg, "mamba_n_groups")
    state = _int(cfg, "ssm_state_size")
    kernel = _int(cfg, "mamba_d_conv")
    conv_bias = bool(cfg.get("mamba_conv_bias", True))
    mamba_bias = bool(cfg.get("use_bias", False))  # vLLM and HF both take in_proj/out_proj bias from use_bias
    mlp_bias = bool(cfg.get("mlp_bias", False))
    inter = _intermediate_sizes(cfg)

    m_inter = m_heads * m_head_dim
    conv_dim = m_inter + 2 * groups * state
    in_proj_out = 2 * m_inter + 2 * groups * state + m_heads
    conv_std = 1.0 / math.sqrt(3 * kernel)  # the variance of PyTorch's default Conv1d init (fan_in = K)

    specs = [TensorSpec("backbone.embeddings.weight", (vocab, d), "normal", MATRIX_STD)]
    mlp_index = 0
    for i, kind in enumerate(str(cfg["hybrid_override_pattern"])):
        p = f"backbone.layers.{i}"
        specs.append(TensorSpec(f"{p}.norm.weight", (d,), "ones"))
        if kind == "M":
            specs += [
                TensorSpec(f"{p}.mixer.in_proj.weight", (in_proj_out, d), "normal", MATRIX_STD),
                TensorSpec(f"{p}.mixer.conv1d.weight", (conv_dim, 1, kernel), "normal", conv_std),
                TensorSpec(f"{p}.mixer.A_log", (m_heads,), "a_log"),
                TensorSpec(f"{p}.mixer.D", (m_heads,), "ones"),
                TensorSpec(f"{p}.mixer.dt_bias", (m_heads,), "dt_bias"),
                TensorSpec(f"{p}.mixer.norm.weight", (m_inter,), "ones"),
                TensorSpec(f"{p}.mixer.out_proj.weight", (d, m_inter), "normal", MATRIX_STD),
            ]
            if conv_bias:
                specs.append(TensorSpec(f"{p}.mixer.conv1d.bias", (conv_dim,), "normal", MATRIX_STD))
            if mamba_bias:
                specs.append(TensorSpec(f"{p}.mixer.in_proj.bias", (in_proj_out,), "normal", MATRIX_STD))
                specs.append(TensorSpec(f"{p}.mixer.out_proj.bias", (d,), "normal", MATRIX_STD))
        elif kind == "*":
            specs += [
                TensorSpec(f"{p}.mixer.q_proj.weight", (n_heads * head_dim, d), "normal", MATRIX_STD),
                TensorSpec(f"{p}.mixer.k_proj.weight", (n_kv * head_dim, d), "normal", MATRIX_STD),
                TensorSpec(f"{p}.mixer.v_proj.weight", (n_kv * head_dim, d), "normal", MATRIX_STD),
                TensorSpec(f"{p}.mixer.o_proj.weight", (d, n_heads * head_dim), "normal", MATRIX_STD),
            ]
        else:  # "-"
            width = inter[mlp_index]
            mlp_index += 1
            specs += [
                TensorSpec(f"{p}.mixer.up_proj.weight", (width, d), "normal", MATRIX_STD),
                TensorSpec(f"{p}.mixer.down_proj.weight", (d, width), "normal", MATRIX_STD),
            ]
            if mlp_bias:
                specs.append(TensorSpec(f"{p}.mixer.up_proj.bias", (width,), "normal", MATRIX_STD))
                specs.append(TensorSpec(f"{p}.mixer.down_proj.bias", (d,), "normal", MATRIX_STD))
    # vLLM 0.20.0's NemotronHForCausalLM always has its own lm_head (it never ties it to the embeddings).
    specs += [
        TensorSpec("backbone.norm_f.weight", (d,), "ones"),
        TensorSpec("lm_head.weight", (vocab, d), "normal", MATRIX_STD),
    ]
    return specs


# --- values --------------------------------------------------------------------------------------------------------
def bf16_bits(x: float) -> int:
    """float -> bfloat16 bit pattern (float32 rounded to nearest even on the upper 16 bits)."""
    u: int = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


_QUANTILES: list[float] = []
_TABLES: dict[float, array[int]] = {}


def _normal_table(std: float) -> array[int]:
    """65,536 bf16 values: the standard normal's quantiles at (k + 0.5) / 65536, times std.

    A random 16-bit index into this table is a (finely quantised) normal sample; drawing the indices with
    random.randbytes keeps the whole file deterministic and fast without numpy.
    """
    if not _QUANTILES:
        dist = statistics.NormalDist()
        _QUANTILES.extend(dist.inv_cdf((k + 0.5) / 65536) for k in range(65536))
    if std not in _TABLES:
        _TABLES[std] = array("H", (bf16_bits(q * std) for q in _QUANTILES))
    return _TABLES[std]


def _rng(seed: int, name: str) -> random.Random:
    """One generator per tensor, keyed by (seed, name): a tensor's values do not depend on the others."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def tensor_bytes(spec: TensorSpec, seed: int) -> bytes:
    """The tensor's bf16 data, little-endian, row-major."""
    n = math.prod(spec.shape)
    if spec.init == "ones":
        values = array("H", [bf16_bits(1.0)]) * n
    elif spec.init == "a_log":  # A = -exp(A_log) = -1 .. -H, as HF's Mamba2 init
        values = array("H", (bf16_bits(math.log(h)) for h in range(1, n + 1)))
    elif spec.init == "dt_bias":  # softplus^-1 of dt, log-spaced over [DT_MIN, DT_MAX] across heads
        dts = [math.exp(math.log(DT_MIN) + (math.log(DT_MAX) - math.log(DT_MIN)) * h / max(n - 1, 1)) for h in range(n)]
        values = array("H", (bf16_bits(dt + math.log(-math.expm1(-dt))) for dt in dts))
    elif spec.init == "normal":
        table = _normal_table(spec.std)
        idx = array("H", _rng(seed, spec.name).randbytes(2 * n))
        if sys.byteorder == "big":
            idx.byteswap()
        values = array("H", map(table.__getitem__, idx))
    else:
        raise ValueError(f"unknown init {spec.init!r}")
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


# --- writing -------------------------------------------------------------------------------------------------------
def safetensors_bytes(specs: list[TensorSpec], seed: int) -> bytes:
    """A safetensors file: u64 LE header length, JSON header (padded to 8 bytes), then the tensors' bytes."""
    ordered = sorted(specs, key=lambda s: s.name)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    for spec in ordered:
        data = tensor_bytes(spec, seed)
        assert len(data) == 2 * math.prod(spec.shape)
        header[spec.name] = {"dtype": "BF16", "shape": list(spec.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(chunks)


def config_bytes(config_path: Path) -> bytes:
    """config.json as given; re-serialised only to add "torch_dtype": "bfloat16" where it is missing."""
    raw = config_path.read_bytes()
    cfg = json.loads(raw)
    if "torch_dtype" in cfg:
        return raw
    cfg["torch_dtype"] = "bfloat16"
    return (json.dumps(cfg, indent=2) + "\n").encode()


def write_checkpoint(out: Path, config_path: Path = DEFAULT_CONFIG, seed: int = DEFAULT_SEED) -> list[TensorSpec]:
    cfg_raw = config_bytes(config_path)
    specs = tensor_specs(json.loads(cfg_raw))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_bytes(cfg_raw)
    tmp = out / "model.safetensors.tmp"
    tmp.write_bytes(safetensors_bytes(specs, seed))
    tmp.replace(out / "model.safetensors")
    return specs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, required=True, help="directory to write config.json and model.safetensors")
    ap.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help=f"source config.json (default {DEFAULT_CONFIG})"
    )
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)
    try:
        specs = write_checkpoint(args.out, args.config, args.seed)
    except ValueError as e:
        print(f"make_checkpoint: {e}", file=sys.stderr)
        return 2
    size = (args.out / "model.safetensors").stat().st_size
    print(f"wrote {args.out}/model.safetensors: {len(specs)} tensors, {size} bytes (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
