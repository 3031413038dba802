"""The operator against the REAL local control plane (kube-apiserver 1.35 + controller-manager + scheduler + kwok
GPU nodes). The operator runs as a subprocess (`python -m hpd_operator run --namespace NS`), its log printed on
failure. Every wait has a deadline; nothing connects to a pod or node IP."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import signal
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_operator.render import render
from hpd_runtime import contract, kube_events

from .conftest import Operator
from .kube import (
    EXPECTED,
    RESYNC,
    G,
    P,
    T,
    V,
    arg,
    children,
    cond,
    container_of,
    create,
    deployment,
    engine_deployment,
    env_of,
    events,
    expected,
    generation,
    get_cr,
    hold,
    kubectl,
    patch_spec,
    seed,
    serving,
    wait_cr,
    wait_ready,
)

pytestmark = pytest.mark.cluster


# --- tests ---------------------------------------------------------------------------------------------------
def test_seed_example_creates_every_child_with_the_exact_profile_and_becomes_ready(
    operator: Operator, api_client: client.ApiClient, namespace: str, kubeconfig: Path
) -> None:
    ns, name = namespace, "nemotron-3-nano"
    create(api_client, ns, seed(name))
    cr = wait_ready(api_client, ns, name)
    gen = generation(seed(name), ns)  # generation 1: what render builds for this spec
    assert children(api_client, ns, name) == expected(name, gen)
    st = cr["status"]
    assert st["observedGeneration"] == cr["metadata"]["generation"]
    assert st["phase"] == "Ready"
    assert st["endpoint"] == f"http://{name}.{ns}.svc:8000"
    assert st["prefill"]["summary"] == "1/1" and st["decode"]["summary"] == "1/1"
    assert st["decode"]["selector"] == f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}=decode"
    for ctype in ("PrefillReady", "DecodeReady", "RouterReady", "WarmedUp", "HybridProfileApplied"):
        assert cond(cr, ctype)["status"] == "True", ctype
    assert cond(cr, "Progressing")["status"] == "False" and cond(cr, "Degraded")["status"] == "False"
    assert any(i["setting"] == "--no-async-scheduling" for i in st["profile"]["injections"])

    assert st["rollout"]["state"] == "Complete" and st["rollout"]["servingHash"] == gen
    assert st["rollout"]["servingGeneration"] == 1
    for role in contract.ROLES:
        dep = deployment(api_client, ns, f"{name}-{role}-{gen}")
        c = container_of(dep)
        args, env = list(c.args), env_of(c)
        assert c.command == ["python3", "-m", "hpd_runtime", "launch", "--"]
        kv = json.loads(arg(args, "--kv-transfer-config"))
        assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
        assert arg(args, "--tensor-parallel-size") == "2"
        assert "--block-size" not in args  # vLLM picks the Mamba-aligned size (equal TP: the same on both roles)
        assert arg(args, "--model") == "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"
        assert arg(args, "--max-model-len") == "8192"
        assert "--no-enable-prefix-caching" in args
        assert "--no-disable-hybrid-kv-cache-manager" in args
        assert "--no-async-scheduling" in args  # vLLM 0.20: decode, and prefill at TP 2 (#36687)
        assert env[contract.ENV_VLLM_SSM_CONV_STATE_LAYOUT] == "DS"
        assert env[contract.ENV_POD_IP].field_ref.field_path == "status.podIP"
        assert env[contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST] == f"$({contract.ENV_POD_IP})"
        names = [e.name for e in c.env]
        assert names.index(contract.ENV_POD_IP) < names.index(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST)
        assert env[contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT] == "5600"
        assert env[contract.ENV_ROLE] == role
        assert env[contract.ENV_WARMUP_PAIR_CHECK] == ("true" if role == "decode" else "false")
        if role == "decode":
            assert env[contract.ENV_PREFILL_SERVICE] == f"{name}-prefill-{gen}.{ns}.svc"  # its own generation's
        assert c.resources.limits["nvidia.com/gpu"] == "2"
        assert c.readiness_probe._exec.command == list(contract.PROBE_COMMAND)  # the reason reaches the Event
        assert c.startup_probe._exec.command == list(contract.PROBE_COMMAND)
        assert c.liveness_probe.http_get.path == contract.PATH_LIVEZ
        sp = c.startup_probe
        assert sp.failure_threshold * sp.period_seconds >= 900 + 1800
        assert {p.name: p.container_port for p in c.ports} == {"http": 8000, "runtime": 8081, "nixl-side": 5600}
        pod_spec = dep.spec.template.spec
        assert (
            pod_spec.security_context.run_as_non_root is True
            and pod_spec.security_context.run_as_user == contract.IMAGE_UID
        )
        assert c.security_context.allow_privilege_escalation is False
        vols = {v.name: v for v in pod_spec.volumes}
        assert vols["dshm"].empty_dir.medium == "Memory"
        assert {m.mount_path for m in c.volume_mounts} >= {contract.CACHE_MOUNT, contract.SHM_MOUNT}
        assert dep.spec.strategy.rolling_update.max_surge == 0
        assert dep.metadata.owner_references[0].uid == cr["metadata"]["uid"]
        assert dep.metadata.owner_references[0].controller is True

    svc = client.CoreV1Api(api_client).read_namespaced_service(f"{name}-prefill-{gen}", ns)
    assert svc.spec.cluster_ip == "None" and not svc.spec.publish_not_ready_addresses

    # pods scheduled onto the kwok GPU nodes
    pods = client.CoreV1Api(api_client).list_namespaced_pod(ns, label_selector=f"{contract.LABEL_INSTANCE}={name}")
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api_client).list_node().items}
    engine_pods = [p for p in pods.items if p.metadata.labels.get(contract.LABEL_COMPONENT) in contract.ROLES]
    assert len(engine_pods) == 2
    for p in engine_pods:
        assert p.spec.node_name in nodes
        assert nodes[p.spec.node_name].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"

    # router: NIXL P/D mode, discovery by instance+component+generation in this namespace, metrics on 0.0.0.0
    r = container_of(deployment(api_client, ns, f"{name}-router"))
    rargs = list(r.args)
    assert "--vllm-pd-disaggregation" in rargs and "--service-discovery" in rargs
    assert arg(rargs, "--service-discovery-port") == "8000"
    assert arg(rargs, "--service-discovery-namespace") == ns
    i = rargs.index("--prefill-selector")
    assert rargs[i + 1 : i + 4] == [
        f"{contract.LABEL_INSTANCE}={name}",
        f"{contract.LABEL_COMPONENT}=prefill",
        f"{contract.LABEL_GENERATION}={gen}",
    ]
    assert arg(rargs, "--prometheus-host") == "0.0.0.0"
    sa = f"system:serviceaccount:{ns}:{name}-router"
    for verb in ("get", "list", "watch"):
        assert (
            kubectl(kubeconfig, "auth", "can-i", verb, "pods", "-n", ns, "--as", sa, check=False).stdout.strip()
            == "yes"
        )
    assert (
        kubectl(kubeconfig, "auth", "can-i", "delete", "pods", "-n", ns, "--as", sa, check=False).stdout.strip() == "no"
    )

    # render prints exactly what was applied (the fields we set)
    doc = seed(name)
    doc["metadata"]["namespace"] = ns
    for m in render([doc]):
        kind, mname = m["kind"], m["metadata"]["name"]
        live = kubectl(kubeconfig, "get", "-n", ns, f"{kind.lower()}/{mname}", "-o", "json").stdout
        assert_subset(m, json.loads(live), f"{kind}/{mname}")

    # Events and operator metrics
    wait_for(
        lambda: any(e.reason == "Created" and "Deployment" in e.message for e in events(api_client, ns, name)),
        T,
        what="Created Event",
    )
    text = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).read().decode()
    assert (
        "controller_runtime_reconcile_total" in text and 'hpd_operator_hybridpddeployments{phase="Ready"} 1.0' in text
    )


def assert_subset(want: Any, got: Any, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        for k, v in want.items():
            if k not in got and v in (False, None, 0, "", [], {}):
                continue  # omitempty: the apiserver drops zero values
            assert k in got, f"{where}.{k} missing"
            assert_subset(v, got[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            assert_subset(a, b, f"{where}[{i}]")
    else:
        assert want == got or str(want) == str(got), f"{where}: {got!r} != {want!r}"


def test_ready_only_when_every_role_is_ready(operator: Operator, api_client: client.ApiClient, namespace: str) -> None:
    ns, name = namespace, "pending"
    doc = seed(name)
    doc["spec"]["decode"]["nodeSelector"] = {"example.com/no-such-node": "true"}
    create(api_client, ns, doc)
    cr = wait_cr(api_client, ns, name, lambda c: cond(c, "PrefillReady").get("status") == "True", "prefill ready")
    assert cond(cr, "Ready")["status"] == "False"
    assert cond(cr, "DecodeReady")["status"] == "False"
    assert cr["status"]["decode"]["summary"] == "0/1"
    # the scheduler's verdict on the decode pod is the status: Degraded, reason Unschedulable, its message
    cr = wait_cr(api_client, ns, name, lambda c: cond(c, "Degraded").get("reason") == "Unschedulable", "Degraded")
    assert cond(cr, "Degraded")["status"] == "True" and cr["status"]["phase"] == "Degraded"
    assert "node affinity/selector" in cond(cr, "DecodeReady")["message"]
    assert cond(cr, "DecodeReady")["reason"] == "Unschedulable"
    patch_spec(api_client, ns, name, {"decode": {"nodeSelector": None}})
    wait_ready(api_client, ns, name)


def test_update_in_place_prune_and_kubectl_scale(
    operator: Operator, api_client: client.ApiClient, namespace: str, kubeconfig: Path
) -> None:
    ns, name = namespace, "upd"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    g1 = serving(api_client, ns, name)
    shared = {k: deployment(api_client, ns, f"{name}-router").metadata.uid for k in ("router",)}
    change = {
        "image": "example.com/vllm:new",
        "blockSize": 4096,  # passed as written to both roles (a RiskySpec warning on 0.20)
        "prefill": {"tensorParallelSize": 2, "extraArgs": ["--max-num-seqs", "64"]},  # hetero TP 2 -> 1
        "decode": {"replicas": 2},
    }
    patch_spec(api_client, ns, name, change)
    # the engines changed: a new generation of both roles (docs/rollouts.md); kwok makes it Ready at once
    doc = seed(name)
    for k, v in change.items():
        doc["spec"][k] = {**doc["spec"][k], **v} if isinstance(v, dict) else v
    g2 = generation(doc, ns)
    assert g2 != g1

    def updated() -> bool:
        p = container_of(deployment(api_client, ns, f"{name}-prefill-{g2}"))
        d = deployment(api_client, ns, f"{name}-decode-{g2}")
        return (
            arg(list(p.args), "--tensor-parallel-size") == "2"
            and arg(list(p.args), "--block-size") == "4096"
            and arg(list(container_of(d).args), "--block-size") == "4096"
            and p.resources.limits["nvidia.com/gpu"] == "2"
            and p.args[-2:] == ["--max-num-seqs", "64"]
            and p.image == "example.com/vllm:new"
            and d.spec.replicas == 2
        )

    wait_for(updated, T, what="generation 2 built")
    # generation 1 is gone once generation 2 serves; decode at 2 replicas gets a PDB; the router is the same object
    wait_for(
        lambda: children(api_client, ns, name) == expected(name, g2, PodDisruptionBudget=["{n}-decode-{g}"]),
        T,
        what="only generation 2, with its PDB",
    )
    assert serving(api_client, ns, name) == g2
    assert {k: deployment(api_client, ns, f"{name}-router").metadata.uid for k in shared} == shared
    wait_ready(api_client, ns, name)
    decode_uid = deployment(api_client, ns, f"{name}-decode-{g2}").metadata.uid

    # kubectl scale on the CR scales decode; back to 1 prunes the PDB
    # (replicas are not in the engines' templates: scaling changes the serving generation's Deployment in place)
    kubectl(kubeconfig, "-n", ns, "scale", f"hpd/{name}", "--replicas=3")
    wait_for(lambda: deployment(api_client, ns, f"{name}-decode-{g2}").spec.replicas == 3, T, what="decode at 3")

    # The Deployment's readyReplicas (the summary's numerator) counts every ReplicaSet's pods: the summary can read
    # 3/3 while the rollout's old decode pod still counts and the third new one is not there (seen in CI: the scale
    # subresource then read status.replicas 2 once the old pod went). Wait for three pods of the current template.
    def scaled(c: dict[str, Any]) -> bool:
        d = c["status"]["decode"]
        return d["summary"] == "3/3" and d["replicas"] == d["updatedReplicas"] == d["readyReplicas"] == 3

    cr = wait_cr(api_client, ns, name, scaled, "status 3/3 of the current template")
    scale = json.loads(kubectl(kubeconfig, "-n", ns, "get", "--raw",
                               f"/apis/{G}/{V}/namespaces/{ns}/{P}/{name}/scale").stdout)  # fmt: skip
    assert scale["status"]["replicas"] == 3 and "component=decode" in scale["status"]["selector"]
    assert cr["spec"]["decode"]["replicas"] == 3
    kubectl(kubeconfig, "-n", ns, "scale", f"hpd/{name}", "--replicas=1")
    wait_for(lambda: children(api_client, ns, name) == expected(name, g2), T, what="PDB pruned")
    assert deployment(api_client, ns, f"{name}-decode-{g2}").metadata.uid == decode_uid
    assert serving(api_client, ns, name) == g2
    # the Event is posted after the delete: wait for it too
    wait_for(lambda: any(e.reason == "Pruned" for e in events(api_client, ns, name)), T, what="Pruned Event")
    assert any(e.reason == "Updated" for e in events(api_client, ns, name))


def test_edited_or_deleted_child_is_corrected(operator: Operator, api_client: client.ApiClient, namespace: str) -> None:
    ns, name = namespace, "drift"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    g = serving(api_client, ns, name)
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    dep = deployment(api_client, ns, f"{name}-decode-{g}")
    body = copy.deepcopy(dep)
    body.spec.template.spec.containers[0].args = ["--model", "tampered"]
    body.spec.replicas = 5
    apps.replace_namespaced_deployment(f"{name}-decode-{g}", ns, body)
    core.delete_namespaced_service(f"{name}-prefill-{g}", ns)

    def fixed() -> bool:
        d = deployment(api_client, ns, f"{name}-decode-{g}")
        svc = core.read_namespaced_service(f"{name}-prefill-{g}", ns)
        return "--kv-transfer-config" in d.spec.template.spec.containers[0].args and d.spec.replicas == 1 and bool(svc)

    wait_for(fixed, T, what="drift corrected")
    assert deployment(api_client, ns, f"{name}-decode-{g}").metadata.uid == dep.metadata.uid
    wait_ready(api_client, ns, name)


def test_invalid_spec_is_rejected_with_a_condition_and_an_event_and_touches_nothing(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns = namespace
    bad = seed("bad")
    bad["spec"]["prefill"]["tensorParallelSize"] = 3  # CEL: 3 and 3 divide; the profile: 32 heads % 3 != 0
    bad["spec"]["decode"]["tensorParallelSize"] = 3
    create(api_client, ns, bad)
    cr = wait_ready(api_client, ns, "bad", want="False")
    wait_for(lambda: cond(get_cr(api_client, ns, "bad"), "Ready").get("reason") == "InvalidSpec", T, what="reason")
    cr = get_cr(api_client, ns, "bad")
    assert "spec.prefill.tensorParallelSize" in cond(cr, "Ready")["message"]
    assert cr["status"]["phase"] == "Failed"

    def event() -> bool:
        evs = client.CoreV1Api(api_client).list_namespaced_event(ns, field_selector="involvedObject.name=bad").items
        return any(e.type == "Warning" and e.reason == "InvalidSpec" and "tensorParallelSize" in e.message for e in evs)

    wait_for(event, T, what="InvalidSpec Event")
    hold(lambda: children(api_client, ns, "bad") == {k: [] for k in EXPECTED}, 2 * float(RESYNC), "nothing applied")

    # a valid CR updated to an invalid spec: the old children stay exactly as they were
    create(api_client, ns, seed("good"))
    wait_ready(api_client, ns, "good")
    g = serving(api_client, ns, "good")
    before = {r: deployment(api_client, ns, f"good-{r}-{g}") for r in contract.ROLES}
    patch_spec(api_client, ns, "good", {"decode": {"tensorParallelSize": 3}, "prefill": {"tensorParallelSize": 3}})
    wait_for(lambda: cond(get_cr(api_client, ns, "good"), "Ready").get("reason") == "InvalidSpec", T, what="invalid")
    cr = wait_cr(
        api_client,
        ns,
        "good",
        lambda c: c["status"].get("observedGeneration") == c["metadata"]["generation"],
        "observed",
    )
    assert cond(cr, "HybridProfileApplied")["reason"] == "InvalidSpec"

    def untouched() -> bool:
        for r in contract.ROLES:
            after = deployment(api_client, ns, f"good-{r}-{g}")
            assert after.metadata.uid == before[r].metadata.uid
            assert after.metadata.generation == before[r].metadata.generation
            assert arg(list(container_of(after).args), "--tensor-parallel-size") == "2"
        return children(api_client, ns, "good") == expected("good", g) and not any(
            children(api_client, ns, "bad").values()
        )

    hold(untouched, 4 * float(RESYNC), "children of an invalid spec untouched")
    # one InvalidSpec Event per transition, not one per resync round
    warnings = [e for e in events(api_client, ns, "good") if e.reason == "InvalidSpec"]
    assert len(warnings) == 1 and warnings[0].count == 1


def test_deleting_the_cr_garbage_collects_children_even_with_the_operator_stopped(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "gone"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    operator.stop()
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(G, V, ns, P, name)
    empty = {k: [] for k in EXPECTED}
    wait_for(lambda: children(api_client, ns, name) == empty, 60, what="children garbage-collected")


def test_operator_killed_mid_reconcile_converges_without_orphans(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "killed"
    create(api_client, ns, seed(name))
    # SIGKILL as soon as the first child exists (the rest of the set is being applied)
    wait_for(lambda: any(children(api_client, ns, name).values()), T, interval=0.02, what="first child")
    operator.stop(signal.SIGKILL)
    operator.start()
    wait_ready(api_client, ns, name)
    assert children(api_client, ns, name) == expected(name, generation(seed(name), ns))
    rs = client.AppsV1Api(api_client).list_namespaced_replica_set(ns).items
    assert len([r for r in rs if (r.spec.replicas or 0) > 0]) == 3


def test_vllm_version_outside_the_table_is_refused_by_the_apiserver_naming_the_range(
    crd: None, api_client: client.ApiClient, namespace: str
) -> None:
    doc = seed("too-old")
    doc["spec"]["vllmVersion"] = "0.19.0"
    with pytest.raises(client.ApiException) as ei:
        create(api_client, namespace, doc)
    assert ei.value.status == 422
    assert "spec.vllmVersion must be a vLLM release from 0.20 to 0.33" in str(ei.value.body)


def test_image_tag_naming_another_vllm_release_is_a_warning_not_a_rejection(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "tagged"
    doc = seed(name)
    doc["spec"]["image"] = "ghcr.io/hybridpd/vllm-runtime:0.25.1"  # the spec still says vllmVersion 0.20.0
    create(api_client, ns, doc)
    cr = wait_ready(api_client, ns, name)  # applied: the flags follow spec.vllmVersion
    (warning,) = cr["status"]["profile"]["warnings"]
    assert "0.25.1" in warning and "0.20.0" in warning
    assert warning in cond(cr, "Ready")["message"]
    assert "--no-disable-hybrid-kv-cache-manager" in list(
        container_of(engine_deployment(api_client, ns, name, "decode")).args
    )
    assert {r["rule"] for r in cr["status"]["profile"]["rules"]} >= {"no-async-scheduling", "equal-block-size"}

    def event() -> bool:
        evs = client.CoreV1Api(api_client).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        return any(e.type == "Warning" and e.reason == "RiskySpec" and "0.25.1" in e.message for e in evs)

    wait_for(event, T, what="RiskySpec Event")
    # the image follows the version when only the version is set: no warning
    patch_spec(api_client, ns, name, {"image": None, "vllmVersion": "0.25.1"})
    cr = wait_cr(api_client, ns, name, lambda c: c["status"]["profile"].get("vllmVersion") == "0.25.1", "0.25.1")
    assert cr["status"]["profile"].get("warnings", []) == []

    # a new generation (0.25.1's flags) serves once kwok made it Ready
    def serving_decode() -> client.V1Deployment | None:
        d = engine_deployment(api_client, ns, name, "decode")
        return d if "--no-disable-hybrid-kv-cache-manager" not in container_of(d).args else None

    dep = wait_for(serving_decode, T, what="the generation of vLLM 0.25.1 serving")
    assert container_of(dep).image == "ghcr.io/hybridpd/vllm-runtime:0.25.1"


def test_a_decode_probe_failure_reaches_the_decode_ready_condition(
    operator: Operator, api_client: client.ApiClient, namespace: str, kubeconfig: Path
) -> None:
    """The decode runtime's exec readiness probe prints its reason; the kubelet turns it into an `Unhealthy`
    Event on the pod (posted here as the kubelet would: kwok runs no probes); the operator copies it into
    DecodeReady, so `kubectl describe hpd` shows it. The engine pods hold no credentials for any of this."""
    ns, name = namespace, "pairfail"
    doc = seed(name)
    doc["spec"]["decode"]["nodeSelector"] = {"example.com/no-such-node": "true"}  # the decode pod stays not Ready
    create(api_client, ns, doc)
    core = client.CoreV1Api(api_client)
    sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}=decode"
    pod = wait_for(lambda: next(iter(core.list_namespaced_pod(ns, label_selector=sel).items), None), T, what="pod")
    reason = (
        "P->D output differs from local on 3/16 prompts via prefill 10.0.0.7:8000: 650-token prompt: P->D logprob "
        "at token 0 is nan; if spec.blockSize is set, remove it (vLLM 0.20 raised 128 to a 640-token block on a "
        "64-token kernel block and corrupted P->D); prefill and decode must derive the same attention block size"
    )
    now = datetime.datetime.now(datetime.UTC)
    core.create_namespaced_event(
        ns,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.metadata.name}."),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod.metadata.name, namespace=ns, uid=pod.metadata.uid,
                field_path="spec.containers{vllm}",
            ),
            reason="Unhealthy", type="Warning", message=f"Readiness probe failed: {reason}",
            source=client.V1EventSource(component="kubelet", host="kwok-node-0"),
            first_timestamp=now, last_timestamp=now, count=1,
        ),
    )  # fmt: skip
    cr = wait_cr(
        api_client, ns, name, lambda c: reason in cond(c, "DecodeReady").get("message", ""), "reason in DecodeReady"
    )
    assert cond(cr, "DecodeReady")["status"] == "False" and cond(cr, "Ready")["status"] == "False"
    assert f"pod {pod.metadata.name}: {reason}" in cond(cr, "DecodeReady")["message"]
    described = kubectl(kubeconfig, "describe", "hpd", name, "-n", ns).stdout
    assert "P->D output differs from local" in described and "spec.blockSize" in described


def test_a_decode_reports_its_kv_path_and_the_operator_puts_it_in_the_status(
    operator: Operator, api_client: client.ApiClient, namespace: str, devcluster: Any, tmp_path: Path
) -> None:
    """The decode runtime reports the KV rate its pair check measured (the runtime's own code,
    hpd_runtime/kube_events.py, with a token of the ServiceAccount the operator gave the decode pods, as the kubelet
    would mount it: kwok runs no containers) onto its CR's kv-reporter Lease, and as an Event on its pod; the
    operator puts it into status.kvPath and DataPathVerified. Below the fabric's floor: reason KVPathBelowFloor and a
    Warning Event, Ready untouched. The token may patch that one Lease and create Events, nothing else."""
    ns, name = namespace, "kvpath"
    create(api_client, ns, seed(name))
    wait_ready(api_client, ns, name)
    pod, token, target = decode_reporter(api_client, ns, name, devcluster, tmp_path)
    reporter = kube_events.Reporter(target)
    fast = "KV moved at 14.2 GB/s, 173 MB per request over tcp (16 transfers)"
    assert reporter.report(fast, rate=14.2e9, per_request=173e6, fabric="tcp", slow=False, transport="tcp")
    assert not reporter.report(fast, rate=15e9, per_request=173e6, fabric="tcp", slow=False)  # not due: no new write

    cr = wait_cr(api_client, ns, name, lambda c: kv(c).get("bytesPerSecond") == 14_200_000_000, "status.kvPath")
    assert kv(cr) == {"pod": pod.metadata.name, "message": fast, "bytesPerSecond": 14_200_000_000,
                      "bytesPerRequest": 173_000_000, "fabric": "tcp", "transport": "tcp", "belowFloor": False,
                      "observedTime": kv(cr)["observedTime"]}  # fmt: skip
    path = cond(cr, "DataPathVerified")
    assert path["status"] == "True" and path["reason"] == "Verified" and fast in path["message"]
    on_pod = [e for e in events(api_client, ns, pod.metadata.name) if e.reason == contract.EVENT_REASON_KV_PATH]
    assert [e.message for e in on_pod] == [fast]  # the same report on the pod, for kubectl describe pod

    # the token patches its CR's Lease and creates Events, nothing else
    call = caller(devcluster, token)
    assert call("GET", f"/api/v1/namespaces/{ns}/events") == 403
    assert call("POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "x"}, "spec": {}}) == 403
    assert call("GET", f"/api/v1/namespaces/{ns}/secrets") == 403
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    assert call("GET", leases) == 403
    assert call("POST", leases, {"metadata": {"name": "x"}}) == 403
    assert call("GET", f"/api/v1/namespaces/{ns}/configmaps") == 403
    assert (
        call("POST", "/api/v1/namespaces/default/events", kube_events.event_body(target, "Normal", "x", {}, 0)) == 403
    )

    slow = "KV moved at 0.42 GB/s, 173 MB per request over rdma (16 transfers): below the 5 GB/s floor of fabric rdma"
    assert reporter.report(slow, rate=0.42e9, per_request=173e6, fabric="rdma", slow=True)  # the verdict flipped
    cr = wait_cr(api_client, ns, name, lambda c: cond(c, "DataPathVerified").get("reason") == "KVPathBelowFloor",
                 "DataPathVerified KVPathBelowFloor")  # fmt: skip
    assert kv(cr)["belowFloor"] is True and slow in cond(cr, "DataPathVerified")["message"]
    assert cond(cr, "DataPathVerified")["status"] == "True" and cond(cr, "Ready")["status"] == "True"
    warned = wait_for(lambda: [e for e in events(api_client, ns, name) if e.reason == "KVPathBelowFloor"], T,
                      what="a KVPathBelowFloor Event on the CR")  # fmt: skip
    assert warned[0].type == "Warning" and "0.42 GB/s" in warned[0].message


def test_only_a_crs_own_decode_pods_can_set_its_kv_path(
    operator: Operator, api_client: client.ApiClient, namespace: str, devcluster: Any, tmp_path: Path
) -> None:
    """The three spoofs of a KV path: (1) a KVPath Event about the victim's decode pod, posted by anyone who may
    create Events (here another CR's decode token), reaches nothing; (2) that token cannot write the victim's
    kv-reporter Lease; (3) a report of the victim's own decode stamped in 2099 does not win over its genuine
    reports. The victim's status keeps the genuine figure throughout."""
    ns = namespace
    for name in ("victim", "other"):
        create(api_client, ns, seed(name))
    for name in ("victim", "other"):
        wait_ready(api_client, ns, name)
    pod, _, own = decode_reporter(api_client, ns, "victim", devcluster, tmp_path / "victim")
    _, other_token, other = decode_reporter(api_client, ns, "other", devcluster, tmp_path / "other")
    genuine = "KV moved at 14.2 GB/s, 173 MB per request over tcp (16 transfers)"
    assert kube_events.Reporter(own).report(genuine, rate=14.2e9, per_request=173e6, fabric="tcp", slow=False)
    wait_cr(api_client, ns, "victim", lambda c: kv(c).get("message") == genuine, "the genuine report in status")

    # (1) an Event with reason KVPath about the victim's decode pod, in 2099, Warning: allowed, and ignored
    at_victim = dataclasses.replace(other, pod=pod.metadata.name, uid=pod.metadata.uid)
    ann = {contract.ANNOTATION_KV_BYTES_PER_SECOND: "1", contract.ANNOTATION_KV_BELOW_FLOOR: "true"}
    fake = kube_events.event_body(at_victim, "Warning", "KV moved at 0.00 GB/s (spoofed)", ann, 4_070_908_800)
    assert kube_events.post(at_victim, fake) == 201
    # (2) the other CR's token may not touch the victim's Lease (nor read it)
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/victim-kv-reporter"
    spoof = {"uid": pod.metadata.uid, "bytesPerSecond": 1, "belowFloor": True, "message": "spoofed",
             "observedTime": "2099-01-01T00:00:00Z"}  # fmt: skip
    body = {"metadata": {"annotations": {contract.ANNOTATION_KV_REPORT_PREFIX + pod.metadata.uid: json.dumps(spoof)}}}
    assert kube_events.patch_report(dataclasses.replace(at_victim, lease="victim-kv-reporter"), body) == 403
    assert caller(devcluster, other_token)("GET", lease) == 403
    # (3) the victim's own pod stamps a report in 2099: a time from the future never wins
    assert kube_events.patch_report(own, body) == 200
    hold(lambda: kv(get_cr(api_client, ns, "victim")).get("message") == genuine, 6, "the genuine report stays")
    victim = get_cr(api_client, ns, "victim")
    assert cond(victim, "DataPathVerified")["reason"] == "Verified", cond(victim, "DataPathVerified")
    assert not [e for e in events(api_client, ns, "victim") if e.reason == "KVPathBelowFloor"]


def kv(c: dict[str, Any]) -> dict[str, Any]:
    return dict((c.get("status") or {}).get("kvPath") or {})


def decode_reporter(
    api_client: client.ApiClient, ns: str, name: str, devcluster: Any, tmp: Path
) -> tuple[client.V1Pod, str, kube_events.Target]:
    """CR `name`'s decode pod, a token of its ServiceAccount as the kubelet would project it, and the runtime's
    report target built from the pod's env (the Lease name the operator rendered)."""
    core = client.CoreV1Api(api_client)
    sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}=decode"
    pod = core.list_namespaced_pod(ns, label_selector=sel).items[0]
    sa = pod.spec.service_account_name
    assert sa == f"{name}-kv-reporter" and pod.spec.automount_service_account_token is True
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert env[contract.ENV_POD_NAME].value_from.field_ref.field_path == "metadata.name"
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    token = core.create_namespaced_service_account_token(sa, ns, request).status.token
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "token").write_text(token)
    target = kube_events.Target(
        server=devcluster.server, token_path=str(tmp / "token"), ca_path=str(devcluster.pki / "ca.crt"),
        pod=pod.metadata.name, namespace=ns, uid=pod.metadata.uid,
        lease=env[contract.ENV_KV_REPORT_LEASE].value,
    )  # fmt: skip
    return pod, token, target


def caller(devcluster: Any, token: str) -> Callable[..., int]:
    """call(method, path, body=None) -> the HTTP status of one request with `token`."""
    ca = str(devcluster.pki / "ca.crt")

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> int:
        req = urllib.request.Request(devcluster.server + path, method=method, data=json.dumps(body).encode()
                                     if body else None, headers={"Authorization": f"Bearer {token}",
                                                                 "Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=ca)) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    return call
