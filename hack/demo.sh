#!/usr/bin/env bash
# The demo: install, bring the local control plane up (real kube-apiserver + kwok fake GPU nodes), install the chart
# (CRD, ServiceAccount, RBAC), run the operator in the background with the chart's ServiceAccount token, apply the
# seed's Nemotron-3-Nano example, wait until it is Ready, and show what the operator generated.
# Stop everything with `make down` (hack/demo-down.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
. .venv/bin/activate
STATE=${HPD_DEMO_STATE:-$HOME/.cache/hybrid-pd/demo}
mkdir -p "$STATE"
python -m hpd_devcluster up
eval "$(python -m hpd_devcluster env)"
echo
echo "== GPU nodes (kwok)"
kubectl get nodes -o custom-columns='NAME:.metadata.name,GPU:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product'

echo
echo "== helm chart (CRD, ServiceAccount, RBAC; kwok runs the operator's pod as a stand-in)"
crd=crd/hybridpddeployments.hybridpd.io
if kubectl get "$crd" >/dev/null 2>&1; then  # a CRD applied with kubectl earlier: hand it to the release (docs/install.md)
  kubectl annotate --overwrite "$crd" meta.helm.sh/release-name=hpd meta.helm.sh/release-namespace=hpd-system >/dev/null
  kubectl label --overwrite "$crd" app.kubernetes.io/managed-by=Helm >/dev/null
fi
helm upgrade --install hpd charts/hybrid-pd-operator -n hpd-system --create-namespace --wait --timeout 120s
kubectl wait --for=condition=Established --timeout=30s "$crd"
# The operator below runs on this machine with the chart's ServiceAccount token, so the chart's RBAC is what it has.
cp "$KUBECONFIG" "$STATE/operator.kubeconfig"
KUBECONFIG="$STATE/operator.kubeconfig" kubectl config set-credentials hpd-operator \
  --token="$(kubectl -n hpd-system create token hpd-hybrid-pd-operator --duration=24h)" >/dev/null
KUBECONFIG="$STATE/operator.kubeconfig" kubectl config set-context --current --user=hpd-operator >/dev/null

echo
echo "== operator (background; log: $STATE/operator.log, pid: $STATE/operator.pid)"
if [ -f "$STATE/operator.pid" ] && kill -0 "$(cat "$STATE/operator.pid")" 2>/dev/null; then
  echo "already running (pid $(cat "$STATE/operator.pid"))"
else
  KUBECONFIG="$STATE/operator.kubeconfig" nohup python -m hpd_operator run \
    --metrics-port "${HPD_DEMO_METRICS_PORT:-9090}" --liveness-port "${HPD_DEMO_LIVENESS_PORT:-8080}" \
    >"$STATE/operator.log" 2>&1 &
  echo $! >"$STATE/operator.pid"
  echo "started (pid $!)"
fi

echo
echo "== apply examples/nemotron-3-nano.yaml"
# the chart's rbac.fence (on by default): the operator writes only in namespaces a namespace admin opted in
kubectl label --overwrite namespace default hybridpd.io/operator-writes=allowed >/dev/null
kubectl apply -f examples/nemotron-3-nano.yaml
# Generous for a slow machine (kwok turns pods Ready in seconds; a first CR right after the CRD's creation waits for
# one retry of the operator's backoff); on failure, the operator's own reasons first.
if ! kubectl wait --for=condition=Ready --timeout="${HPD_DEMO_WAIT:-300s}" hpd/nemotron-3-nano; then
  echo "not Ready in time. The CR's conditions (the operator's own reasons):" >&2
  kubectl get hpd nemotron-3-nano \
    -o jsonpath='{range .status.conditions[*]}  {.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
  echo "Events:" >&2
  kubectl get events --field-selector involvedObject.name=nemotron-3-nano >&2 || true
  echo "operator log tail:" >&2
  tail -40 "$STATE/operator.log" >&2
  exit 1
fi
echo
kubectl get hpd
echo
echo "== children"
kubectl get deploy,svc,sa,role,rolebinding,pdb,pods -l app.kubernetes.io/instance=nemotron-3-nano -o wide

for role in prefill decode; do
  pod=$(kubectl get pods -l "app.kubernetes.io/instance=nemotron-3-nano,app.kubernetes.io/component=$role" \
    -o jsonpath='{.items[0].metadata.name}')
  echo
  echo "== $role pod $pod: command line"
  kubectl get pod "$pod" -o json | python -c '
import json, shlex, sys
c = json.load(sys.stdin)["spec"]["containers"][0]
print(shlex.join(c.get("command", []) + c.get("args", [])))
print()
print("env:")
for e in c.get("env", []):
    v = json.dumps(e["valueFrom"]) if "valueFrom" in e else e.get("value", "")
    print("  " + e["name"] + "=" + v)
print("resources:", json.dumps(c.get("resources")))'
done
echo
echo "The cluster and the operator keep running:  eval \"\$(.venv/bin/python -m hpd_devcluster env)\"; kubectl get hpd"
echo "Stop both:                                  make down   (hack/demo-down.sh)"
