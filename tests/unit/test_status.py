"""compute_status: observed Deployments -> conditions, counts, endpoint (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import yaml

from hpd_operator.api.models import (
    CONDITION_TYPES,
    HybridPDDeployment,
    HybridPDDeploymentSpec,
    HybridPDDeploymentStatus,
)
from hpd_operator.conditions import FAILURE_REASONS, MAX_MESSAGE, ConditionType, Failure, Phase, Reason
from hpd_operator.errors import SpecError
from hpd_operator.profile import compute_profile
from hpd_operator.profile_model import Profile
from hpd_operator.rolestate import NOT_SCHEDULED_AFTER, next_pod_check
from hpd_operator.status import Observation, compute_status, transitions
from hpd_operator.validation import validate

SEED = Path(__file__).resolve().parents[2] / "examples" / "nemotron-3-nano.yaml"


def spec(**changes: Any) -> HybridPDDeploymentSpec:
    doc = yaml.safe_load(SEED.read_text())["spec"]
    doc.update(changes)
    return HybridPDDeploymentSpec.model_validate(doc)


def profile_of(s: HybridPDDeploymentSpec) -> Profile:
    return compute_profile(validate(HybridPDDeployment(spec=s)))


def dep(
    replicas: int, ready: int, updated: int | None = None, gen: int = 1, observed: int = 1, **st: Any
) -> dict[str, Any]:
    return {
        "metadata": {"generation": gen},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
            **st,
        },
    }


def status(s: HybridPDDeploymentSpec, observed: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return compute_status(Observation(name="x", namespace="ns", spec=s, observed=observed, generation=3, **kw))


def conds(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in st["conditions"]}


ALL_READY = {"prefill": dep(1, 1), "decode": dep(1, 1), "router": dep(1, 1)}


def test_ready_when_every_role_is_ready() -> None:
    s = spec()
    st = status(s, ALL_READY, profile=profile_of(s))
    c = conds(st)
    assert c["Ready"]["status"] == "True" and st["phase"] == "Ready"
    assert {c[t]["status"] for t in ("PrefillReady", "DecodeReady", "RouterReady", "WarmedUp")} == {"True"}
    assert c["HybridProfileApplied"]["reason"] == "Hybrid"
    assert c["Progressing"]["status"] == "False" and c["Degraded"]["status"] == "False"
    assert st["observedGeneration"] == 3 and all(x["observedGeneration"] == 3 for x in st["conditions"])
    assert st["decode"] == {
        "replicas": 1,
        "readyReplicas": 1,
        "updatedReplicas": 1,
        "summary": "1/1",
        "selector": "app.kubernetes.io/instance=x,app.kubernetes.io/component=decode",
    }
    assert st["endpoint"] == "http://x.ns.svc:8000"
    assert st["profile"]["injections"]
    assert set(c) == {
        "Ready",
        "PrefillReady",
        "DecodeReady",
        "RouterReady",
        "WarmedUp",
        "HybridProfileApplied",
        "Progressing",
        "Degraded",
        "DataPathVerified",
    }
    assert (
        c["DataPathVerified"]["status"] == "True"
        and "re-proved every 300 s (canary)" in c["DataPathVerified"]["message"]
    )


def test_data_path_verified_follows_decode_and_the_pair_check_setting() -> None:
    """#31: decode is Ready only after its pair check and while its canary passes: the condition reads them."""
    s = spec()
    c = conds(status(s, {**ALL_READY, "decode": dep(2, 1)}, profile=profile_of(s)))
    assert c["DataPathVerified"]["status"] == "False" and c["DataPathVerified"]["reason"] == "NotVerified"
    assert "decode replica(s) verified P->D" in c["DataPathVerified"]["message"]
    off = spec(warmup={"pairCheck": False})
    c = conds(status(off, ALL_READY, profile=profile_of(off)))
    assert c["DataPathVerified"]["status"] == "Unknown" and c["DataPathVerified"]["reason"] == "PairCheckDisabled"


def test_not_ready_while_one_role_is_pending() -> None:
    st = status(spec(), {**ALL_READY, "decode": dep(1, 0)})
    c = conds(st)
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "ComponentsNotReady"
    assert "DecodeReady=False" in c["Ready"]["message"]
    assert c["DecodeReady"]["status"] == "False" and c["WarmedUp"]["status"] == "False"
    assert c["Progressing"]["status"] == "True" and st["phase"] == "Progressing"
    assert st["decode"]["summary"] == "0/1"


