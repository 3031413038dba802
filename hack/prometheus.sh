#!/usr/bin/env bash
# Idempotent: make `prometheus` and `promtool` (Debian's `prometheus` package, 2.42 on bookworm) available for the
# monitoring tests. Installs without recommends (no node exporter) and never starts the packaged service: the tests
# start their own Prometheus on 127.0.0.1 with a generated config. Prints the prometheus binary's path.
set -euo pipefail
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "error: prometheus/promtool missing; install Debian's 'prometheus' package (apt-get install prometheus)" >&2
    exit 2
  fi
  echo "[prometheus] apt-get install prometheus (once) ..." >&2
  # policy-rc.d 101: the package's postinst must not start a system Prometheus on :9090.
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
  fi
  trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
fi
command -v prometheus
