"""Degraded mode's decision and its report (pure): hpd_operator.builders.fallback, the endpoint Service, the
`<cr>-fallback` NetworkPolicy, the Degraded condition and its Events. tests/cluster/test_degraded_mode.py runs it
against the real apiserver."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import yaml

from hpd_operator import cache, podevents
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


def pod(role: str, ready: bool, gen: str = GEN.hash, deleting: bool = False, name: str = "") -> dict[str, Any]:
    labels = {contract.LABEL_INSTANCE: "m", contract.LABEL_COMPONENT: role, contract.LABEL_GENERATION: gen}
    md: dict[str, Any] = {"name": name or f"{role}-x", "uid": f"uid-{name or role}", "labels": labels}
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


# --- back to P/D only once a decode has pair-checked a Ready prefill ---------------------------------------------
BOTH = {"prefill": [pod("prefill", True, name="p-new")], "decode": [pod("decode", True, name="d")]}
ROUTER_UP = [pod("router", True)]


def test_a_fallback_on_decode_holds_until_a_decode_lists_a_ready_prefill_as_pair_checked() -> None:
    """The replacement prefill is Ready and so is the router, but decode (Ready all along) checks a new prefill only
    at its monitor's next poll: on the real node P/D through the new prefill resumed 8.6 s before that check passed.
    The endpoint stays on decode until a Ready decode's report lists one of the Ready prefill pods."""
    fb = choose(cr(), PLAN, BOTH, router_pods=ROUTER_UP, serving="colocated on decode", verified_prefills=[frozenset()])
    assert fb is not None and (fb.role, fb.missing, fb.reason, fb.serving) == (
        "decode", "prefill", Reason.PREFILL_UNAVAILABLE, "colocated on decode")  # fmt: skip
    assert fb.awaiting_pair_check and not fb.awaiting_router
    assert fb.message == (
        "serving colocated on decode: prefill pods of generation 1 are Ready again; the endpoint selects its decode "
        "pods directly until a decode has passed its pair check with one of them"
    )
    # listed: back to the router
    done = [frozenset({"uid-p-new"})]
    assert (
        choose(cr(), PLAN, BOTH, router_pods=ROUTER_UP, serving="colocated on decode", verified_prefills=done) is None
    )
    # one decode of two listed it: a decode has passed (the router sends to that one too, as it would to any Ready pod)
    some = [frozenset(), frozenset({"uid-p-new"})]
    assert (
        choose(cr(), PLAN, BOTH, router_pods=ROUTER_UP, serving="colocated on decode", verified_prefills=some) is None
    )
    # the listed pod is being deleted, another prefill is Ready but not listed: still holds
    leaving = [pod("prefill", True, deleting=True, name="p-new"), pod("prefill", True, name="p-2")]
    fb = choose(cr(), PLAN, {**BOTH, "prefill": leaving}, router_pods=ROUTER_UP, serving="colocated on decode",
                verified_prefills=done)  # fmt: skip
    assert fb is not None and fb.awaiting_pair_check
    # listed but of another generation: no Ready prefill of the routed one, the plain fallback as before
    other = [pod("prefill", True, gen="other", name="p-new")]
    fb = choose(cr(), PLAN, {**BOTH, "prefill": other}, router_pods=ROUTER_UP, serving="colocated on decode",
                verified_prefills=done)  # fmt: skip
    assert (
        fb is not None
        and not fb.awaiting_pair_check
        and fb.message.startswith("serving colocated on decode: no Ready prefill pod of generation 1")
    )
    # both pending: the message names both
    fb = choose(cr(), PLAN, BOTH, router_pods=[pod("router", False)], serving="colocated on decode",
                verified_prefills=[frozenset()])  # fmt: skip
    assert fb is not None and fb.awaiting_pair_check and fb.awaiting_router
    assert fb.message.endswith("until a decode has passed its pair check with one of them and a router pod is Ready")


def test_no_report_with_the_list_holds_nothing_and_the_hold_never_starts_a_fallback() -> None:
    """None (no Ready decode's report lists its peers: an older runtime image, or no report yet): the switch back as
    before, so a version skew never keeps the endpoint on decode. And like the router hold, it only keeps a fallback
    that is in force."""
    assert choose(cr(), PLAN, BOTH, router_pods=ROUTER_UP, serving="colocated on decode") is None
    assert (
        choose(cr(), PLAN, BOTH, router_pods=ROUTER_UP, serving="colocated on decode", verified_prefills=None) is None
    )
    for serving in ("router", None):
        assert choose(cr(), PLAN, BOTH, router_pods=ROUTER_UP, serving=serving, verified_prefills=[frozenset()]) is None
    off = cr(degradedMode=False)
    assert choose(off, PLAN, BOTH, router_pods=ROUTER_UP, serving="colocated on decode",
                  verified_prefills=[frozenset()]) is None  # fmt: skip


