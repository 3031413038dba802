"""scaling.py (pure): the bounds each role's HPA gets, the ratio kept by narrowing them, the autoscaler's report; the
HPA builder and the Deployment without replicas."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hpd_operator.api.models import HybridPDDeploymentSpec
from hpd_operator.api.rules import violations
from hpd_operator.builders.autoscaling import build_autoscalers
from hpd_operator.builders.engine import build_engine_deployment, build_engine_pdb
from hpd_operator.generations import Generation
from hpd_operator.render import render
from hpd_operator.scaling import DOWN, HOLD, UP, Bounds, autoscaler_status, compute_bounds, decision, wants

M = {"name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"}


def spec(pmax: int = 4, dmax: int = 8, rmin: float | None = 1, rmax: float | None = 2, **extra: Any) -> Any:
    raw: dict[str, Any] = {
        "model": M,
        "prefill": {"autoscaling": {"minReplicas": 1, "maxReplicas": pmax}},
        "decode": {"autoscaling": {"minReplicas": 1, "maxReplicas": dmax}},
        **extra,
    }
    if rmin is not None or rmax is not None:
        raw["ratio"] = {k: v for k, v in (("minDecodePerPrefill", rmin), ("maxDecodePerPrefill", rmax)) if v}
    return HybridPDDeploymentSpec.model_validate(raw)


def hpa(desired: int, current: int, limited: str | None = None) -> dict[str, Any]:
    conds = [{"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}]
    if limited:
        conds.append({"type": "ScalingLimited", "status": "True", "reason": limited, "message": "limited"})
    return {"status": {"desiredReplicas": desired, "currentReplicas": current, "conditions": conds}}


def test_without_a_ratio_each_hpa_gets_the_users_range() -> None:
    b = compute_bounds(spec(rmin=None, rmax=None), {"prefill": 3, "decode": 1}, {})
    assert b == {"prefill": Bounds(1, 4), "decode": Bounds(1, 8)}


def test_an_hpa_wants_up_down_or_nothing_from_its_status() -> None:
    assert wants(hpa(3, 2)) == UP and wants(hpa(1, 2)) == DOWN and wants(hpa(2, 2)) == HOLD and wants(None) == HOLD
    assert wants(hpa(2, 2, "TooManyReplicas")) == UP and wants(hpa(2, 2, "TooFewReplicas")) == DOWN


def test_prefill_held_by_the_band_pulls_decode_up_first() -> None:
    b = compute_bounds(spec(), {"prefill": 1, "decode": 1}, {"prefill": hpa(1, 1, "TooManyReplicas")})
    assert b["prefill"].max_replicas == 1  # 1 decode allows 1 prefill at most (min 1 decode per prefill)
    assert b["decode"].min_replicas == 2 and "decode raised to 2 first" in str(b["decode"].note)


def test_decode_held_by_the_band_pulls_prefill_up_first() -> None:
    b = compute_bounds(spec(), {"prefill": 1, "decode": 2}, {"decode": hpa(2, 2, "TooManyReplicas")})
    assert b["decode"].max_replicas == 2 and b["prefill"].min_replicas == 2


def test_both_roles_shrink_together_when_neither_wants_more() -> None:
    b = compute_bounds(spec(), {"prefill": 3, "decode": 4}, {"prefill": hpa(1, 3), "decode": hpa(1, 4)})
    assert b["prefill"] == Bounds(2, 3, b["prefill"].note) and (b["decode"].min_replicas, b["decode"].max_replicas) == (
        3,
        4,
    )


def test_a_role_that_holds_leaves_the_other_the_whole_band_at_its_size() -> None:
    """#37: prefill held at 3 on its queue while idle decode, held at the band's floor (3), wanted to shrink: the
    bounds said "both may only shrink", so decode's max stayed 3 and it could not follow its own load until another
    reconcile. Now the holding role stays and the other may go anywhere in the band at that size."""
    b = compute_bounds(
        spec(), {"prefill": 3, "decode": 3}, {"prefill": hpa(3, 3), "decode": hpa(1, 3, "TooFewReplicas")}
    )
    assert (b["prefill"].min_replicas, b["prefill"].max_replicas) == (3, 3)
    assert (b["decode"].min_replicas, b["decode"].max_replicas) == (3, 6), b["decode"]
    b = compute_bounds(spec(), {"prefill": 2, "decode": 4}, {"prefill": hpa(1, 2), "decode": hpa(4, 4)})
    assert (b["prefill"].min_replicas, b["prefill"].max_replicas) == (2, 4) and b["decode"].max_replicas == 4


def test_a_pair_outside_the_band_is_restored_by_growing_never_by_shrinking() -> None:
    b = compute_bounds(spec(), {"prefill": 3, "decode": 1}, {})
    assert b["decode"].min_replicas == 3 and b["prefill"] == Bounds(3, 3, b["prefill"].note)
    b = compute_bounds(spec(), {"prefill": 1, "decode": 5}, {})
    assert b["prefill"].min_replicas == 3 and (b["decode"].min_replicas, b["decode"].max_replicas) == (5, 5)


@settings(max_examples=400, deadline=None)
@given(
    p=st.integers(1, 8), d=st.integers(1, 16), rmin=st.sampled_from([0.5, 1.0, 1.5, 2.0]),
    width=st.sampled_from([2.0, 2.5, 4.0]), wp=st.sampled_from([UP, DOWN, HOLD]), wd=st.sampled_from([UP, DOWN, HOLD]),
)  # fmt: skip
def test_from_any_pair_in_the_band_every_move_either_hpa_may_make_stays_in_it(
    *, p: int, d: int, rmin: float, width: float, wp: int, wd: int
) -> None:
    rmax = rmin * width
    if not rmin * p <= d <= rmax * p:
        return
    s = spec(pmax=8, dmax=16, rmin=rmin, rmax=rmax)
    reasons = {UP: "TooManyReplicas", DOWN: "TooFewReplicas", HOLD: None}
    b = compute_bounds(
        s, {"prefill": p, "decode": d}, {"prefill": hpa(p, p, reasons[wp]), "decode": hpa(d, d, reasons[wd])}
    )
    pb, db = b["prefill"], b["decode"]
    assert pb.min_replicas <= p <= pb.max_replicas or wd == UP  # a pull may raise only the other role's minimum
    for pp in (pb.min_replicas, pb.max_replicas):
        for dd in (db.min_replicas, db.max_replicas):
            assert rmin * pp - 1e-9 <= dd <= rmax * pp + 1e-9, (p, d, rmin, rmax, wp, wd, b)


def test_the_report_names_the_decision_and_each_signal_against_its_target() -> None:
    s = spec(rmin=None, rmax=None)
    a = s.decode.autoscaling
    h = hpa(4, 4, "TooManyReplicas")
    h["status"]["currentMetrics"] = [
        {"type": "External", "external": {"metric": {"name": "hpd_vllm_kv_cache_usage"}, "current": {"averageValue": "950m"}}},
    ]  # fmt: skip
    out = autoscaler_status("decode", a, Bounds(1, 8), h, 4)
    assert out["summary"] == "4->4 AtMax" and out["signals"] == ["kvCacheUsage 0.95/0.7"]
    assert decision(h, Bounds(1, 4, "held"), a)[0] == "HeldByRatio"
    assert autoscaler_status("decode", a, Bounds(1, 8), None, 2)["summary"] == "2->2 Pending"
    # no metrics yet: the HPA's status says desiredReplicas 0, yet it scales nothing; the report keeps the count
    blind = {"status": {"desiredReplicas": 0, "currentReplicas": 3, "conditions": [
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetExternalMetric"}]}}  # fmt: skip
    out = autoscaler_status("decode", a, Bounds(1, 8), blind, 3)
    assert (out["summary"], out["desiredReplicas"]) == ("3->3 NoMetrics", 3), out


def test_a_target_the_hpa_cannot_hold_is_refused_by_the_schema() -> None:
    """A target under 0.001 rounds to 0 milli-units, which the HPA refuses after the CRD admitted it."""
    import pydantic
    import pytest

    metric = {"signal": "kvCacheUsage", "target": 1e-300}
    bad = {"model": M, "decode": {"autoscaling": {"maxReplicas": 2, "metrics": [metric]}}}
    with pytest.raises(pydantic.ValidationError, match="target"):
        HybridPDDeploymentSpec.model_validate(bad)
    metric["target"] = 0.001
    doc = {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment",
           "metadata": {"name": "a", "namespace": "n"}, "spec": bad}  # fmt: skip
    (h,) = [o for o in render([doc]) if o["kind"] == "HorizontalPodAutoscaler"]
    assert h["spec"]["metrics"][0]["external"]["target"]["averageValue"] == "1m"


def test_an_autoscaling_role_gets_an_hpa_on_external_metrics_and_its_deployment_no_replicas() -> None:
    doc = {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment", "metadata": {"name": "a", "namespace": "n"},
           "spec": {"model": M, "prefill": {"autoscaling": {"maxReplicas": 2, "metrics": [
               {"signal": "waitingRequests", "target": 4}]}}}}  # fmt: skip
    objs = {(o["kind"], o["metadata"]["labels"]["app.kubernetes.io/component"]): o for o in render([doc])}
    h = objs[("HorizontalPodAutoscaler", "prefill")]
    dep = objs[("Deployment", "prefill")]  # the generation's Deployment: <cr>-prefill-<hash>
    assert h["metadata"]["name"] == h["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert h["metadata"]["labels"]["hybridpd.io/generation"] == dep["metadata"]["labels"]["hybridpd.io/generation"]
    ext = h["spec"]["metrics"][0]["external"]
    assert ext["metric"] == {"name": "hpd_vllm_waiting_requests",
                             "selector": {"matchLabels": {"hybridpddeployment": "a", "role": "prefill"}}}  # fmt: skip
    assert ext["target"] == {"type": "AverageValue", "averageValue": "4"}
    assert "replicas" not in dep["spec"]
    assert objs[("Deployment", "decode")]["spec"]["replicas"] == 1  # decode does not autoscale
    assert ("PodDisruptionBudget", "prefill") in objs  # it may reach 2 replicas


def test_decode_defaults_follow_the_kv_cache_and_the_running_batch() -> None:
    from hpd_operator.api.models import HybridPDDeployment

    cr = HybridPDDeployment.model_validate({"metadata": {"name": "a"}, "spec": {"model": M, "decode": {
        "autoscaling": {"maxReplicas": 3}}}})  # fmt: skip
    gen = Generation("0123abcd", 1)
    (h,) = build_autoscalers(cr, gen)
    assert h["metadata"]["name"] == "a-decode-0123abcd"
    assert [(m["external"]["metric"]["name"], m["external"]["target"]["averageValue"]) for m in h["spec"]["metrics"]] == [
        ("hpd_vllm_kv_cache_usage", "700m"), ("hpd_vllm_running_requests", "32"),
    ]  # fmt: skip
    assert h["spec"]["behavior"]["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    assert build_engine_pdb(cr, "decode", gen) is not None and build_engine_pdb(cr, "prefill", gen) is None
    assert build_engine_deployment is not None


def test_every_invalid_autoscaling_spec_names_its_field() -> None:
    cases = {
        "spec.decode.autoscaling.minReplicas": {"decode": {"replicas": 3, "autoscaling": {"minReplicas": 3, "maxReplicas": 2}}},
        "spec.decode.replicas": {"decode": {"replicas": 5, "autoscaling": {"maxReplicas": 4}}},
        "spec.ratio": {"ratio": {"maxDecodePerPrefill": 2}},
    }  # fmt: skip
    from hpd_operator.validation import check_spec

    for field, extra in cases.items():
        s = HybridPDDeploymentSpec.model_validate({"model": M, **extra})
        assert field in {v.field for v in check_spec(s)}, (field, check_spec(s))
    assert violations("ratio", spec(rmin=3, rmax=2).ratio, "spec.ratio")[0].field == "spec.ratio.minDecodePerPrefill"
