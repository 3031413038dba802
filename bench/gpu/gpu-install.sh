#!/usr/bin/env bash
# On the GPU machine, after every bundle of bench/gpu/stage.sh was copied into /tmp/stage/: unpack vLLM and its
# wheels into /tmp/vllm-site. Then, in each later command: export PYTHONPATH=/tmp/vllm-site
set -euo pipefail
s=/tmp/stage
t=/tmp/vllm-site
rm -rf "$t" && mkdir -p "$t"
cat "$s"/vllm.tar.xz.part_* | xz -d | tar -xf - -C "$t"
cat "$s"/fa3.tar.xz.part_* | xz -d | tar -xf - -C "$t"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$t" "$s"/*.whl
rm -rf "$t"/nixl_ep* # nixl 1.5.1's expert-parallel module is built for another torch; vLLM imports it if present
PYTHONPATH=$t python3 -c "import vllm, nixl; print('vllm', vllm.__version__, 'nixl ok')"
PYTHONPATH=$t python3 -c "import vllm.entrypoints.openai.api_server, vllm.v1.engine.core; print('vllm serve imports ok')"
