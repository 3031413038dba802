"""Pure helpers of the I/O modules: which apiserver answers are permanent, whose object a child is, Event keys."""

from __future__ import annotations

import json

from kubernetes import client

from hpd_operator import apply as k8s
from hpd_operator.report import event_name


def err(status: int, message: str) -> client.ApiException:
    return client.ApiException(status=status, reason="R", body=json.dumps({"kind": "Status", "message": message}))


def test_permanent_refusals_include_server_side_apply_schema_500s() -> None:
    assert k8s.refused(err(422, 'Service "1a" is invalid: metadata.name: Invalid value'))
    assert k8s.refused(err(400, "bad"))
    typed = "failed to create typed patch object (ns/x; apps/v1, Kind=Deployment): .spec.containers: expected list"
    assert k8s.refused(err(500, typed))
    assert k8s.refused(err(500, "failed to convert new object (ns/x): quantities must match the regular expression"))
    assert not k8s.refused(err(500, "etcdserver: request timed out"))
    assert not k8s.refused(err(503, "unavailable")) and not k8s.refused(err(429, "slow down"))


def test_api_message_quotes_the_apiservers_field_message() -> None:
    e = err(422, 'Deployment.apps "x" is invalid: spec.template.spec.containers[0].env[3].valueFrom.secretKeyRef.key')
    assert k8s.api_message(e) == f"422 R: {json.loads(e.body)['message']}"
    assert k8s.api_message(client.ApiException(status=500, reason="R", body="not json")) == "500 R: not json"


def test_ownership_is_by_uid_and_described_by_the_controller() -> None:
    ours = {
        "metadata": {"ownerReferences": [{"uid": "u1", "kind": "HybridPDDeployment", "name": "a", "controller": True}]}
    }
    assert k8s.owned_by(ours, "u1") and not k8s.owned_by(ours, "u2")
    assert k8s.holder(ours) == "owned by HybridPDDeployment a"
    assert k8s.holder({"metadata": {}}) == "not owned by any object"


def test_one_event_object_per_cr_type_reason_and_message() -> None:
    body = {"metadata": {"name": "a" * 300, "uid": "u1"}}
    n = event_name(body, "Warning", "ApplyFailed", "m")
    assert n == event_name(body, "Warning", "ApplyFailed", "m") and len(n) <= 253
    assert n != event_name(body, "Warning", "ApplyFailed", "other")
    assert n != event_name({"metadata": {"name": "a" * 300, "uid": "u2"}}, "Warning", "ApplyFailed", "m")