def test_a_fallback_on_prefill_is_not_held_by_the_prefill_list() -> None:
    """The decode-missing case is gated by decode's readiness already (a returning decode is Ready only after its
    pair check): the list, which names prefill peers, holds nothing there."""
    for verified in ([frozenset()], None):
        assert choose(cr(), PLAN, BOTH, router_pods=ROUTER_UP, serving="colocated on prefill",
                      verified_prefills=verified) is None  # fmt: skip
    fb = choose(cr(), PLAN, BOTH, router_pods=[], serving="colocated on prefill", verified_prefills=[frozenset()])
    assert fb is not None and fb.role == "prefill" and fb.awaiting_router and not fb.awaiting_pair_check


def test_the_lease_reports_reach_the_hold_end_to_end() -> None:
    """From the kv-reporter Lease's annotations (as the cache trims them) through podevents to the decision: the
    report that lists the replacement prefill's IP releases the hold; one that lists only the pod it replaced, which
    had the same IP, does not."""
    new = pod("prefill", True, name="p-new")
    new["metadata"]["creationTimestamp"], new["status"]["podIP"] = "2026-12-03T10:00:00Z", "10.0.0.9"
    decode = pod("decode", True, name="d")
    pods = {"prefill": [new], "decode": [decode]}

    def decide(verified_time: str) -> Any:
        doc = {"uid": "uid-d", "prefills": [{"ip": "10.0.0.9", "verifiedTime": verified_time}]}
        lease = cache.trim_child(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": "m-kv-reporter",
                    "annotations": {contract.ANNOTATION_KV_REPORT_PREFIX + "uid-d": json.dumps(doc)},
                },
            }
        )
        verified = podevents.verified_prefills(pods["decode"], pods["prefill"], lease["reports"])
        return choose(
            cr(), PLAN, pods, router_pods=ROUTER_UP, serving="colocated on decode", verified_prefills=verified
        )

    assert decide("2026-12-03T10:00:20Z") is None
    held = decide("2026-12-03T09:00:00Z")  # the earlier pod's check, an hour before this pod was created
    assert held is not None and held.awaiting_pair_check
    trimmed = cache.trim_pod({**new, "spec": {"nodeName": "n"}})  # the cache keeps what the match needs
    assert (
        trimmed["status"]["podIP"] == "10.0.0.9" and trimmed["metadata"]["creationTimestamp"] == "2026-12-03T10:00:00Z"
    )


def test_a_report_on_the_lease_queues_the_cr() -> None:
    """The hold releases when the report lands: a change of the Lease's annotations (decode's patch) is a watch event
    on a child, which stores the report and queues the CR (handlers.Watches.child_event)."""
    from types import SimpleNamespace

    from hpd_operator.handlers import Watches

    queued: list[Any] = []
    ctl = SimpleNamespace(cache=cache.Cache(), queue=SimpleNamespace(add=queued.append))
    ctl.cache.put_cr({"metadata": {"name": "m", "namespace": "ns", "uid": "cr-uid", "resourceVersion": "1"}}, "m")
    labels = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY, contract.LABEL_INSTANCE: "m"}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
        "name": "m-kv-reporter", "namespace": "ns", "uid": "l", "resourceVersion": "7", "labels": labels,
        "annotations": {contract.ANNOTATION_KV_REPORT_PREFIX + "uid-d": '{"uid":"uid-d","prefills":[]}'}}}  # fmt: skip
    w = Watches(cast("Any", ctl))
    asyncio.run(w.index_child(cast("Any", lease)))
    asyncio.run(w.child_event("MODIFIED", cast("Any", lease)))
    assert queued == [("ns", "m")]
    held = ctl.cache.child("ns", "coordination.k8s.io/v1", "Lease", "m-kv-reporter")
    assert held is not None and held["reports"] == {"uid-d": '{"uid":"uid-d","prefills":[]}'}


def test_data_path_verified_counts_the_ready_prefills_decode_has_not_checked_yet() -> None:
    """DataPathVerified stays True (decode is Ready: it passed with every prefill that was Ready when it checked) but
    no longer claims every Ready prefill while the reports show one unchecked."""
    from tests.unit.test_status import ALL_READY, conds, profile_of, spec, status

    s = spec()
    for checked, words in (
        ((0, 1), "with 0 of 1 Ready prefill pods (the rest at decode's next re-check);"),
        ((1, 2), "with 1 of 2 Ready prefill pods (the rest at decode's next re-check);"),
        ((2, 2), "with every Ready prefill;"),
        (None, "with every Ready prefill;"),
    ):
        c = conds(status(s, ALL_READY, profile=profile_of(s), prefills_checked=checked))["DataPathVerified"]
        assert c["status"] == "True" and c["reason"] == "Verified" and words in c["message"], (checked, c)
