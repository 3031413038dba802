"""spec.kvTransfer.processNamespace: `Host` puts every engine pod (Deployment, LeaderWorkerSet leader and workers) into
the node's PID namespace and says so as a security trade (status.profile, DataPathVerified, a Warning Event); the
default renders `hostPID: false` as before, and a podTemplate's own `hostPID` stays refused."""

from __future__ import annotations

from typing import Any

import pytest

from hpd_operator.api.models import HybridPDDeployment, KvTransferSpec
from hpd_operator.api.processns import data_path_note, security_event, shares_host_pid
from hpd_operator.api.rules import violations
from hpd_operator.builders import build_all
from hpd_operator.conditions import Reason
from hpd_operator.errors import SpecError
from hpd_operator.profile import compute_profile
from hpd_operator.status import Observation, compute_status
from hpd_operator.validation import validate
from hpd_runtime import contract as c

ATTENTION = {"name": "x/y", "hybrid": "none"}
SINGLE = {"prefill": {"tensorParallelSize": 1}, "decode": {"tensorParallelSize": 1}}
MULTI = {"prefill": {"tensorParallelSize": 8}, "decode": {"tensorParallelSize": 16, "gpusPerNode": 8}}
"""Prefill a Deployment, decode a LeaderWorkerSet of two pods per replica."""


def cr(roles: dict[str, Any], **kv: Any) -> HybridPDDeployment:
    spec = {"model": ATTENTION, "vllmVersion": "0.27.1", **roles, **({"kvTransfer": kv} if kv else {})}
    return HybridPDDeployment.model_validate({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})


def pod_specs(x: HybridPDDeployment) -> dict[str, dict[str, Any]]:
    """Every pod spec the render holds, by `<kind>/<component>[/<leader|worker>]`."""
    out: dict[str, dict[str, Any]] = {}
    for o in build_all(x, compute_profile(validate(x))):
        comp = o["metadata"]["labels"].get(c.LABEL_COMPONENT)
        if o["kind"] == "Deployment":
            out[f"Deployment/{comp}"] = o["spec"]["template"]["spec"]
        elif o["kind"] == "LeaderWorkerSet":
            lwt = o["spec"]["leaderWorkerTemplate"]
            out[f"LeaderWorkerSet/{comp}/leader"] = lwt["leaderTemplate"]["spec"]
            out[f"LeaderWorkerSet/{comp}/worker"] = lwt["workerTemplate"]["spec"]
    return out


ENGINE_PODS = {
    "single": (SINGLE, {"Deployment/prefill", "Deployment/decode"}),
    "multi": (MULTI, {"Deployment/prefill", "LeaderWorkerSet/decode/leader", "LeaderWorkerSet/decode/worker"}),
}


@pytest.mark.parametrize("shape", sorted(ENGINE_PODS))
def test_host_puts_every_engine_pod_and_only_those_into_the_nodes_pid_namespace(shape: str) -> None:
    roles, engines = ENGINE_PODS[shape]
    pods = pod_specs(cr(roles, processNamespace="Host"))
    assert engines <= set(pods)
    for key, pod in pods.items():
        assert pod["hostPID"] is (key in engines), key
        assert (pod["hostNetwork"], pod["hostIPC"]) == (False, False), key
        if key in engines:  # nothing else of the pod's isolation moves
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["containers"][0]["securityContext"]["privileged"] is False


@pytest.mark.parametrize("shape", sorted(ENGINE_PODS))
def test_the_default_and_pod_render_hostpid_false_and_identically(shape: str) -> None:
    roles, _ = ENGINE_PODS[shape]
    default, pod = cr(roles), cr(roles, processNamespace="Pod")
    assert default.spec.kv_transfer.process_namespace == "Pod"
    assert all(p["hostPID"] is False for p in pod_specs(default).values())
    assert build_all(default, compute_profile(validate(default))) == build_all(pod, compute_profile(validate(pod)))


def test_host_is_a_new_generation() -> None:
    """The pod templates differ, so opting in (or out) rolls out a new generation, never edits running pods."""
    a, b = cr(SINGLE), cr(SINGLE, processNamespace="Host")
    names = [{o["metadata"]["name"] for o in build_all(x, compute_profile(validate(x)))} for x in (a, b)]
    assert names[0] != names[1]


