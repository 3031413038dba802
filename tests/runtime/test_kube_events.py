"""hpd_runtime.kube_events without a cluster: when a KV path report is posted, and that nothing is posted outside one.
The post itself runs against the real kube-apiserver in tests/cluster/test_operator.py (the token of the ServiceAccount
the operator gives decode pods, the Event reaching status.kvPath, and what that token may not do)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpd_runtime import contract as c
from hpd_runtime import kube_events as ke


def test_outside_a_cluster_there_is_no_target_and_nothing_is_posted(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    pod = {c.ENV_POD_NAME: "d-0", c.ENV_POD_NAMESPACE: "ns", c.ENV_POD_UID: "u", "HPD_KUBE_TOKEN_PATH": str(token)}
    assert ke.target_from_env({**pod}) is None  # no KUBERNETES_SERVICE_HOST
    assert ke.target_from_env({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HPD_KUBE_TOKEN_PATH": str(token)}) is None
    assert ke.target_from_env({**pod, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HPD_KUBE_TOKEN_PATH": "/nope"}) is None
    t6 = ke.target_from_env({**pod, "KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"})
    assert t6 is not None and t6.server == "https://[fd00::1]:6443"
    t = ke.target_from_env({**pod, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"} | {
        "HPD_KUBE_TOKEN_PATH": str(token)})  # fmt: skip
    assert t is not None and (t.server, t.pod, t.namespace, t.uid) == ("https://10.0.0.1:6443", "d-0", "ns", "u")
    assert ke.Reporter(None).report("x", rate=1e9, per_request=1e6, fabric="tcp", slow=False) is False


def test_a_report_is_due_first_on_a_verdict_flip_a_2x_change_or_after_an_hour() -> None:
    r = ke.Reporter(None)
    assert r.due(10e9, False, now=1000.0)
    r.last_rate, r.last_slow, r.last_at = 10e9, False, 1000.0
    assert not r.due(12e9, False, now=1300.0) and not r.due(5.1e9, False, now=1300.0)  # a canary that moved a little
    assert r.due(4.9e9, False, now=1300.0) and r.due(21e9, False, now=1300.0)  # more than 2x either way
    assert r.due(10e9, True, now=1300.0)  # below the floor now
    assert r.due(10e9, False, now=1000.0 + ke.REPOST_SECONDS)


def test_the_event_is_about_the_pod_and_carries_the_figures() -> None:
    t = ke.Target("https://10.0.0.1:443", "/t", None, "d-0", "ns", "uid-1")
    ann = {c.ANNOTATION_KV_BYTES_PER_SECOND: "14200000000"}
    body = ke.event_body(t, "Warning", "KV moved at 0.4 GB/s" + "x" * 2000, ann, when=0.0)
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "d-0",
        "namespace": "ns",
        "uid": "uid-1",
    }
    assert body["reason"] == c.EVENT_REASON_KV_PATH and body["type"] == "Warning" and len(body["message"]) == 1024
    assert body["metadata"] == {"generateName": "d-0.", "namespace": "ns", "annotations": ann}
    assert body["lastTimestamp"] == "1970-01-01T00:00:00Z"


class Lease:
    """Stands in for the apiserver: the kv-reporter Lease's patches and the Events, as posted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, status: int = 200) -> None:
        self.patches: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.status = status
        monkeypatch.setattr(ke, "patch_report", self._patch)
        monkeypatch.setattr(ke, "post", lambda t, body: self.events.append(dict(body)) or 201)

    def _patch(self, t: ke.Target, body: dict[str, Any]) -> int:
        self.patches.append(body)
        return self.status

    def reports(self) -> list[dict[str, Any]]:
        return [json.loads(v) for p in self.patches for v in p["metadata"]["annotations"].values()]


TARGET = ke.Target("https://10.0.0.1:443", "/t", None, "d-0", "ns", "uid-1", lease="m-kv-reporter")
P1 = [{"ip": "10.0.0.5", "verifiedTime": "2026-12-03T10:00:00Z"}]
P2 = [*P1, {"ip": "10.0.0.9", "verifiedTime": "2026-12-03T10:00:20Z"}]


