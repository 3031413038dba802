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


def test_the_owner_kind_race_is_told_apart_from_a_real_403_and_unblocked_children_keep_their_owner() -> None:
    from kubernetes import client

    race = (
        '{"kind":"Status","message":"services \\"x\\" is forbidden: cannot set blockOwnerDeletion in this case '
        "because cannot find RESTMapping for APIVersion hybridpd.io/v1alpha1 Kind HybridPDDeployment: no matches "
        'for kind \\"HybridPDDeployment\\" in version \\"hybridpd.io/v1alpha1\\"","code":403}'
    )
    rbac = '{"kind":"Status","message":"services is forbidden: User \\"x\\" cannot patch resource","code":403}'
    assert k8s.owner_kind_unknown(client.ApiException(status=403, reason="Forbidden", body=race))
    assert not k8s.owner_kind_unknown(client.ApiException(status=403, reason="Forbidden", body=rbac))
    assert not k8s.owner_kind_unknown(client.ApiException(status=422, reason="Invalid", body=race))
    ref = {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment", "name": "a", "uid": "u"}
    obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "a", "ownerReferences": [{**ref, "controller": True, "blockOwnerDeletion": True}]},
    }
    out = k8s.without_block_owner_deletion(obj)
    assert out["metadata"]["ownerReferences"] == [{**ref, "controller": True}]
    assert obj["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True  # pure: the input is unchanged
