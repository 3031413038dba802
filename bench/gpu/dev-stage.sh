#!/usr/bin/env bash
# dev-stage.sh BUNDLE_DIR [install VERSION...]: copy a bundle's per-version files into /tmp/stage-VERSION; with
# `install`, join the chunked files and run gpu-install.sh per version (0.25.1 reuses 0.20.0's wheels).
set -euo pipefail
b=$1; shift
for d in "$b"/*/; do v=$(basename "$d"); mkdir -p /tmp/stage-$v; cp "$d"* /tmp/stage-$v/; done
ls /tmp/stage-* | wc -l
if [[ ${1:-} == install ]]; then
  shift
  for v in "$@"; do
    cd /tmp/stage-$v
    for f in *.chunk00; do [[ -e $f ]] || continue; base=${f%.chunk00}; cat "$base".chunk* > "$base"; rm "$base".chunk*; done
    t=$(date +%s)
    STAGE=/tmp/stage-$v SITE=/tmp/vllm-site-$v REUSE_FROM=/tmp/stage-0.20.0 bash /tmp/stage-$v/gpu-install.sh
    echo "installed $v in $(( $(date +%s) - t )) s"
    cd - >/dev/null
  done
fi
