"""The local control plane itself: everything later stands on these guarantees."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from hpd_devcluster import build, cluster, lifecycle, versions
from hpd_devcluster.testing import wait_for


def test_namespace_round_trip(api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="round-trip", labels={"a": "b"})))
    got = core.read_namespace("round-trip")
    assert got.metadata.labels["a"] == "b"
    assert got.status.phase == "Active"
    core.delete_namespace("round-trip")
    wait_for(lambda: _absent(lambda: core.read_namespace("round-trip")), 60, what="namespace deleted")


def _absent(read: Any) -> bool:
    try:
        read()
    except ApiException as exc:
        return exc.status == 404
    return False


def test_server_reports_pinned_version(devcluster: cluster.ClusterState) -> None:
    bins = build.binaries()
    out = subprocess.run(
        [str(bins.kubectl), "version", "-o", "json"], capture_output=True, text=True, check=True,
        env={**os.environ, **cluster.env(devcluster)},
    )  # fmt: skip
    server = json.loads(out.stdout)["serverVersion"]
    assert server["gitVersion"] == f"v{versions.KUBERNETES}"


def test_anonymous_requests_are_rejected(devcluster: cluster.ClusterState) -> None:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(devcluster.pki / "ca.crt"))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(devcluster.server + "/api/v1/namespaces", context=ctx, timeout=5)
    assert err.value.code == 401


WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.hybridpd.io"},
    "spec": {
        "group": "test.hybridpd.io",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [{
            "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
                        "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must not exceed max"}],
                    },
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                },
            }},
        }],
    },
}  # fmt: skip


def test_crd_with_status_subresource_and_cel_rule(api_client: client.ApiClient, namespace: str) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    ext.create_custom_resource_definition(WIDGET_CRD)
    try:
        wait_for(
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition("widgets.test.hybridpd.io").status.conditions or []
            ),
            30, what="CRD Established",
        )  # fmt: skip
        objs = client.CustomObjectsApi(api_client)
        args = ("test.hybridpd.io", "v1", namespace, "widgets")
        with pytest.raises(ApiException) as err:
            objs.create_namespaced_custom_object(*args, {
                "apiVersion": "test.hybridpd.io/v1", "kind": "Widget", "metadata": {"name": "bad"},
                "spec": {"min": 5, "max": 1},
            })  # fmt: skip
        assert err.value.status == 422
        assert "min must not exceed max" in err.value.body
        good = {"apiVersion": "test.hybridpd.io/v1", "kind": "Widget", "metadata": {"name": "good"},
                "spec": {"min": 1, "max": 5}, "status": {"phase": "ignored-on-create"}}  # fmt: skip
        objs.create_namespaced_custom_object(*args, good)
        created = objs.get_namespaced_custom_object(*args, "good")
        assert "status" not in created or "phase" not in created.get("status", {}), (
            "status subresource must drop status"
        )
        objs.patch_namespaced_custom_object_status(*args, "good", {"status": {"phase": "Ready"}})
        assert objs.get_namespaced_custom_object(*args, "good")["status"]["phase"] == "Ready"
    finally:
        ext.delete_custom_resource_definition("widgets.test.hybridpd.io")


def _gpu_deployment(name: str, replicas: int, gpus: int) -> client.V1Deployment:
    labels = {"app": name}
    container = client.V1Container(
        name="main", image="example.invalid/gpu:1",
        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}),
    )  # fmt: skip
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels), spec=client.V1PodSpec(containers=[container])
            ),
        ),
    )


def test_gpu_deployment_runs_on_kwok_gpu_nodes(
    api_client: client.ApiClient, namespace: str, devcluster: cluster.ClusterState
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, _gpu_deployment("two-gpus", replicas=2, gpus=2))
    wait_for(
        lambda: (apps.read_namespaced_deployment("two-gpus", namespace).status.ready_replicas or 0) == 2,
        60, what="deployment two-gpus 2/2 ready",
    )  # fmt: skip
    pods = core.list_namespaced_pod(namespace, label_selector="app=two-gpus").items
    assert len(pods) == 2
    for pod in pods:
        assert pod.status.phase == "Running"
        assert pod.spec.node_name in devcluster.nodes
        node = core.read_node(pod.spec.node_name)
        assert node.metadata.labels[cluster.GPU_PRODUCT_LABEL] == "NVIDIA-H200"
        assert node.status.allocatable[cluster.GPU_RESOURCE] == "8"
        assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)


def test_pod_asking_for_too_many_gpus_stays_pending(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="nine-gpus"),
        spec=client.V1PodSpec(containers=[client.V1Container(
            name="main", image="example.invalid/gpu:1",
            resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "9"}),
        )]),
    )  # fmt: skip
    core.create_namespaced_pod(namespace, pod)

    def unschedulable() -> Any:
        got = core.read_namespaced_pod("nine-gpus", namespace)
        cond = next((c for c in got.status.conditions or [] if c.type == "PodScheduled"), None)
        return cond if cond is not None and cond.status == "False" else None

    cond = wait_for(unschedulable, 60, what="PodScheduled=False on nine-gpus")
    assert cond.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond.message
    got = core.read_namespaced_pod("nine-gpus", namespace)
    assert got.status.phase == "Pending"
    assert got.spec.node_name is None


def test_deleting_owner_garbage_collects_dependents(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"), data={"k": "v"})
    )
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dependent", owner_references=[ref]))
    )
    core.delete_namespaced_config_map("owner", namespace)
    wait_for(
        lambda: _absent(lambda: core.read_namespaced_config_map("dependent", namespace)),
        60, what="dependent ConfigMap garbage-collected by kube-controller-manager",
    )  # fmt: skip


def test_down_leaves_no_process_and_no_listener() -> None:
    name = f"pytest-down-{os.getpid()}"
    state = lifecycle.up(name, cluster.NodePool(count=1))
    assert cluster.healthy(state)
    pids = dict(state.pids)
    assert set(pids) == set(cluster.PROCESS_ORDER)
    stopped = lifecycle.down(name)
    assert set(stopped) == set(cluster.PROCESS_ORDER)
    for proc, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or not cluster._alive(pid, proc), f"{proc} (pid {pid}) still alive"
    assert cluster.listening_ports(state) == []
    assert lifecycle.down(name) == [], "a second down is a no-op"
