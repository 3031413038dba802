"""hpd_runtime.kube_events without a cluster: when a KV path report is posted, and that nothing is posted outside one.
The post itself runs against the real kube-apiserver in tests/cluster/test_operator.py (the token of the ServiceAccount
the operator gives decode pods, the Event reaching status.kvPath, and what that token may not do)."""

from __future__ import annotations

from pathlib import Path

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
