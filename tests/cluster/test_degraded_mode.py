"""Degraded mode against the real control plane (spec.router.degradedMode, hpd_operator.builders.fallback): with no
Ready decode of the serving generation the endpoint Service `<cr>` selects its prefill pods directly, and the other
way round; back to the router once the role is Ready again. The engines run on a node whose kubelet is the test
(tests/cluster/kubelet.py): it decides when each pod is Ready, as the runtime's warmup and pair check would. No
connection to any pod."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_operator.api.names import selector_labels, serving_selector
from hpd_runtime import contract

from .conftest import Operator
from .kube import T, cond, get_cr, hold, kubectl, wait_cr
from .kubelet import ManualNode
from .test_rollout import DECODE, PREFILL, engine_pods, reasons, start

pytestmark = pytest.mark.cluster


@pytest.fixture()
def node(api_client: client.ApiClient, devcluster: Any) -> Iterator[ManualNode]:
    n = ManualNode(api_client, gpus=16).start()
    yield n
    n.stop()
    assert not n.errors, n.errors


def service_selector(api: client.ApiClient, ns: str, name: str) -> dict[str, str]:
    return dict(client.CoreV1Api(api).read_namespaced_service(name, ns).spec.selector or {})


def fallback_policy(api: client.ApiClient, ns: str, name: str) -> dict[str, str] | None:
    """The podSelector of `<cr>-fallback`, None when it does not exist."""
    try:
        pol = client.NetworkingV1Api(api).read_namespaced_network_policy(f"{name}-fallback", ns)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    return dict(pol.spec.pod_selector.match_labels or {})


def set_role(node: ManualNode, gen: str, role: str, ready: bool, count: int | None = None) -> None:
    """Mark `count` (default: every) pod of `role` in `gen` Ready or not, as its readiness probe would."""
    pods = engine_pods(node, gen, role)
    for p in pods[: len(pods) if count is None else count]:
        node.set_ready(str(p.metadata.name), ready)


def degraded(reason: str) -> Any:
    return lambda c: cond(c, "Degraded").get("reason") == reason


def not_degraded_by_fallback(c: dict[str, Any]) -> bool:
    return cond(c, "Degraded").get("reason") not in ("DecodeUnavailable", "PrefillUnavailable")


def test_no_ready_decode_serves_on_prefill_no_ready_prefill_on_decode_and_back_to_the_router(
    operator: Operator, api_client: client.ApiClient, namespace: str, node: ManualNode, kubeconfig: Path
) -> None:
    ns, name, api = namespace, "fallback", api_client
    g1 = start(api, ns, name, node)
    router = selector_labels(name, contract.COMPONENT_ROUTER)
    assert service_selector(api, ns, name) == router
    assert get_cr(api, ns, name)["status"]["serving"] == "router" and fallback_policy(api, ns, name) is None

    # every decode pod leaves: the endpoint serves on generation 1's prefill pods
    set_role(node, g1, "decode", ready=False)
    cr = wait_cr(api, ns, name, degraded("DecodeUnavailable"), "Degraded=DecodeUnavailable")
    deg = cond(cr, "Degraded")
    assert deg["status"] == "True" and deg["message"].startswith("serving colocated on prefill"), deg
    assert cr["status"]["serving"] == "colocated on prefill" and cr["status"]["phase"] == "Degraded"
    on_prefill = serving_selector(name, "prefill", g1, False)
    wait_for(lambda: service_selector(api, ns, name) == on_prefill, T, what="Service selects prefill pods")
    assert fallback_policy(api, ns, name) == on_prefill  # those pods admit what the router admits
    wide = kubectl(kubeconfig, "get", "hpd", name, "-n", ns, "-o", "wide").stdout
    assert "colocated on prefill" in wide, wide
    # the decode Deployment keeps its replicas: degraded mode scales nothing
    dep = client.AppsV1Api(api).list_namespaced_deployment(ns, label_selector=f"{contract.LABEL_COMPONENT}=decode")
    assert [d.spec.replicas for d in dep.items] == [DECODE]

    # one decode Ready again (its pair check passed): back to the router
    set_role(node, g1, "decode", ready=True, count=1)
    wait_cr(api, ns, name, not_degraded_by_fallback, "Degraded no longer DecodeUnavailable")
    wait_for(lambda: service_selector(api, ns, name) == router, T, what="Service selects the router again")
    wait_for(lambda: fallback_policy(api, ns, name) is None, T, what="<cr>-fallback removed")
    assert get_cr(api, ns, name)["status"]["serving"] == "router"

    # the symmetric case: no Ready prefill, the endpoint serves on the Ready decode pods
    set_role(node, g1, "decode", ready=True)
    set_role(node, g1, "prefill", ready=False)
    cr = wait_cr(api, ns, name, degraded("PrefillUnavailable"), "Degraded=PrefillUnavailable")
    assert cond(cr, "Degraded")["message"].startswith("serving colocated on decode")
    on_decode = serving_selector(name, "decode", g1, False)
    wait_for(lambda: service_selector(api, ns, name) == on_decode, T, what="Service selects decode pods")
    set_role(node, g1, "prefill", ready=True, count=PREFILL)
    wait_cr(api, ns, name, lambda c: cond(c, "Ready").get("status") == "True", "Ready again")
    wait_for(lambda: service_selector(api, ns, name) == router, T, what="Service selects the router again")

    # one Event per switch (posted right after the status write the waits above saw: wait for the last one)
    def switches() -> tuple[int, int, int]:
        seen = reasons(api, ns, name)
        return seen.count("DecodeUnavailable"), seen.count("PrefillUnavailable"), seen.count("PDRestored")

    wait_for(lambda: switches()[2] >= 2, T, what="the second PDRestored Event")
    hold(lambda: switches() == (1, 1, 2), 2.0, "one Event per switch, none more")


def test_degraded_mode_off_keeps_the_router_as_the_endpoint(
    operator: Operator, api_client: client.ApiClient, namespace: str, node: ManualNode
) -> None:
    ns, name, api = namespace, "failfast", api_client
    g1 = start(api, ns, name, node, router={"degradedMode": False})
    router = selector_labels(name, contract.COMPONENT_ROUTER)
    set_role(node, g1, "decode", ready=False)
    wait_cr(api, ns, name, lambda c: cond(c, "DecodeReady").get("status") == "False", "DecodeReady=False")
    hold(lambda: service_selector(api, ns, name) == router, 2.0, "the Service stays on the router")
    cr = get_cr(api, ns, name)
    assert not_degraded_by_fallback(cr) and cr["status"]["serving"] == "router"
    assert fallback_policy(api, ns, name) is None
