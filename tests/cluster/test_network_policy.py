"""The NetworkPolicies the operator applies, EVALUATED (issue #32 item 2): the local control plane has no network
plugin, so the policies are read back from the apiserver as stored and every connection that matters is decided by
cyclonus (tests/cluster/netpol.py) from the real pods' and namespaces' labels.

The claim: a pod labelled like Prometheus in another namespace (any tenant can make one) cannot reach vLLM's API port,
where completions are served, but can reach the runtime port, where vLLM's metrics are relayed; the router reaches
the API; the engines reach each other on every port (API, NIXL side channel, UCX's ephemeral ports)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import T, create, deployment, patch_spec, seed, serving, wait_ready
from .netpol import Pod, Traffic, evaluate

pytestmark = pytest.mark.cluster
PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}
UCX_PORT = 43_117
"""An ephemeral port as UCX's TCP transport opens them (no name, not in any Service)."""


@pytest.fixture()
def other_namespace(api_client: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api_client)
    name = f"tenant-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def stored_policies(api: client.ApiClient, ns: str, name: str) -> list[dict[str, Any]]:
    """The CR's NetworkPolicies exactly as the apiserver stores them (camelCase, defaults filled in)."""
    net = client.NetworkingV1Api(api)
    out = []
    for suffix in ("engines", contract.COMPONENT_ROUTER):
        pol = api.sanitize_for_serialization(net.read_namespaced_network_policy(f"{name}-{suffix}", ns))
        pol["metadata"] = {"name": pol["metadata"]["name"], "namespace": ns}
        out.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **pol})
    return out


def namespace_labels(api: client.ApiClient, ns: str) -> dict[str, str]:
    return dict(client.CoreV1Api(api).read_namespace(ns).metadata.labels or {})


def pod_of(api: client.ApiClient, ns: str, deployment_name: str, ip: str) -> Pod:
    """A pod of the Deployment, labelled as its template says (kwok's fake IPs are never connected to)."""
    labels = dict(deployment(api, ns, deployment_name).spec.template.metadata.labels)
    return Pod(ns, namespace_labels(api, ns), labels, ip)


def port_of(api: client.ApiClient, ns: str, deployment_name: str, name: str) -> int:
    containers = deployment(api, ns, deployment_name).spec.template.spec.containers
    return int(next(p.container_port for c in containers for p in c.ports if p.name == name))


def test_prometheus_labelled_pods_elsewhere_reach_metrics_but_never_completions(
    operator: Operator, api_client: client.ApiClient, namespace: str, other_namespace: str
) -> None:
    ns, name = namespace, "np-eval"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    g = serving(api_client, ns, name)
    prefill = pod_of(api_client, ns, f"{name}-prefill-{g}", "10.0.0.11")
    decode = pod_of(api_client, ns, f"{name}-decode-{g}", "10.0.0.12")
    router = pod_of(api_client, ns, f"{name}-router", "10.0.0.13")
    scraper = Pod(other_namespace, namespace_labels(api_client, other_namespace), PROMETHEUS, "10.0.1.1")
    stranger = Pod(ns, namespace_labels(api_client, ns), {"app": "curl"}, "10.0.1.2")
    http = port_of(api_client, ns, f"{name}-decode-{g}", contract.PORT_NAME_HTTP)
    runtime = port_of(api_client, ns, f"{name}-decode-{g}", contract.PORT_NAME_RUNTIME)
    side = port_of(api_client, ns, f"{name}-decode-{g}", contract.PORT_NAME_SIDE_CHANNEL)
    router_metrics = port_of(api_client, ns, f"{name}-router", contract.PORT_NAME_ROUTER_METRICS)
    router_http = port_of(api_client, ns, f"{name}-router", contract.PORT_NAME_HTTP)  # the retry proxy's
    router_behind = port_of(api_client, ns, f"{name}-router", contract.PORT_NAME_ROUTER_BACKEND)

    cases: list[tuple[str, Traffic, bool]] = [
        ("prometheus-labelled pod elsewhere -> decode API (completions)", Traffic(scraper, decode, http, "http"), False),
        ("prometheus-labelled pod elsewhere -> prefill API", Traffic(scraper, prefill, http, "http"), False),
        ("prometheus-labelled pod elsewhere -> decode side channel", Traffic(scraper, decode, side, "nixl-side"), False),
        ("prometheus-labelled pod elsewhere -> decode runtime (metrics)", Traffic(scraper, decode, runtime, "runtime"), True),
        ("prometheus-labelled pod elsewhere -> router metrics", Traffic(scraper, router, router_metrics, "metrics"), True),
        ("router -> decode API", Traffic(router, decode, http, "http"), True),
        ("router -> prefill API", Traffic(router, prefill, http, "http"), True),
        ("router -> decode side channel", Traffic(router, decode, side, "nixl-side"), False),
        ("prefill -> decode side channel", Traffic(prefill, decode, side, "nixl-side"), True),
        ("decode -> prefill API (pair check)", Traffic(decode, prefill, http, "http"), True),
        ("decode -> prefill UCX ephemeral port", Traffic(decode, prefill, UCX_PORT), True),
        ("prefill -> decode UCX ephemeral port", Traffic(prefill, decode, UCX_PORT), True),
        ("any pod -> router endpoint", Traffic(stranger, router, router_http, "http"), True),
        ("any pod -> vllm-router behind the retry proxy", Traffic(stranger, router, router_behind, "router-http"), False),
        ("unlabelled pod in the namespace -> decode API", Traffic(stranger, decode, http, "http"), False),
        ("unlabelled pod in the namespace -> decode runtime", Traffic(stranger, decode, runtime, "runtime"), False),
    ]  # fmt: skip
    policies = stored_policies(api_client, ns, name)
    verdicts = evaluate(policies, [t for _, t, _ in cases])
    wrong = [f"{what}: allowed={got}, want {want}" for (what, _, want), got in zip(cases, verdicts, strict=True)
             if got != want]  # fmt: skip
    assert not wrong, "\n".join(wrong)

    # The evaluator is not blind to the hole: the policy as it was before issue #32 (Prometheus also admitted on the
    # API port) lets the labelled pod reach completions.
    before = copy.deepcopy(policies)
    prom_rule = before[0]["spec"]["ingress"][2]
    assert [p["port"] for p in prom_rule["ports"]] == ["runtime"]
    prom_rule["ports"].insert(0, {"protocol": "TCP", "port": "http"})
    assert evaluate(before, [cases[0][1]]) == [True]

    # restrictEgress: the engines still reach each other on every port, and the scraper still only the runtime port
    patch_spec(api_client, ns, name, {"networkPolicy": {"restrictEgress": True}})
    net = client.NetworkingV1Api(api_client)
    wait_for(
        lambda: "Egress" in net.read_namespaced_network_policy(f"{name}-engines", ns).spec.policy_types,
        T,
        what="the egress rules applied",
    )
    again = [cases[i] for i in (0, 3, 8, 9, 10, 11)]
    assert evaluate(stored_policies(api_client, ns, name), [t for _, t, _ in again]) == [w for _, _, w in again]
