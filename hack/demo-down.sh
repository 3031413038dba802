#!/usr/bin/env bash
# Stop the demo: an operator an older demo ran in the background (by its recorded PID only), then the local control
# plane with its real node (kubelet, containerd, kube-proxy, CoreDNS; `down` puts the host back: iptables chains,
# bridge, sysctls, mounts, cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
# the same cache root as hpd_devcluster.build.cache_dir(), so `make down` with HPD_CACHE_DIR set looks in that cache
STATE=${HPD_DEMO_STATE:-${HPD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-pd}/demo}
if [ -f "$STATE/operator.pid" ]; then
  pid=$(cat "$STATE/operator.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "operator (pid $pid) stopped"
  fi
  rm -f "$STATE/operator.pid"
fi
.venv/bin/python -m hpd_devcluster --name "${HPD_DEMO_CLUSTER:-default}" down
