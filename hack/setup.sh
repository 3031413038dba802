#!/usr/bin/env bash
# Install everything the demo and the tests need, idempotently: a venv with the project (dev extra) and the
# local control plane's binaries (built once into ~/.cache/hybrid-pd; needs Go >= 1.26 and the Go module proxy).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v go >/dev/null 2>&1; then
  echo "error: Go >= 1.26 is required to build the local control plane (kube-apiserver, etcd, kwok)" >&2
  exit 2
fi
stamp=.venv/.hpd-installed
want=$(cat pyproject.toml hack/pyproject.toml | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] creating .venv and installing hybrid-pd-operator[dev] + the hack/ harness (editable) ..." >&2
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]' -e ./hack  # the harness is not in the operator's wheel
  echo "$want" > "$stamp"
fi
.venv/bin/python -m hpd_devcluster build >/dev/null