def test_missing_deployment_and_stale_generation_are_not_ready() -> None:
    c = conds(status(spec(), {**ALL_READY, "router": None}))
    assert c["RouterReady"]["reason"] == "Missing" and c["Ready"]["status"] == "False"
    c = conds(status(spec(), {**ALL_READY, "prefill": dep(1, 1, gen=2, observed=1)}))
    assert c["PrefillReady"]["status"] == "False"


def test_stuck_rollout_is_degraded() -> None:
    stuck = dep(1, 0, conditions=[{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}])
    st = status(spec(), {**ALL_READY, "prefill": stuck})
    c = conds(st)
    assert c["Degraded"]["status"] == "True" and st["phase"] == "Degraded"
    assert c["PrefillReady"]["reason"] == "RolloutFailed"


def test_scaled_to_zero_is_not_ready() -> None:
    s = spec(decode={"replicas": 0, "tensorParallelSize": 2})
    st = status(s, {**ALL_READY, "decode": dep(0, 0)})
    c = conds(st)
    assert c["DecodeReady"]["reason"] == "ScaledToZero" and c["DecodeReady"]["status"] == "True"
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "ScaledToZero"


def test_invalid_spec_reports_the_field_and_keeps_counts() -> None:
    err = SpecError.one("spec.prefill.tensorParallelSize", "tp", "bad TP")
    st = compute_status(
        Observation(
            name="x",
            namespace="ns",
            spec=None,
            observed=ALL_READY,
            generation=4,
            failure=Failure(Reason.INVALID_SPEC, err.message),
        )
    )
    c = conds(st)
    assert c["Ready"]["reason"] == "InvalidSpec" and "spec.prefill.tensorParallelSize" in c["Ready"]["message"]
    assert c["HybridProfileApplied"]["status"] == "False" and st["phase"] == "Failed"
    assert st["prefill"]["summary"] == "1/1" and st["observedGeneration"] == 4


def test_transition_times_survive_unchanged_conditions() -> None:
    first = status(spec(), ALL_READY, now="2026-01-01T00:00:00Z")
    again = status(spec(), ALL_READY, previous=first["conditions"], now="2026-01-02T00:00:00Z")
    assert conds(again)["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    flipped = status(
        spec(), {**ALL_READY, "decode": dep(1, 0)}, previous=first["conditions"], now="2026-01-03T00:00:00Z"
    )
    assert conds(flipped)["Ready"]["lastTransitionTime"] == "2026-01-03T00:00:00Z"


def test_notes_are_shown_in_the_ready_message() -> None:
    st = status(spec(), ALL_READY, notes=["PodMonitors skipped"])
    assert "PodMonitors skipped" in conds(st)["Ready"]["message"]


# --- node loss, scheduler verdicts, reconcile failures ---------------------------------------------------------
def pod(name: str, node: str | None = None, ready: bool = True, unschedulable: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable is not None:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node} if node else {},
        "status": {"conditions": conditions},
    }


def test_unschedulable_pod_makes_the_role_degraded_with_the_schedulers_reason() -> None:
    why = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    pods = {"decode": [pod("d-1", ready=False, unschedulable=why)]}
    st = status(spec(), {**ALL_READY, "decode": dep(1, 0)}, pods=pods)
    c = conds(st)
    assert c["DecodeReady"]["status"] == "False" and c["DecodeReady"]["reason"] == "Unschedulable"
    assert why in c["DecodeReady"]["message"] and "d-1" in c["DecodeReady"]["message"]
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == "Unschedulable"
    assert why in c["Degraded"]["message"]
    assert st["phase"] == "Degraded" and c["Ready"]["status"] == "False"


