#!/usr/bin/env bash
# Create a test-only virtualenv holding vLLM's own CLI parser (no GPU needed) for the version truth test
# (tests/versions/test_vllm_parser_truth.py).
#
#   hack/vllm-parser-env.sh [VLLM_VERSION ...]    # default 0.20.0; prints each venv's python on success
#   hack/vllm-parser-env.sh --all                 # every version the truth test parses with (PARSER_VERSIONS)
#
# Each venv lives outside the repo, in ${HPD_VLLM_PARSER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-pd}/
# vllm-parser-<version>, and is reused while its marker file exists (delete the folder to rebuild).
#
# How (see shared/reference/vllm-argparse-on-cpu.md):
# - torch: exactly the version the vLLM wheel pins in its METADATA (0.20/0.25: 2.11.0, 0.27: 2.13.0,
#   0.33: 2.14.0). PyPI only has CUDA builds for Linux x86_64 and their shared libraries link the nvidia-* wheels
#   at import time, so torch comes WITH its dependencies: about 5 GB per torch version, the big part.
# - vllm: `--no-deps`, then only what the parser's imports need (flashinfer, the kernels etc. are not needed).
# - Sharing: the venvs are made by uv (a pinned copy installed into the cache folder) with ONE package cache
#   (<cache>/uv-cache) and hard links from it into every venv, so a torch version is downloaded and unpacked
#   once and the venvs that pin it (0.20 and 0.25) share its files on disk; two torch versions share every
#   nvidia-* wheel they agree on. The per-version cost is then the vLLM wheel and the parser's small deps.
# The parser is then built with the CPU platform forced (tests/versions/vllm_parse.py).
set -euo pipefail

# The versions CI parses with (one per rule boundary the truth test covers; keep in step with the test's list).
PARSER_VERSIONS=(0.20.0 0.25.1 0.27.1 0.33.0)
UV_VERSION=0.13.8

ROOT="${HPD_VLLM_PARSER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-pd}"
PYTHON="${PYTHON:-python3.11}"
if [[ "${1:-}" == "--all" ]]; then
  set -- "${PARSER_VERSIONS[@]}"
fi
[[ $# -gt 0 ]] || set -- 0.20.0

# What vLLM's parser imports need, beyond torch. Each is installed with the version range the vLLM wheel itself
# declares (its METADATA), so a newer wheel that needs a newer openai/fastapi gets it; transformers is pinned to
# 5.17.0, inside every supported wheel's range (the parser imports transformers' config classes). xgrammar and
# llguidance: 0.33's serve CLI imports the structured-output backends (their own range from METADATA too).
PARSER_DEPS=(
  numpy pydantic transformers msgspec cachetools psutil pyyaml regex requests tqdm blake3
  py-cpuinfo cloudpickle prometheus_client typing_extensions filelock safetensors einops pyzmq
  openai fastapi starlette cbor2 gguf aiohttp openai-harmony pillow pybase64 uvloop partial-json-parser
  xgrammar llguidance
)

uv_bin() {
  local tool="$ROOT/uv-$UV_VERSION"
  if [[ ! -x "$tool/bin/uv" ]]; then
    rm -rf "$tool"
    "$PYTHON" -m venv "$tool"
    "$tool/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" >&2
  fi
  echo "$tool/bin/uv"
}

build() {
  local version=$1 dir="$ROOT/vllm-parser-$1"
  local marker="$dir/.hpd-complete"
  if [[ -f "$marker" ]]; then
    echo "$dir/bin/python"
    return 0
  fi
  local start uv torch
  start=$(date +%s)
  mkdir -p "$ROOT"
  uv=$(uv_bin)
  # One package cache for every venv, on the same filesystem as the venvs (hard links need that).
  export UV_CACHE_DIR="${UV_CACHE_DIR:-$ROOT/uv-cache}" UV_LINK_MODE=hardlink UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1
  rm -rf "$dir"
  echo "vllm-parser-env: creating $dir (vLLM $version)" >&2
  "$uv" venv --quiet --python "$PYTHON" "$dir" >&2
  local pip=("$uv" pip install --quiet --python "$dir/bin/python")
  "${pip[@]}" --no-deps "vllm==$version" >&2
  # torch pin and parser deps, read from the vLLM wheel's own METADATA.
  "$dir/bin/python" - "${PARSER_DEPS[@]}" > "$dir/parser-requirements.txt" <<'PY'
import importlib.metadata as md
import re
import sys

def norm(n: str) -> str:
    return re.split(r"[<>=!~\[ ;(]", n, maxsplit=1)[0].strip().lower().replace("_", "-")

want = {norm(n): n for n in sys.argv[1:]}
declared = {}
torch = None
for req in md.requires("vllm") or []:
    if "extra ==" in req:
        continue
    if norm(req) == "torch":
        torch = req.split(";")[0].strip()
    elif norm(req) in want:
        declared[norm(req)] = req
if torch is None or "==" not in torch:
    sys.exit(f"vllm-parser-env: no exact torch pin in vLLM {md.version('vllm')}'s METADATA (got {torch!r})")
print(torch)
for name, plain in want.items():
    print("transformers==5.17.0" if name == "transformers" else declared.get(name, plain))
PY
  torch=$(head -n1 "$dir/parser-requirements.txt")
  "${pip[@]}" -r "$dir/parser-requirements.txt" >&2
  "$dir/bin/python" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
  touch "$marker"
  echo "vllm-parser-env: vLLM $version ($torch) done in $(($(date +%s) - start))s," \
    "$(du -sh "$dir" | cut -f1) apparent (hard-linked from $UV_CACHE_DIR, $(du -sh "$UV_CACHE_DIR" | cut -f1))" >&2
  echo "$dir/bin/python"
}

for v in "$@"; do
  build "$v"
done
