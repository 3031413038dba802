#!/usr/bin/env bash
# The demo: the local control plane with one real node (a kubelet, containerd, kube-proxy and CoreDNS on this
# machine; no kwok node), the chart installed with the operator running as the chart's pod, the example CR
# (examples/nemotron-3-nano.yaml) turned Ready by the real probes, then one completion sent through the CR's endpoint
# Service, with proof that it went prefill -> decode.
# The engine is the CPU stand-in (a test-only variant of the vllm image whose vLLM is tests/runtime/fake_vllm.py:
# no GPU, no model, made-up tokens); everything around it (operator, router, hpd_runtime's warmup, probes, pair
# check, P->D hand-off over the pods' network) is the real thing.
# Root: the real node runs containers (hack/real-node-tools.sh installs containerd, runc, CNI plugins from Debian).
# Stop everything with `make down` (hack/demo-down.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
hack/setup.sh
hack/real-node-tools.sh
. .venv/bin/activate
NAME=${HPD_DEMO_CLUSTER:-default}
CR=nemotron-3-nano
python -m hpd_devcluster --name "$NAME" up --real-node --nodes 0
eval "$(python -m hpd_devcluster --name "$NAME" env)"
echo
echo "== nodes (one real node: kubelet + containerd + kube-proxy + CoreDNS here; nvidia.com/gpu advertised, no GPU)"
kubectl get nodes -o wide

echo
echo "== images (built with buildah, imported into the node's containerd: no registry)"
refs=$(python -m hpd_devcluster --name "$NAME" load-images)
ref() { python -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$refs" "$1"; }
OPERATOR=$(ref operator) ROUTER=$(ref router) ENGINE=$(ref engine)
echo "operator: $OPERATOR"
echo "router:   $ROUTER"
echo "engine:   $ENGINE   <- the CPU stand-in (test-only, never released)"

echo
echo "== helm chart (the operator runs as the chart's pod on the real node)"
crd=crd/hybridpddeployments.hybridpd.io
helm upgrade --install hpd charts/hybrid-pd-operator -n hpd-system --create-namespace \
  --set image.repository="${OPERATOR%:*}" --set image.tag="${OPERATOR##*:}" --set image.pullPolicy=Never \
  --set images.vllm="$ENGINE" --set images.router="$ROUTER" --wait --timeout 300s
kubectl wait --for=condition=Established --timeout=30s "$crd"
kubectl -n hpd-system get pods -o wide

echo
echo "== apply examples/$CR.yaml (engine requests sized for this 2-core machine)"
# the chart's rbac.fence (on by default): the operator writes only in namespaces a namespace admin opted in
kubectl label --overwrite namespace default hybridpd.io/operator-writes=allowed >/dev/null
python - "$CR" <<'EOF' | kubectl apply -f -
import json, sys, yaml
cr = yaml.safe_load(open(f"examples/{sys.argv[1]}.yaml"))
for role in ("prefill", "decode"):  # the example asks 4 CPUs and 32 GiB per engine pod; the stand-in needs little
    cr["spec"][role]["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
print(json.dumps(cr))
EOF
fail() {
  echo "FAILED: $1. The CR's conditions (the operator's own reasons):" >&2
  kubectl get hpd "$CR" -o jsonpath='{range .status.conditions[*]}  {.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
  echo "Pods and their reasons:" >&2
  kubectl get pods -A -o jsonpath='{range .items[*]}  {.metadata.namespace}/{.metadata.name} {.status.phase} {range .status.containerStatuses[*]}{.state.waiting.reason}{.state.terminated.reason} {.lastState.terminated.reason}{end} {range .status.conditions[?(@.status=="False")]}{.type}:{.reason} {.message}; {end}{"\n"}{end}' >&2 || true
  echo "Events (Warning):" >&2
  kubectl get events -A --field-selector type=Warning >&2 || true
  echo "operator log tail:" >&2
  kubectl -n hpd-system logs deploy/hpd-hybrid-pd-operator --tail=40 >&2 || true
  exit 1
}
if ! kubectl wait --for=condition=Ready --timeout="${HPD_DEMO_WAIT:-600s}" "hpd/$CR"; then
  fail "not Ready in time"
fi
echo
kubectl get hpd
kubectl get pods -l "app.kubernetes.io/instance=$CR" -o wide

echo
echo "== one completion through the endpoint Service $CR (ClusterIP, routed by kube-proxy) -> router -> prefill -> decode"
ip=$(kubectl get svc "$CR" -o jsonpath='{.spec.clusterIP}')
port=$(kubectl get svc "$CR" -o jsonpath='{.spec.ports[0].port}')
model=$(kubectl get hpd "$CR" -o jsonpath='{.spec.model.name}')
rid="demo-$(date +%s)-$RANDOM"
prompt="Hello from the hybrid-pd demo $rid"
echo "POST http://$ip:$port/v1/completions  prompt: \"$prompt\""
answer=$(curl -sS --fail-with-body --max-time 60 "http://$ip:$port/v1/completions" \
  -H 'Content-Type: application/json' \
  -d "{\"model\": \"$model\", \"prompt\": \"$prompt\", \"max_tokens\": 8}") \
  || fail "the completion failed: $answer"
echo "answer: $answer"

echo
echo "== proof: what each engine pod received for this request (the stand-in records every request: GET /_requests)"
vport=$(kubectl get pods -l "app.kubernetes.io/instance=$CR,app.kubernetes.io/component=prefill" \
  -o jsonpath='{.items[0].spec.containers[0].ports[0].containerPort}')
PROOF=$(cat <<'EOF'
import json, sys
role, pip, prompt = sys.argv[1:4]
hits = [r for r in json.load(sys.stdin) if (r.get("body") or {}).get("prompt") == prompt]
for r in hits:
    body = r["body"]
    kv = json.dumps(body.get("kv_transfer_params"))
    print(f"{role} pod {pip}: {r['path']} X-Request-Id={r.get('request_id')} max_tokens={body.get('max_tokens')}")
    print(f"    kv_transfer_params={kv}")
sys.exit(0 if hits else 1)
EOF
)
proof=0
for role in prefill decode; do
  for pip in $(kubectl get pods -l "app.kubernetes.io/instance=$CR,app.kubernetes.io/component=$role" \
      --field-selector=status.phase=Running -o jsonpath='{.items[*].status.podIP}'); do
    curl -sS --max-time 10 "http://$pip:$vport/_requests" | python -c "$PROOF" "$role" "$pip" "$prompt" && proof=$((proof + 1))
  done
done
[ "$proof" -ge 2 ] || fail "the request did not reach both a prefill and a decode pod"
echo
echo "The engine is the CPU stand-in (fake_vllm): the tokens are made up; the path (Service -> router -> prefill ->"
echo "decode with prefill's kv_transfer_params) is the operator's, run by a real kubelet."
echo "demo took $(( $(date +%s) - start )) s"
echo "The cluster keeps running:  eval \"\$(.venv/bin/python -m hpd_devcluster env)\"; kubectl get hpd"
echo "Stop it:                    make down   (hack/demo-down.sh)"