def test_a_pod_no_scheduler_looks_at_turns_the_role_degraded_after_a_minute() -> None:
    """#32: a pod waiting for a scheduler that does not exist (podTemplate.spec.schedulerName) left Degraded=False."""
    waiting = pod("d-1", ready=False)
    waiting["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    waiting["spec"]["schedulerName"] = "gpu-packer"
    pods = {"decode": [waiting]}
    early = conds(status(spec(), {**ALL_READY, "decode": dep(1, 0)}, pods=pods, now="2026-12-01T10:00:30Z"))
    assert early["Degraded"]["status"] == "False" and early["DecodeReady"]["reason"] != "NotScheduled"
    assert next_pod_check(pods["decode"], "2026-12-01T10:00:30Z") == NOT_SCHEDULED_AFTER - 30 + 1
    late = conds(status(spec(), {**ALL_READY, "decode": dep(1, 0)}, pods=pods, now="2026-12-01T10:01:01Z"))
    assert late["Degraded"]["status"] == "True" and late["Degraded"]["reason"] == "NotScheduled"
    assert "'gpu-packer'" in late["DecodeReady"]["message"] and "d-1" in late["DecodeReady"]["message"]
    assert next_pod_check(pods["decode"], "2026-12-01T10:01:01Z") is None  # already reported: no more timer
    judged = pod("d-2", ready=False, unschedulable="0/4 nodes are available")
    judged["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    again = conds(
        status(spec(), {**ALL_READY, "decode": dep(1, 0)}, pods={"decode": [judged]}, now="2026-12-01T11:00:00Z")
    )
    assert again["Degraded"]["reason"] == "Unschedulable"  # a scheduler looked: its verdict, not NotScheduled


def test_ready_pod_on_a_lost_node_is_not_counted_ready() -> None:
    pods = {"decode": [pod("d-1", node="gone-node")], "prefill": [pod("p-1", node="n1")]}
    st = status(spec(), ALL_READY, pods=pods, nodes={"n1", "n2"})
    c = conds(st)
    assert st["decode"]["summary"] == "0/1" and c["Ready"]["status"] == "False"
    assert c["DecodeReady"]["reason"] == "NodeLost" and "gone-node" in c["DecodeReady"]["message"]
    assert c["Degraded"]["reason"] == "NodeLost" and c["PrefillReady"]["status"] == "True"
    # nodes unknown (no permission to list them): the Deployment's count stands
    assert conds(status(spec(), ALL_READY, pods=pods, nodes=None))["Ready"]["status"] == "True"


def test_a_deleted_pod_the_deployment_still_counts_ready_is_not_ready() -> None:
    """Right after a pod's delete event the Deployment's readyReplicas still counts it (the controller updates it
    later): the Ready pods seen bound the count; a role whose pods were not observed keeps the Deployment's."""
    replacement = pod("d-2", node="n2", ready=False)
    pods = {"decode": [replacement], "prefill": [pod("p-1", node="n1")]}
    st = status(spec(), ALL_READY, pods=pods, nodes={"n1", "n2"})
    c = conds(st)
    assert st["decode"]["summary"] == "0/1" and c["DecodeReady"]["status"] == "False"
    assert c["Ready"]["status"] == "False" and c["RouterReady"]["status"] == "True"  # router pods not observed
    gone = {**pod("d-1", node="n1"), "metadata": {"name": "d-1", "deletionTimestamp": "2026-11-29T00:00:00Z"}}
    st = status(spec(), ALL_READY, pods={**pods, "decode": [gone, replacement]}, nodes={"n1", "n2"})
    assert st["decode"]["summary"] == "0/1"
    st = status(spec(), ALL_READY, pods={**pods, "decode": [pod("d-2", node="n2")]}, nodes={"n1", "n2"})
    assert st["decode"]["summary"] == "1/1" and conds(st)["Ready"]["status"] == "True"


def test_apply_failure_reports_the_child_and_the_current_generation() -> None:
    msg = 'the apiserver refused Service 1a-prefill: 422 Unprocessable Entity: metadata.name: Invalid value: "1a"'
    st = status(spec(), ALL_READY, failure=Failure(Reason.APPLY_FAILED, msg), profile=profile_of(spec()))
    c = conds(st)
    assert c["Ready"] == {**c["Ready"], "status": "False", "reason": "ApplyFailed", "message": msg}
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == "ApplyFailed"
    assert c["Progressing"]["status"] == "False" and st["phase"] == "Failed"
    assert st["observedGeneration"] == 3 and c["Ready"]["observedGeneration"] == 3
    assert c["HybridProfileApplied"]["status"] == "True"


def test_messages_are_capped() -> None:
    st = status(spec(), ALL_READY, failure=Failure(Reason.RECONCILE_ERROR, "x" * 100_000))
    assert len(conds(st)["Ready"]["message"]) <= MAX_MESSAGE


def _every_status() -> list[dict[str, Any]]:
    s, err = spec(), SpecError.one("spec.x", "r", "bad")
    stuck = dep(1, 0, conditions=[{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}])
    unsched = {"decode": [pod("d", ready=False, unschedulable="no GPU")]}
    out = [
        status(s, ALL_READY, profile=profile_of(s)),
        status(s, {**ALL_READY, "decode": dep(1, 0)}, pods=unsched),
        status(s, {**ALL_READY, "prefill": stuck, "router": None}),
        status(s, ALL_READY, pods={"decode": [pod("d", node="x")]}, nodes=set()),
        status(spec(decode={"replicas": 0, "tensorParallelSize": 2}), {**ALL_READY, "decode": dep(0, 0)}),
        status(spec(warmup={"enabled": False}), ALL_READY, notes=["n"]),
        compute_status(
            Observation(
                name="x",
                namespace="ns",
                spec=None,
                observed={},
                generation=None,
                failure=Failure(Reason.INVALID_SPEC, err.message),
            )
        ),
    ]
    out += [status(s, ALL_READY, failure=Failure(r, "m")) for r in FAILURE_REASONS]
    return out


def test_every_status_validates_against_the_status_model_and_uses_the_vocabulary() -> None:
    assert {str(t) for t in ConditionType} == set(CONDITION_TYPES)
    phases = HybridPDDeploymentStatus.model_fields["phase"].annotation
    assert {str(p) for p in Phase} == set(get_args(get_args(phases)[0]))
    reasons = {str(r) for r in Reason}
    for st in _every_status():
        HybridPDDeploymentStatus.model_validate(st)
        assert st["phase"] in {str(p) for p in Phase}
        for c in st["conditions"]:
            assert c["type"] in CONDITION_TYPES and c["reason"] in reasons, c
        assert [c["type"] for c in st["conditions"]].count("Ready") == 1


def test_events_only_on_transitions() -> None:
    s = spec()
    ready = status(s, ALL_READY)["conditions"]
    pending = status(s, {**ALL_READY, "decode": dep(1, 0)})["conditions"]
    failed = status(s, ALL_READY, failure=Failure(Reason.APPLY_FAILED, "refused"))["conditions"]
    other = status(s, ALL_READY, failure=Failure(Reason.APPLY_FAILED, "refused again"))["conditions"]
    unsched = status(s, {**ALL_READY, "decode": dep(1, 0)}, pods={"decode": [pod("d", False, unschedulable="no")]})
    assert transitions([], pending) == []
    assert transitions(pending, ready) == [("Normal", "AllComponentsReady", "prefill, decode and router are ready")]
    assert transitions(ready, ready) == [] and transitions(failed, failed) == []
    assert transitions(ready, failed) == [("Warning", "ApplyFailed", "refused")]
    assert transitions(failed, other) == [("Warning", "ApplyFailed", "refused again")]
    [(t, r, m)] = transitions(ready, unsched["conditions"])
    assert (t, r) == ("Warning", "Unschedulable") and "no" in m
    assert transitions(unsched["conditions"], unsched["conditions"]) == []


def test_a_role_detail_from_probe_events_is_appended_while_the_role_is_not_ready() -> None:
    detail = "pod x-decode-1: P->D output differs from local on 2/16 prompts ...; if spec.blockSize is set"
    observed = dict(ALL_READY)
    observed["decode"] = dep(1, ready=0)
    c = conds(status(spec(), observed, role_details={"decode": detail, "prefill": "stale"}))
    assert c["DecodeReady"]["status"] == "False" and c["DecodeReady"]["message"].endswith(detail)
    assert "stale" not in c["PrefillReady"]["message"]  # prefill is Ready: its old Events say nothing now


def test_a_rolling_router_keeps_the_cr_ready_while_its_ready_pods_cover_the_replicas() -> None:
    """The router surges (maxUnavailable 0): while it rolls (a generation switch, a router update) its old pods serve,
    so Ready stays True; Progressing says it rolls."""
    rolling = dep(1, 1, updated=0, gen=2, observed=1)
    st = status(spec(), {**ALL_READY, "router": rolling})
    c = conds(st)
    assert c["Ready"]["status"] == "True" and c["RouterReady"]["status"] == "True"
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RollingOut")
    assert "router" in c["Progressing"]["message"]
    gone = status(spec(), {**ALL_READY, "router": dep(1, 0, updated=0, gen=2, observed=1)})
    assert conds(gone)["Ready"]["status"] == "False"
