#!/usr/bin/env bash
# Create a test-only virtualenv holding vLLM's own CLI parser (no GPU needed) for the version truth test
# (tests/versions/test_vllm_parser_truth.py).
#
#   hack/vllm-parser-env.sh [VLLM_VERSION]        # default 0.20.0; prints the venv's python on success
#
# The venv lives outside the repo, in ${HPD_VLLM_PARSER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-pd}/
# vllm-parser-<version>, and is reused while its marker file exists (delete the folder to rebuild).
#
# How (see shared/reference/vllm-argparse-on-cpu.md):
# - torch: the version the vLLM wheel pins, from PyPI. PyPI only has CUDA builds for Linux x86_64 and their
#   shared libraries link the nvidia-* wheels at import time, so torch is installed WITH its dependencies
#   (the big part of this venv). No GPU is needed to import it.
# - vllm: `--no-deps`, then only what the parser's imports need (xgrammar, flashinfer etc. are not needed).
# The parser is then built with the CPU platform forced (tests/versions/vllm_parse.py).
set -euo pipefail

VERSION="${1:-0.20.0}"
ROOT="${HPD_VLLM_PARSER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-pd}"
DIR="$ROOT/vllm-parser-$VERSION"
MARKER="$DIR/.hpd-complete"
PYTHON="${PYTHON:-python3.11}"

if [[ -f "$MARKER" ]]; then
  echo "$DIR/bin/python"
  exit 0
fi

EXTRA_DEPS=()
# torch pinned by each vLLM wheel's METADATA (shared/reference/vllm-facts.md, table at the top).
case "$VERSION" in
  0.20.*|0.22.*|0.25.*) TORCH=2.11.0 ;;
  0.33.*) TORCH=2.14.0; EXTRA_DEPS=(xgrammar llguidance) ;;  # 0.33's serve CLI imports the structured-output backends
  *) echo "vllm-parser-env: no torch pin known for vLLM $VERSION (add it here)" >&2; exit 2 ;;
esac

# What vLLM's parser imports need, beyond torch. Each is installed with the version range the vLLM wheel itself
# declares (its METADATA), so a newer wheel that needs a newer openai/fastapi gets it; transformers is pinned to
# 5.17.0, inside every supported wheel's range (the parser imports transformers' config classes).
PARSER_DEPS=(
  numpy pydantic transformers msgspec cachetools psutil pyyaml regex requests tqdm blake3
  py-cpuinfo cloudpickle prometheus_client typing_extensions filelock safetensors einops pyzmq
  openai fastapi starlette cbor2 gguf aiohttp openai-harmony pillow pybase64 uvloop partial-json-parser
)

start=$(date +%s)
rm -rf "$DIR"
mkdir -p "$ROOT"
echo "vllm-parser-env: creating $DIR (vLLM $VERSION, torch $TORCH)" >&2
"$PYTHON" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" "torch==$TORCH" >&2
"${PIP[@]}" --no-deps "vllm==$VERSION" >&2
"$DIR/bin/python" - "${PARSER_DEPS[@]}" "${EXTRA_DEPS[@]}" > "$DIR/parser-requirements.txt" <<'PY'
import importlib.metadata as md
import re
import sys

def norm(n: str) -> str:
    return re.split(r"[<>=!~\[ ;(]", n, maxsplit=1)[0].strip().lower().replace("_", "-")

want = {norm(n): n for n in sys.argv[1:]}
declared = {}
for req in md.requires("vllm") or []:
    if "extra ==" not in req and norm(req) in want:
        declared[norm(req)] = req
for name, plain in want.items():
    print("transformers==5.17.0" if name == "transformers" else declared.get(name, plain))
PY
"${PIP[@]}" -r "$DIR/parser-requirements.txt" >&2
"$DIR/bin/python" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$MARKER"
echo "vllm-parser-env: done in $(( $(date +%s) - start ))s, size $(du -sh "$DIR" | cut -f1)" >&2
echo "$DIR/bin/python"
