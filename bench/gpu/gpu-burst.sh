#!/usr/bin/env bash
# One device call of the issue #12 burst, after the five staging calls of ../shared/gpu/README.md (run from the repo
# root on the GPU machine; .whl/ and .gpu/rendered.json carried). Usage: gpu-burst.sh PLAN [--fresh-cache]
# .gpu/rendered.json = `python -m hpd_operator render -f bench/gpu/sample-crs.yaml -o json` (made on the CPU).
set -uo pipefail
test -d /tmp/vllm-site || { echo STAGING-LOST; exit 3; }
test -d /tmp/router-site || python3 -m pip install -q --no-index --no-deps --target /tmp/router-site .whl/*.whl
export PYTHONPATH=/tmp/vllm-site:/tmp/router-site:$PWD/images/runtime PYTHONUNBUFFERED=1
plan=$1; shift
name=$(echo "$plan" | tr ',:+' '_.-' | cut -c1-80)
logs=/tmp/hpd-logs/$name; mkdir -p "$logs"
timeout --signal=INT "${BURST_SECONDS:-560}" python3 bench/gpu/run.py --rendered .gpu/rendered.json --plan "$plan" \
  --out "$logs" --work /tmp/hpd-bench "$@"
echo "run.py rc=$?"
mkdir -p "$OUT/$name"
cp "$logs/result.json" "$OUT/$name/" 2>/dev/null
for f in "$logs"/*.log; do
  # vLLM/runtime logs: the last 3 MB; the router logs whole request bodies, keep only its errors and warnings
  case "$f" in *router.log) grep -iE "error|warn|kv_transfer" "$f" | tail -c 1000000 > "$OUT/$name/$(basename "$f")" ;;
               *) tail -c 3000000 "$f" > "$OUT/$name/$(basename "$f")" ;; esac
done
python3 - "$logs/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["runs"]
for cr, x in r.items():
    print(cr, "error:", x.get("error"), "times:", x.get("times"), "seconds:", x.get("seconds"))
    print("  pd_vs_colocated identical:", (x.get("pd_vs_colocated") or {}).get("identical"))
    print("  pair_check_at_ready:", [(p.get("ok"), p.get("summary")) for p in x.get("pair_check_at_ready", [])][:2])
    s = x.get("shapes") or {}
    print("  shapes max first/steady:", {k: v.get("max_first_over_steady") for k, v in s.items()})
    print("  autotune after ready:", x.get("autotune_events_after_ready"), "blocks:", x.get("block_sizes"))
    rs = x.get("restart")
    if rs:
        print("  restart:", rs["timeline"]["counts"], "decode exits:", rs["decode_exits"], "prefill ready at", rs.get("t_prefill_ready"))
        print("  decode readyz:", rs["timeline"]["readyz"]["decode"][:8])
    b = x.get("badpair")
    if b:
        print("  badpair ever ready:", b["decode_ever_ready"], b["readyz_history"][-2:])
PY
