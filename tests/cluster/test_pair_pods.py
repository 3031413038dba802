"""spec.kvTransfer.processNamespace Pair against the real apiserver: the CR becomes one pair Deployment (no prefill or
decode Deployments, no headless role Services) whose pods share one PID namespace of their own (shareProcessNamespace,
no host namespace) and hold both engines with their GPUs and an in-pod router; the CR's router runs vllm-router's
regular mode over the pair pods; the status counts Ready prefill and decode from the pair pods; and the invalid pair
specs are refused naming the field (by the CRD's CEL, or by the operator with InvalidSpec)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hpd_runtime import contract

from .conftest import Operator
from .kube import arg, children, cond, create, deployment, seed, wait_cr


def pair_doc(name: str, replicas: int = 2) -> dict[str, Any]:
    doc = seed(name)
    doc["spec"].setdefault("kvTransfer", {})["processNamespace"] = "Pair"
    doc["spec"]["prefill"]["replicas"] = replicas
    doc["spec"]["decode"]["replicas"] = replicas
    doc["spec"]["decode"]["tensorParallelSize"] = 1  # prefill TP 2 + decode TP 1: one pod asks 3 GPUs of a node
    return doc


def test_a_pair_cr_becomes_one_pair_deployment_routed_in_regular_mode(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "paired"
    create(api_client, ns, pair_doc(name))
    cr = wait_cr(
        api_client,
        ns,
        name,
        lambda c: (
            cond(c, "Ready").get("status") == "True"
            and (c.get("status") or {}).get("decode", {}).get("readyReplicas") == 2
        ),
        "Ready with 2 pair pods",
    )
    made = children(api_client, ns, name)
    (pair_name,) = [d for d in made["Deployment"] if d.startswith(f"{name}-pair-")]
    assert made["Deployment"] == sorted([pair_name, f"{name}-router"])  # no prefill or decode Deployment
    assert made["Service"] == [name]  # the endpoint only: no headless role Services
    assert made["PodDisruptionBudget"] == [pair_name]

    dep = deployment(api_client, ns, pair_name)
    assert dep.spec.replicas == 2 and dep.status.ready_replicas == 2
    pod = dep.spec.template.spec
    assert pod.share_process_namespace is True
    assert not pod.host_pid and not pod.host_ipc and not pod.host_network
    by_name = {c.name: c for c in pod.containers}
    assert list(by_name) == ["prefill", "decode", "router"]
    assert by_name["prefill"].resources.limits["nvidia.com/gpu"] == "2"
    assert by_name["decode"].resources.limits["nvidia.com/gpu"] == "1"
    decode_env = {e.name: e.value for e in by_name["decode"].env}
    assert decode_env[contract.ENV_PREFILL_SERVICE] == "127.0.0.1" and decode_env[contract.ENV_VLLM_PORT] == "8100"
    inner = by_name["router"].args
    assert "--vllm-pd-disaggregation" in inner and arg(inner, "--prefill") == "http://127.0.0.1:8000"

    # the pods the Deployment made share one PID namespace and are on kwok's GPU nodes with both engines' GPUs
    sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}={contract.COMPONENT_PAIR}"
    pods = client.CoreV1Api(api_client).list_namespaced_pod(ns, label_selector=sel).items
    assert len(pods) == 2 and all(p.spec.share_process_namespace for p in pods)
    assert all(p.spec.node_name for p in pods)

    router = deployment(api_client, ns, f"{name}-router").spec.template.spec.containers[0].args
    assert "--vllm-pd-disaggregation" not in router and "--prefill-selector" not in router
    assert arg(router, "--service-discovery-port") == str(contract.PAIR_ROUTER_PORT)
    i = router.index("--selector")
    gen = dep.metadata.labels[contract.LABEL_GENERATION]
    assert set(router[i + 1 : i + 4]) == {
        f"{contract.LABEL_INSTANCE}={name}",
        f"{contract.LABEL_COMPONENT}={contract.COMPONENT_PAIR}",
        f"{contract.LABEL_GENERATION}={gen}",
    }
    status = cr["status"]
    assert (status["prefill"]["readyReplicas"], status["decode"]["readyReplicas"]) == (2, 2)
    assert "shareProcessNamespace" in str(status["profile"])
    assert status["decode"]["selector"] == sel  # the scale subresource's selector: the pair pods

    # the scale subresource (kubectl scale hpd) writes spec.decode.replicas alone: refused while pairs must be equal
    with pytest.raises(ApiException) as e:
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object_scale(
            contract.GROUP, contract.VERSION, ns, contract.PLURAL, name, {"spec": {"replicas": 3}}
        )
    assert e.value.status == 422 and "spec.decode.replicas must equal spec.prefill.replicas" in str(e.value.body)


CEL_REFUSALS = [
    ({"decode": {"replicas": 3}}, "spec.decode.replicas must equal spec.prefill.replicas"),
    ({"prefill": {"autoscaling": {"minReplicas": 1, "maxReplicas": 4}}}, "spec.prefill.autoscaling is not allowed"),
    (
        {"prefill": {"tensorParallelSize": 16, "gpusPerNode": 8}},
        "spec.prefill.tensorParallelSize x pipelineParallelSize must fit one node",
    ),
    ({"kvTransfer": {"sideChannelPort": 8150}}, "kvTransfer.sideChannelPort collides in a pair pod"),
]


@pytest.mark.parametrize(("patch", "message"), CEL_REFUSALS)
def test_invalid_pair_specs_are_refused_by_the_apiserver_naming_the_field(
    api_client: client.ApiClient, crd: None, namespace: str, patch: dict[str, Any], message: str
) -> None:
    doc = pair_doc("refused", 1)
    for k, v in patch.items():
        doc["spec"][k] = {**doc["spec"].get(k, {}), **v}
    with pytest.raises(ApiException) as e:
        create(api_client, namespace, doc)
    assert e.value.status == 422 and message in str(e.value.body), e.value.body


def test_pair_placement_the_crd_cannot_compare_is_invalid_spec_naming_the_field(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    doc = pair_doc("placed", 1)
    doc["spec"]["prefill"]["nodeSelector"] = {"zone": "a"}
    doc["spec"]["decode"]["nodeSelector"] = {"zone": "b"}
    create(api_client, namespace, doc)
    cr = wait_cr(
        api_client, namespace, "placed", lambda c: cond(c, "Ready").get("reason") == "InvalidSpec", "InvalidSpec"
    )
    assert "spec.decode.nodeSelector" in cond(cr, "Ready")["message"]
    assert not [d for d in children(api_client, namespace, "placed")["Deployment"] if "-pair-" in d]