def test_the_report_lists_the_verified_prefills_and_an_empty_list_is_a_list() -> None:
    patch = ke.report_patch(TARGET, {"uid": "uid-1", "bytesPerSecond": 5, "prefills": P1, "transport": None})
    doc = json.loads(patch["metadata"]["annotations"][c.ANNOTATION_KV_REPORT_PREFIX + "uid-1"])
    assert doc == {"uid": "uid-1", "bytesPerSecond": 5, "prefills": P1, "pod": "d-0"}
    assert c.KV_REPORT_PREFILLS in c.KV_REPORT_FIELDS
    empty = ke.report_patch(TARGET, {"uid": "uid-1", "prefills": []})  # none verified: known, not absent
    assert json.loads(empty["metadata"]["annotations"][c.ANNOTATION_KV_REPORT_PREFIX + "uid-1"])["prefills"] == []


def test_a_changed_prefill_list_is_written_at_once_without_figures_and_an_unchanged_one_waits_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Degraded mode's switch back waits for a decode to list the new prefill: the list cannot wait for KV figures
    (a check that measured none) nor for the figures' rate limit."""
    lease, r = Lease(monkeypatch), ke.Reporter(TARGET)
    assert r.report("KV moved", rate=10e9, per_request=1e6, fabric="rdma", slow=False, prefills=P1)
    assert len(lease.events) == 1 and lease.reports()[-1]["prefills"] == P1
    figures = {k: v for k, v in lease.reports()[-1].items() if k != "prefills"}
    # unchanged list, figures not due (a canary that moved a little): nothing written
    assert not r.report("KV moved", rate=11e9, per_request=1e6, fabric="rdma", slow=False, prefills=P1)
    assert not r.peers(P1) and len(lease.patches) == 1
    # a new prefill verified, figures not due: the Lease gets the list at once, with the last figures as they were
    assert r.report("KV moved", rate=11e9, per_request=1e6, fabric="rdma", slow=False, prefills=P2)
    assert len(lease.patches) == 2 and len(lease.events) == 1  # no Event: it carries the figures
    assert lease.reports()[-1] == {**figures, "prefills": P2}
    # a peer gone, no figures at all: the list alone
    assert r.peers([]) and lease.reports()[-1] == {**figures, "prefills": []}
    # figures due again (more than 2x): written with the list the Lease holds
    assert r.report("KV slow", rate=1e9, per_request=1e6, fabric="rdma", slow=False)
    assert lease.reports()[-1]["prefills"] == [] and lease.reports()[-1]["bytesPerSecond"] == 1e9


def test_a_decode_without_figures_reports_its_prefills_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    lease, r = Lease(monkeypatch), ke.Reporter(TARGET)
    assert r.peers(P1) and lease.reports() == [{"uid": "uid-1", "prefills": P1, "pod": "d-0"}] and not lease.events
    assert not ke.Reporter(ke.Target("s", "/t", None, "d-0", "ns", "uid-1")).peers(P1)  # no Lease: nothing


def test_a_failed_list_write_is_logged_not_raised_and_retried_later(monkeypatch: pytest.MonkeyPatch) -> None:
    lease, r = Lease(monkeypatch, status=500), ke.Reporter(TARGET)
    assert not r.peers(P1) and len(lease.patches) == 1
    assert not r.peers(P1) and len(lease.patches) == 1  # the same list: not before PEERS_RETRY_SECONDS
    assert not r.peers(P2) and len(lease.patches) == 2  # a newer list: at once
    lease.status = 200
    assert r.failed_peers is not None
    r.failed_peers = (P2, r.failed_peers[1] - ke.PEERS_RETRY_SECONDS)
    assert r.peers(P2) and len(lease.patches) == 3 and r.last_peers == P2 and r.failed_peers is None
    # the token file gone: a write that failed, not an exception
    monkeypatch.undo()
    assert ke.patch_report(TARGET, {"metadata": {}}) == 0
