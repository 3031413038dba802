#!/usr/bin/env bash
# Install the real node's runtime from Debian, idempotently: containerd + runc (the container runtime the kubelet
# talks to over CRI), containernetworking-plugins (bridge, host-local, loopback: the pods' network namespaces),
# busybox-static (the tests' small image on the real node) and haproxy (the router pod's retry proxy, which
# tests/runtime/test_router_failover.py runs on the host with images/router/retry.cfg). The kubelet itself and its
# pause binary are built from the pinned k8s.io/kubernetes module by hpd_devcluster (realnode.py), not installed
# here. Nothing is started or enabled: hpd_devcluster runs containerd with a private config and state under the
# cluster's own directory.
set -euo pipefail
need=()
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
# busybox-static (not Debian's dynamic busybox): the tests' image copies /bin/busybox alone onto an empty root
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' || need+=(busybox-static)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
if [ "${#need[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "real-node-tools: need root to apt-get install ${need[*]} (or install them yourself)" >&2
  exit 2
fi
echo "[real-node-tools] apt-get install ${need[*]} ..." >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache policy "${need[@]}" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  apt-get update -qq
fi
# policy-rc.d: the packages' maintainer scripts must not start a system containerd (there may be no init at all).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
fi
trap 'if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi' EXIT
apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
