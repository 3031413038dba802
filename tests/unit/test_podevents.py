"""podevents.probe_failure: kubelet probe Events of a role's pods -> the reason shown in its condition (pure)."""

from __future__ import annotations

import json
from typing import Any

from hpd_operator.podevents import kv_path, probe_failure, stale_reports, verified_prefills

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


# --- status.kvPath from the CR's kv-reporter Lease ----------------------------------------------------------------
NOW = "2026-12-03T10:00:00Z"


def report(uid: str, when: str, rate: int = 14_200_000_000, **extra: Any) -> str:
    doc = {"uid": uid, "bytesPerSecond": rate, "bytesPerRequest": 173_000_000, "fabric": "tcp", "belowFloor": False,
           "message": f"KV moved at {rate / 1e9:.1f} GB/s", "observedTime": when, **extra}  # fmt: skip
    return json.dumps(doc)


def test_the_newest_report_of_a_ready_decode_pod_is_the_kv_path() -> None:
    pods = [pod("d-1", ready=True), pod("d-2", ready=True)]
    reports = {"uid-d-1": report("uid-d-1", "2026-12-03T09:00:00Z", 1),
               "uid-d-2": report("uid-d-2", "2026-12-03T09:30:00Z", 2, transport="cuda_ipc")}  # fmt: skip
    got = kv_path(pods, reports, NOW)
    assert got == {"pod": "d-2", "message": "KV moved at 0.0 GB/s", "bytesPerSecond": 2, "bytesPerRequest": 173_000_000,
                   "fabric": "tcp", "transport": "cuda_ipc", "belowFloor": False,
                   "observedTime": "2026-12-03T09:30:00Z"}  # fmt: skip


def test_reports_of_not_ready_gone_or_earlier_pods_and_from_the_future_are_ignored() -> None:
    pods = [pod("d-1", ready=True), pod("d-2", ready=False)]
    genuine = report("uid-d-1", "2026-12-03T09:00:00Z")
    assert kv_path(pods, {"uid-d-1": genuine}, NOW) is not None
    for reports in (
        {"uid-d-2": report("uid-d-2", "2026-12-03T09:59:00Z")},  # not Ready now
        {"uid-d-9": report("uid-d-9", "2026-12-03T09:59:00Z")},  # no such pod
        {"uid-d-1": report("uid-earlier", "2026-12-03T09:59:00Z")},  # the body names another pod
        {"uid-d-1": report("uid-d-1", "2099-01-01T00:00:00Z")},  # stamped in the future
        {"uid-d-1": "not json"},
        {"uid-d-1": json.dumps(["a", "list"])},
        {"uid-d-1": report("uid-d-1", "yesterday")},
    ):
        assert kv_path(pods, reports, NOW) is None, reports
    # a future stamp beside the genuine report never wins over it
    two = {"uid-d-1": genuine, "uid-d-2": report("uid-d-2", "2099-01-01T00:00:00Z")}
    got = kv_path([pod("d-1", ready=True), pod("d-2", ready=True)], two, NOW)
    assert got is not None and got["pod"] == "d-1"
    assert kv_path(pods, {"uid-d-1": report("uid-d-1", "2026-12-03T10:00:30Z")}, NOW) is not None  # within skew
    assert kv_path(pods, None, NOW) is None


def test_reports_of_pods_long_gone_are_the_stale_ones() -> None:
    pods = [pod("d-1", ready=False)]  # any state counts as present
    reports = {
        "uid-d-1": report("uid-d-1", "2026-12-03T08:00:00Z"),
        "uid-old": report("uid-old", "2026-12-03T09:49:00Z"),  # gone, reported 11 minutes ago
        "uid-new": report("uid-new", "2026-12-03T09:55:00Z"),  # maybe a pod the cache has not seen yet
        "uid-bad": "not json",
    }
    assert stale_reports(pods, reports, NOW) == ["uid-bad", "uid-old"]
    assert stale_reports(pods, None, NOW) == []


