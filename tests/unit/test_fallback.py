"""Degraded mode's decision and its report (pure): hpd_operator.builders.fallback, the endpoint Service, the
`<cr>-fallback` NetworkPolicy, the Degraded condition and its Events. tests/cluster/test_degraded_mode.py runs it
against the real apiserver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpd_operator.api.parse import parse_cr
from hpd_operator.builders import build_all
from hpd_operator.builders.fallback import choose
from hpd_operator.builders.router import build_router_service
from hpd_operator.conditions import Reason
from hpd_operator.generations import Generation, Plan
from hpd_operator.profile import compute_profile
from hpd_operator.status import transitions
from hpd_operator.validation import validate
from hpd_runtime import contract

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nemotron-3-nano.yaml"
GEN = Generation("abc123", 1)
PLAN = Plan(desired=GEN, route=GEN, keep=frozenset({GEN.hash}), latest=1, served=frozenset({GEN.hash}))


def cr(**router: Any) -> Any:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": "m", "namespace": "ns"}
    doc["spec"].setdefault("router", {}).update(router)
    return parse_cr(doc)


def pod(role: str, ready: bool, gen: str = GEN.hash, deleting: bool = False) -> dict[str, Any]:
    labels = {contract.LABEL_INSTANCE: "m", contract.LABEL_COMPONENT: role, contract.LABEL_GENERATION: gen}
    md: dict[str, Any] = {"name": f"{role}-x", "labels": labels}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": md, "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_no_ready_decode_serves_on_prefill_and_the_other_way_round() -> None:
    fb = choose(cr(), PLAN, {"prefill": [pod("prefill", True)], "decode": [pod("decode", False)]})
    assert fb is not None and (fb.role, fb.reason, fb.serving) == ("prefill", Reason.DECODE_UNAVAILABLE,
                                                                   "colocated on prefill")  # fmt: skip
    assert fb.message.startswith("serving colocated on prefill: no Ready decode pod of generation 1")
    fb = choose(cr(), PLAN, {"prefill": [pod("prefill", True, deleting=True)], "decode": [pod("decode", True)]})
    assert fb is not None and (fb.role, fb.reason) == ("decode", Reason.PREFILL_UNAVAILABLE)


def test_no_fallback_with_both_roles_none_off_or_before_the_generation_served() -> None:
    both = {"prefill": [pod("prefill", True)], "decode": [pod("decode", True)]}
    none = {"prefill": [pod("prefill", False)], "decode": [pod("decode", False)]}
    only_prefill = {"prefill": [pod("prefill", True)], "decode": [pod("decode", False)]}
    assert choose(cr(), PLAN, both) is None and choose(cr(), PLAN, none) is None
    assert choose(cr(degradedMode=False), PLAN, only_prefill) is None
    starting = Plan(desired=GEN, route=GEN, keep=frozenset({GEN.hash}), latest=1)  # never served: decode pair-checks
    assert choose(cr(), starting, only_prefill) is None
    other = {"prefill": [pod("prefill", True)], "decode": [pod("decode", True, gen="other")]}  # never mixes
    fb = choose(cr(), PLAN, other)
    assert fb is not None and fb.role == "prefill"


def test_a_fallback_in_force_holds_until_a_router_pod_is_ready() -> None:
    """Back to the router only once a router pod is Ready: before, the Service would select only NotReady router
    pods and kube-proxy would refuse every connection (seen on the real node: 140 of 144 refused)."""
    both = {"prefill": [pod("prefill", True)], "decode": [pod("decode", True)]}
    waiting, up = [pod("router", False)], [pod("router", False), pod("router", True)]
    fb = choose(cr(), PLAN, both, router_pods=waiting, serving="colocated on decode")
    assert fb is not None and (fb.role, fb.missing, fb.reason, fb.serving) == (
        "decode", "prefill", Reason.PREFILL_UNAVAILABLE, "colocated on decode")  # fmt: skip
    assert fb.awaiting_router and fb.message == (
        "serving colocated on decode: prefill pods of generation 1 are Ready again; the endpoint selects its decode "
        "pods directly until a router pod is Ready"
    )
    assert choose(cr(), PLAN, both, router_pods=up, serving="colocated on decode") is None
    fb = choose(cr(), PLAN, both, router_pods=[], serving="colocated on prefill")  # no router pod at all: hold
    assert fb is not None and (fb.role, fb.awaiting_router) == ("prefill", True)
    # never a fallback that was not in force (a router that is slow to start, a router crash), nor one whose role
    # has no Ready pod left, nor when degraded mode is off
    assert choose(cr(), PLAN, both, router_pods=waiting, serving="router") is None
    assert choose(cr(), PLAN, both, router_pods=waiting, serving=None) is None
    only_prefill_ready = {"prefill": [pod("prefill", True)], "decode": [pod("decode", False)]}
    fb = choose(cr(), PLAN, only_prefill_ready, router_pods=waiting, serving="colocated on decode")
    assert fb is not None and (fb.role, fb.awaiting_router) == ("prefill", False)
    assert choose(cr(degradedMode=False), PLAN, both, router_pods=waiting, serving="colocated on decode") is None


def test_the_endpoint_selects_the_serving_pods_and_opens_their_port() -> None:
    c = cr()
    fb = choose(c, PLAN, {"prefill": [pod("prefill", True)], "decode": []})
    svc = build_router_service(c, fb)
    want = {contract.LABEL_INSTANCE: "m", contract.LABEL_COMPONENT: "prefill", contract.LABEL_GENERATION: GEN.hash}
    assert {k: svc["spec"]["selector"].get(k) for k in want} == want
    assert svc["spec"]["ports"][0]["targetPort"] == contract.PORT_NAME_HTTP  # the engines' vLLM port has that name
    profile = compute_profile(validate(c))
    names = {d["metadata"]["name"]: d for d in build_all(c, profile, PLAN, fallback=fb)}
    pol = names["m-fallback"]
    assert pol["spec"]["podSelector"]["matchLabels"] == svc["spec"]["selector"]
    assert pol["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": contract.PORT_NAME_HTTP}]}]
    assert "m-fallback" not in {d["metadata"]["name"] for d in build_all(c, profile, PLAN)}
    assert build_router_service(c)["spec"]["selector"][contract.LABEL_COMPONENT] == contract.COMPONENT_ROUTER


def test_one_event_per_switch() -> None:
    ok = [{"type": "Degraded", "status": "False", "reason": "AsExpected", "message": ""}]
    down = [{"type": "Degraded", "status": "True", "reason": "DecodeUnavailable", "message": "serving colocated"}]
    assert transitions(ok, down) == [("Warning", "DecodeUnavailable", "serving colocated")]
    assert transitions(down, down) == []
    assert [r for _, r, _ in transitions(down, ok)] == ["PDRestored"]


def test_the_colocated_gauge_follows_status_serving() -> None:
    from prometheus_client import generate_latest

    from hpd_operator import metrics

    def gauge(role: str) -> str:
        return f'hpd_operator_serving_colocated{{hybridpddeployment="fb",namespace="nsf",role="{role}"}}'

    metrics.record_status("nsf", "fb", {"phase": "Degraded", "serving": "colocated on prefill"})
    text = generate_latest().decode()
    assert f"{gauge('prefill')} 1.0" in text and f"{gauge('decode')} 0.0" in text
    metrics.record_status("nsf", "fb", {"phase": "Ready", "serving": "router"})
    text = generate_latest().decode()
    assert f"{gauge('prefill')} 0.0" in text and f"{gauge('decode')} 0.0" in text
    metrics.forget("nsf", "fb")


def test_a_ready_pod_on_a_lost_node_does_not_count() -> None:
    decode = pod("decode", True)
    decode["spec"] = {"nodeName": "gone"}
    pods = {"prefill": [pod("prefill", True)], "decode": [decode]}
    assert choose(cr(), PLAN, pods, nodes=frozenset({"here"})) is not None  # as the status counts it: lost
    assert choose(cr(), PLAN, pods, nodes=frozenset({"gone"})) is None
    assert choose(cr(), PLAN, pods, nodes=None) is None  # nodes not watched: the pod's own condition
