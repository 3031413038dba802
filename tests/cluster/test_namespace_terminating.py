"""A CR whose namespace is being deleted: the apiserver refuses every create there (NamespaceLifecycle admission,
403 `unable to create new content in namespace X because it is being terminated`). That is not a permission
problem: the operator does not count it as an API error, reports no ApplyFailed and does not retry; the CR goes with
its namespace. Before this, a cluster-wide operator that met a CR left in a namespace being deleted counted a 403 for
every child it tried (the chart's RBAC proof, which fails on any 403, failed whenever tests/cluster/test_multi_node.py
had run before it on the same control plane).

Here the real apiserver answers: a namespace held in Terminating by a ConfigMap with a finalizer of this test."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_operator import apply as k8s
from hpd_operator import metrics, report

pytestmark = pytest.mark.cluster
HOLD = "hybridpd.io/test-hold"


def _api_errors() -> dict[tuple[str, str], float]:
    out = {}
    for family in metrics.API_ERRORS.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                out[(s.labels["operation"], s.labels["code"])] = s.value
    return out


def test_creates_refused_because_the_namespace_is_being_deleted_are_told_apart_and_not_counted(
    api_client: client.ApiClient,
) -> None:
    core = client.CoreV1Api(api_client)
    ns = f"t-term-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    hold = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="hold", finalizers=[HOLD]))
    core.create_namespaced_config_map(ns, hold)
    try:
        core.delete_namespace(ns)
        wait_for(lambda: core.read_namespace(ns).status.phase == "Terminating", 30, what=f"{ns} Terminating")
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": ns},
                      "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                          "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}  # fmt: skip
        with pytest.raises(client.ApiException) as refused:
            k8s.create(api_client, deployment)  # the operator's own create (server-side apply)
        assert refused.value.status == 403 and "being terminated" in k8s.api_message(refused.value)
        assert k8s.namespace_terminating(refused.value)

        before = _api_errors()
        body = {"apiVersion": "hybridpd.io/v1alpha1", "kind": "HybridPDDeployment",
                "metadata": {"name": "gone", "namespace": ns, "uid": str(uuid.uuid4()), "resourceVersion": "1"}}  # fmt: skip
        report.event(api_client, body, "Normal", "Created", "created")  # refused the same way: not an API error
        assert _api_errors() == before

        # a 403 without that cause (an RBAC refusal's body) is still one
        other = client.ApiException(status=403, reason="Forbidden")
        other.body = '{"kind":"Status","reason":"Forbidden","details":{"kind":"deployments"}}'
        assert not k8s.namespace_terminating(other)
    finally:
        core.patch_namespaced_config_map("hold", ns, {"metadata": {"finalizers": None}})
        wait_for(lambda: ns not in {n.metadata.name for n in core.list_namespace().items}, 60, what=f"{ns} deleted")
