"""compute_status: observed Deployments -> conditions, counts, endpoint (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpd_operator.api.models import HybridPDDeploymentSpec
from hpd_operator.errors import SpecError
from hpd_operator.profile import compute_profile
from hpd_operator.status import compute_status

SEED = Path(__file__).resolve().parents[2] / "examples" / "nemotron-3-nano.yaml"


def spec(**changes: Any) -> HybridPDDeploymentSpec:
    doc = yaml.safe_load(SEED.read_text())["spec"]
    doc.update(changes)
    return HybridPDDeploymentSpec.model_validate(doc)


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
    return compute_status(name="x", namespace="ns", spec=s, observed=observed, generation=3, **kw)


def conds(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in st["conditions"]}


ALL_READY = {"prefill": dep(1, 1), "decode": dep(1, 1), "router": dep(1, 1)}


def test_ready_when_every_role_is_ready() -> None:
    s = spec()
    st = status(s, ALL_READY, profile=compute_profile(s))
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
    }


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
    st = compute_status(name="x", namespace="ns", spec=None, observed=ALL_READY, generation=4, error=err)
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


def test_a_role_detail_from_probe_events_is_appended_while_the_role_is_not_ready() -> None:
    detail = "pod x-decode-1: P->D output differs from local on 2/16 prompts ...; if spec.blockSize is set"
    observed = dict(ALL_READY)
    observed["decode"] = dep(1, ready=0)
    c = conds(status(spec(), observed, role_details={"decode": detail, "prefill": "stale"}))
    assert c["DecodeReady"]["status"] == "False" and c["DecodeReady"]["message"].endswith(detail)
    assert "stale" not in c["PrefillReady"]["message"]  # prefill is Ready: its old Events say nothing now