# --- the prefill peers each Ready decode has pair-checked (degraded mode's switch back) ---------------------------


def prefill(name: str, ip: str, created: str = "2026-12-03T09:50:00Z") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created}, "status": {"podIP": ip}}


def listing(uid: str, *peers: tuple[str, str | None]) -> str:
    entries = [{"ip": ip, **({"verifiedTime": at} if at else {})} for ip, at in peers]
    return json.dumps({"uid": uid, "prefills": entries, "pod": uid.removeprefix("uid-")})


def test_each_ready_decode_names_the_prefill_pods_it_verified_by_ip() -> None:
    decodes = [pod("d-1", ready=True), pod("d-2", ready=True), pod("d-3", ready=False)]
    prefills = [prefill("p-new", "10.0.0.9"), prefill("p-other", "10.0.0.5")]
    reports = {
        "uid-d-1": listing("uid-d-1", ("10.0.0.9", "2026-12-03T09:55:00Z")),
        "uid-d-2": listing("uid-d-2"),  # verified none (yet): known, empty
        "uid-d-3": listing("uid-d-3", ("10.0.0.5", "2026-12-03T09:55:00Z")),  # not Ready: not counted
    }
    assert verified_prefills(decodes, prefills, reports) == [frozenset({"uid-p-new"}), frozenset()]
    # a report with figures and the list (the usual one) is read the same
    both = {"uid-d-1": report("uid-d-1", NOW, prefills=[{"ip": "10.0.0.5", "verifiedTime": NOW}])}
    assert verified_prefills(decodes, prefills, both) == [frozenset({"uid-p-other"})]


def test_no_decode_report_with_the_list_means_unknown_so_nothing_waits() -> None:
    """An older runtime writes no `prefills`: None (degraded mode then switches back as before), never an empty set
    that would hold the endpoint on decode for good."""
    decodes, prefills = [pod("d-1", ready=True)], [prefill("p", "10.0.0.9")]
    assert verified_prefills(decodes, prefills, None) is None
    assert verified_prefills(decodes, prefills, {}) is None
    assert verified_prefills(decodes, prefills, {"uid-d-1": report("uid-d-1", NOW)}) is None  # figures only
    assert verified_prefills(decodes, prefills, {"uid-d-1": "not json"}) is None
    assert verified_prefills(decodes, prefills, {"uid-d-1": listing("uid-other", ("10.0.0.9", NOW))}) is None
    assert verified_prefills([pod("d-1", ready=False)], prefills, {"uid-d-1": listing("uid-d-1")}) is None


def test_a_check_of_an_earlier_pod_with_the_same_ip_does_not_count() -> None:
    """Prefill pods carry no uid in their env, so decode names a peer by IP and the time its check passed: a check
    from before the pod was created (beyond the clock-skew allowance) was with an earlier pod that had the IP."""
    decodes, new = [pod("d-1", ready=True)], [prefill("p-new", "10.0.0.9", created="2026-12-03T09:50:00Z")]

    def got(at: str | None) -> list[frozenset[str]] | None:
        return verified_prefills(decodes, new, {"uid-d-1": listing("uid-d-1", ("10.0.0.9", at))})

    assert got("2026-12-03T09:20:00Z") == [frozenset()]  # 30 minutes before the pod existed
    assert got("2026-12-03T09:49:30Z") == [frozenset({"uid-p-new"})]  # within the skew allowance
    assert got("2026-12-03T09:50:12Z") == [frozenset({"uid-p-new"})]
    assert got(None) == [frozenset({"uid-p-new"})]  # no time: the IP alone
    # the same IP listed twice (the old check and the new one): the new one counts
    twice = listing("uid-d-1", ("10.0.0.9", "2026-12-03T09:20:00Z"), ("10.0.0.9", "2026-12-03T09:51:00Z"))
    assert verified_prefills(decodes, new, {"uid-d-1": twice}) == [frozenset({"uid-p-new"})]
