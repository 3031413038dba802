#!/usr/bin/env bash
# The demo: install, bring the local control plane up (real kube-apiserver + kwok fake GPU nodes), show it.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
. .venv/bin/activate
python -m hpd_devcluster up
eval "$(python -m hpd_devcluster env)"
echo
echo "== kubectl version"; kubectl version
echo
echo "== GPU nodes (kwok)"
kubectl get nodes -o custom-columns='NAME:.metadata.name,STATUS:.status.conditions[?(@.type=="Ready")].type,GPU:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product'
echo
echo "The cluster keeps running. Use it:  eval \"\$(.venv/bin/python -m hpd_devcluster env)\"; kubectl get nodes"
echo "Stop it:                           .venv/bin/python -m hpd_devcluster down"
