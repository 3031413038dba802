#!/usr/bin/env bash
# On the GPU machine, after every bundle of `bench/gpu/stage.sh VERSION` was copied into STAGE (default /tmp/stage):
# unpack vLLM and its wheels into SITE (default /tmp/vllm-site). Then, in each later command: PYTHONPATH=SITE, or
# run.py --vllm-site VERSION=SITE. Two versions on one machine: STAGE=/tmp/stage-V SITE=/tmp/vllm-site-V per version.
# A bundle may list in reuse.txt wheels it shares with an earlier staged version (REUSE_FROM, a stage directory):
# they are taken from there instead of being carried twice.
set -euo pipefail
s=${STAGE:-/tmp/stage}
t=${SITE:-/tmp/vllm-site}
if [[ -f $s/reuse.txt ]]; then
  while read -r w; do
    [[ -z $w ]] && continue
    cp "${REUSE_FROM:?reuse.txt needs REUSE_FROM (the stage dir of the earlier version)}/$w" "$s/" \
      || { echo "gpu-install: $w not in $REUSE_FROM" >&2; exit 4; }
  done < "$s/reuse.txt"
fi
rm -rf "$t" && mkdir -p "$t"
cat "$s"/vllm.tar.xz.part_* | xz -d | tar -xf - -C "$t"
cat "$s"/fa3.tar.xz.part_* | xz -d | tar -xf - -C "$t"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$t" "$s"/*.whl
rm -rf "$t"/nixl_ep* # nixl 1.5.1's expert-parallel module is built for another torch; vLLM imports it if present
PYTHONPATH=$t python3 -c "import vllm, nixl; print('vllm', vllm.__version__, 'nixl ok')"
PYTHONPATH=$t python3 -c "import vllm.entrypoints.openai.api_server, vllm.v1.engine.core; print('vllm serve imports ok')"
