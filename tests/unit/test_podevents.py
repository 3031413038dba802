"""podevents.probe_failure: kubelet probe Events of a role's pods -> the reason shown in its condition (pure)."""

from __future__ import annotations

from typing import Any

from hpd_operator.podevents import probe_failure

DIFFERS = "P->D output differs from local on 2/16 prompts via prefill 10.0.0.7:8000: ...; if spec.blockSize is set"


def pod(name: str, ready: bool, uid: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid or f"uid-{name}"},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def event(name: str, message: str, when: str, reason: str = "Unhealthy", uid: str = "") -> dict[str, Any]:
    return {
        "involvedObject": {"kind": "Pod", "name": name, "uid": uid or f"uid-{name}"},
        "reason": reason,
        "type": "Warning",
        "message": message,
        "lastTimestamp": when,
    }


def test_newest_probe_failure_of_a_not_ready_pod_is_reported_without_the_kubelet_prefix() -> None:
    events = [
        event("d-1", "Startup probe failed: warmup warming: pair check", "2026-11-29T17:00:00Z"),
        event("d-1", f"Readiness probe failed: {DIFFERS}", "2026-11-29T17:01:00Z"),
    ]
    assert probe_failure([pod("d-1", False)], events) == f"pod d-1: {DIFFERS}"


def test_ready_pods_other_reasons_and_earlier_pods_of_the_same_name_are_ignored() -> None:
    events = [
        event("d-ok", f"Readiness probe failed: {DIFFERS}", "2026-11-29T17:05:00Z"),  # Ready again now: stale
        event("d-1", "Back-off restarting failed container", "2026-11-29T17:05:00Z", reason="BackOff"),
        event("d-1", f"Readiness probe failed: {DIFFERS}", "2026-11-29T17:05:00Z", uid="old"),
        event("d-1", "Liveness probe failed: HTTP probe failed with statuscode: 503", "2026-11-29T17:05:00Z"),
    ]
    assert probe_failure([pod("d-ok", True), pod("d-1", False)], events) is None


def test_aggregated_events_and_long_messages() -> None:
    msg = "(combined from similar events): Readiness probe failed: " + DIFFERS + " x" * 1000
    out = probe_failure([pod("d-1", False)], [event("d-1", msg, "2026-11-29T17:00:00Z")])
    assert out is not None and out.startswith(f"pod d-1: {DIFFERS}") and out.endswith("...") and len(out) < 700