def test_a_pod_templates_own_hostpid_stays_refused_with_host_too() -> None:
    roles = {**SINGLE, "decode": {"tensorParallelSize": 1, "podTemplate": {"spec": {"hostPID": True}}}}
    with pytest.raises(SpecError) as ei:
        validate(cr(roles, processNamespace="Host"))
    assert "spec.decode.podTemplate.spec.hostPID" in {v.field for v in ei.value.violations}


def test_only_pod_and_host_are_accepted() -> None:
    with pytest.raises(ValueError, match="processNamespace"):
        cr(SINGLE, processNamespace="host")


@pytest.mark.parametrize(
    ("tls", "refused"),
    [(None, False), ("tcp,cuda_copy,cuda_ipc", False), ("all", False), ("tcp,cuda", False), ("^rc", False),
     ("tcp,cuda_copy", True), ("sm,tcp", True)],
)  # fmt: skip
def test_host_needs_ucx_tls_that_lets_cuda_ipc_in(tls: str | None, refused: bool) -> None:
    kv = {"processNamespace": "Host", **({"ucx": {"tls": tls}} if tls is not None else {})}
    found = {(v.field, v.rule) for v in violations("kvTransfer", KvTransferSpec.model_validate(kv), "spec.kvTransfer")}
    assert (("spec.kvTransfer.processNamespace", "host-pid-namespace-needs-cuda-ipc") in found) is refused
    pod = {"ucx": {"tls": "tcp,cuda_copy"}}  # the same list without the opt-in is not this rule's business
    assert not violations("kvTransfer", KvTransferSpec.model_validate(pod), "spec.kvTransfer")


def test_validate_names_the_field_of_a_host_opt_in_without_cuda_ipc() -> None:
    with pytest.raises(SpecError) as ei:
        validate(cr(SINGLE, processNamespace="Host", ucx={"tls": "tcp,cuda_copy"}))
    assert {(v.field, v.rule) for v in ei.value.violations} == {
        ("spec.kvTransfer.processNamespace", "host-pid-namespace-needs-cuda-ipc")
    }
    assert "leaves cuda_ipc out" in str(ei.value)


def test_status_profile_names_the_trade_only_when_opted_in() -> None:
    def host_pid(x: HybridPDDeployment) -> list[dict[str, Any]]:
        injections = compute_profile(validate(x)).status()["injections"]
        assert isinstance(injections, list)
        return [i for i in injections if i["setting"] == "hostPID"]

    assert host_pid(cr(SINGLE)) == []
    shown = host_pid(cr(MULTI, processNamespace="Host"))
    assert [i["role"] for i in shown] == ["prefill", "decode"] and {i["value"] for i in shown} == {"true"}
    for reason in (i["reason"] for i in shown):
        assert "cuda_ipc" in reason and "nothing across nodes" in reason
        assert "sees every process of the node" in reason and "privileged" in reason


def _data_path_message(x: HybridPDDeployment) -> str:
    ready = {"metadata": {"generation": 1}, "spec": {"replicas": 1},
             "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}  # fmt: skip
    kv = {"pod": "p-decode-0", "message": "tcp emulation: 0.4 GB/s", "transport": "tcp emulation"}
    obs = Observation(
        name="p", namespace="ns", spec=x.spec, observed={"prefill": ready, "decode": ready, "router": ready},
        generation=1, profile=compute_profile(validate(x)), kv_path=kv,
    )  # fmt: skip
    [path] = [cond for cond in compute_status(obs)["conditions"] if cond["type"] == "DataPathVerified"]
    assert path["status"] == "True"
    message: str = path["message"]
    return message


def test_data_path_verified_says_the_pid_namespace_is_shared_only_when_it_is() -> None:
    shared = _data_path_message(cr(SINGLE, processNamespace="Host"))
    assert "PID namespace shared with the node" in shared and "security trade" in shared
    assert "tcp emulation: 0.4 GB/s" in shared  # the measured report is still there
    assert "PID namespace" not in _data_path_message(cr(SINGLE))


def test_the_warning_event_is_the_shared_host_pid_reason_with_the_trade() -> None:
    assert security_event(cr(SINGLE).spec.kv_transfer) is None
    event = security_event(cr(SINGLE, processNamespace="Host").spec.kv_transfer)
    assert event is not None
    reason, message = event
    assert reason == Reason.SHARED_HOST_PID_NAMESPACE == "SharedHostPIDNamespace"
    assert "hostPID: true" in message and "privileged" in message and "nothing across nodes" in message
    assert shares_host_pid(cr(SINGLE, processNamespace="Host").spec.kv_transfer)
    assert data_path_note(cr(SINGLE).spec.kv_transfer) is None
