#!/usr/bin/env bash
# One device call of a GPU burst, after staging (bench/gpu/README.md): one or two lanes of bench/gpu/run.py side by
# side on one host. Lane a: GPUs 0,1, ports as in run.py; lane b: GPUs 1,0, every port +1000 (a TP=1 role takes a
# lane's first GPU). Each lane can run CRs of vLLM 0.20.0 and 0.25.1 (run.py --vllm-site, by the image tag).
#   gpu-burst.sh PLAN_A [PLAN_B] [--fresh-cache]        (run from the repo root there; .gpu/rendered.json carried)
# .gpu/rendered.json = `python -m hpd_operator render -f bench/gpu/sample-crs.yaml -o json` (made on the CPU).
# Back in $OUT/<lane>/: result.json and logs.tar.xz (vLLM/runtime log tails, the router's errors and warnings).
set -uo pipefail
sites=()
for v in 0.20.0 0.25.1; do
  test -d /tmp/vllm-site-$v && sites+=(--vllm-site "$v=/tmp/vllm-site-$v")
done
[[ ${#sites[@]} -gt 0 ]] || { echo STAGING-LOST; exit 3; }
# vllm-router 0.1.17 imports setproctitle (a vLLM dependency, staged with 0.20.0)
test -d /tmp/router-site/setproctitle || python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/router-site \
  .whl/*.whl /tmp/stage-0.20.0/setproctitle-*.whl
export PYTHONPATH=/tmp/router-site:$PWD/images/runtime:/tmp/vllm-site-0.20.0 PYTHONUNBUFFERED=1  # the router imports uvicorn etc. from the 0.20 site
plans=() extra=()
for a in "$@"; do case "$a" in --*) extra+=("$a") ;; *) plans+=("$a") ;; esac; done
lane() {  # lane NAME GPUS OFFSET PLAN
  local logs=/tmp/hpd-logs/$1
  rm -rf "$logs" && mkdir -p "$logs"
  # run.py's own waits end 30 s before the limit (--deadline-s), its teardown then fits; -k: a hung teardown is killed
  timeout -k 30 --signal=INT "${BURST_SECONDS:-500}" python3 bench/gpu/run.py --rendered .gpu/rendered.json --plan "$4" \
    --out "$logs" --work "/tmp/hpd-bench-$1" --gpus "$2" --port-offset "$3" "${sites[@]}" "${extra[@]}" \
    --deadline-s=$(( ${BURST_SECONDS:-500} - 30 )) > "$logs/run.py.out" 2>&1
  echo "lane $1 run.py rc=$?"
  mkdir -p "$OUT/$1"
  cp "$logs/result.json" "$OUT/$1/" 2>/dev/null
  mkdir -p "$logs/tails"
  for f in "$logs"/*.log "$logs/run.py.out"; do
    # vLLM/runtime logs: the last 3 MB; the router logs whole request bodies, keep only its errors and warnings
    case "$f" in *router.log) grep -iE "error|warn|kv_transfer" "$f" | tail -c 1000000 > "$logs/tails/$(basename "$f")" ;;
                 *) tail -c 3000000 "$f" > "$logs/tails/$(basename "$f")" ;; esac
  done
  tar -C "$logs/tails" -cJf "$OUT/$1/logs.tar.xz" .
}
lane a 0,1 0 "${plans[0]}" &
[[ ${#plans[@]} -gt 1 ]] && lane b 1,0 1000 "${plans[1]}" &
wait
for r in "$OUT"/*/result.json; do
python3 - "$r" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
print("==", sys.argv[1], rep.get("lane"))
for cr, x in rep["runs"].items():
    print(cr, "error:", x.get("error"), "times:", x.get("times"), "seconds:", x.get("seconds"), x.get("experiment", ""))
    pc = x.get("pd_vs_colocated") or {}
    print("  P->D: identical", pc.get("identical"), "within bound", pc.get("within_bound"), "within check (needs usage details)", pc.get("within_output_check"), "largest gap", pc.get("largest_gap_nats"))
    print("  first_request:", {k: v.get("first_over_steady") for k, v in (x.get("first_request") or {}).items()})
    print("  pair_check_at_ready:", [(p.get("ok"), p.get("summary")) for p in x.get("pair_check_at_ready", [])][:2])
    s = x.get("shapes") or {}
    print("  shapes max first/steady:", {k: v.get("max_first_over_steady") for k, v in s.items()})
    print("  autotune after ready:", x.get("autotune_events_after_ready"), "blocks:", x.get("block_sizes"))
    for role, lines in (x.get("gemm_warmup_log") or {}).items():
        print("  gemm warmup", role, lines[-1:] if lines else "no line")
    ds = (x.get("decode_steps") or {}).get("summary")
    if ds:
        print("  decode steps:", json.dumps(ds))
    b = x.get("badpair")
    if b:
        print("  badpair ever ready:", b["decode_ever_ready"], b["readyz_history"][-2:])
PY
done
