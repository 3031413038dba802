#!/usr/bin/env bash
# One device call of the load burst (issues #26 and #27), after vLLM 0.20.0 is staged (bench/load/README.md):
#   BURST_SECONDS=S bash bench/gpu/load-burst.sh NAME RUN_LOAD_ARGS...     (run from the repo root on the GPU machine)
# e.g. BURST_SECONDS=530 bash bench/gpu/load-burst.sh load --cr nemotron-h-8b@env+UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
# Carried: .gpu/rendered.json (`python -m hpd_operator render -f bench/gpu/sample-crs.yaml -o json`, made on the CPU)
# and the router wheels in .whl/ (as gpu-burst.sh). bench/load/run_load.py runs with --deadline-s S-40 (its own
# budget, start-up and teardown included) under an outer `timeout` of S s (SIGINT, SIGKILL 20 s later): give the call
# a limit of at least S+60 s. The caches stay in /tmp/hpd-load for the next call on the same machine.
# Back in $OUT/NAME/ (at most 6 files): result.json, logs.tar.xz (log tails of vLLM, our runtime, the router's errors
# and warnings, the load generator), and NAME-{concurrency,rate,length,probe}.png (bench/load/plot.py) where present.
set -uo pipefail
name=${1:?usage: BURST_SECONDS=S bash bench/gpu/load-burst.sh NAME RUN_LOAD_ARGS...}
shift
budget=${BURST_SECONDS:?set BURST_SECONDS, at least 60 s below the limit of the device call}
test -d /tmp/vllm-site-0.20.0 || { echo STAGING-LOST; exit 3; }
# vllm-router 0.1.17 imports setproctitle (a vLLM dependency, staged with 0.20.0)
test -d /tmp/router-site/setproctitle || python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/router-site \
  .whl/*.whl /tmp/stage-0.20.0/setproctitle-*.whl
export PYTHONPATH=/tmp/router-site:$PWD/images/runtime:/tmp/vllm-site-0.20.0 PYTHONUNBUFFERED=1
export HPD_BURST_COMMAND="BURST_SECONDS=$budget bash bench/gpu/load-burst.sh $name $*"
logs=/tmp/hpd-load-logs/$name
rm -rf "$logs" && mkdir -p "$logs"
timeout --signal=INT --kill-after=20 "$budget" python3 bench/load/run_load.py --rendered .gpu/rendered.json \
  --out "$logs" --work /tmp/hpd-load --deadline-s $((budget - 40)) --vllm-site 0.20.0=/tmp/vllm-site-0.20.0 "$@" \
  > "$logs/run_load.out" 2>&1
echo "run_load.py rc=$?"
# engines left by a run cut short (its own process groups, by pid and start time; nothing after a clean end)
python3 -c "import sys; sys.path.insert(0, 'bench/load'); import run_load; from pathlib import Path
print('reaped:', run_load.reap(Path('/tmp/hpd-load/pgids')))"
mkdir -p "$OUT/$name" "$logs/tails"
cp "$logs/result.json" "$OUT/$name/" 2>/dev/null || echo "no result.json"
for f in "$logs"/*.log "$logs/run_load.out"; do
  [[ -f $f ]] || continue
  # vLLM/runtime/load-generator logs: the last 3 MB; the router logs whole request bodies: its errors and warnings
  case "$f" in *router.log) grep -iE "error|warn|kv_transfer" "$f" | tail -c 1000000 > "$logs/tails/$(basename "$f")" ;;
               *) tail -c 3000000 "$f" > "$logs/tails/$(basename "$f")" ;; esac
done
tar -C "$logs/tails" -cJf "$OUT/$name/logs.tar.xz" .
test -f "$OUT/$name/result.json" && python3 bench/load/plot.py "$OUT/$name/result.json" --out-dir "$OUT/$name" \
  --prefix "$name" > /dev/null 2>&1 || echo "plots: not drawn here (bench/load/plot.py draws them from result.json)"
tail -c 6000 "$logs/run_load.out"
ls -la "$OUT/$name"
