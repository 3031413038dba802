"""spec.kvTransfer.processNamespace against the real apiserver: `Host` puts the engine pods (never the router) into
the node's PID namespace, the security trade is a Warning Event posted once per CR generation (not once per
reconcile) and named in DataPathVerified, and opting out rolls out a generation without hostPID."""

from __future__ import annotations

from kubernetes import client

from hpd_devcluster.testing import wait_for

from .conftest import Operator
from .kube import (
    T,
    cond,
    cr_warnings,
    create,
    deployment,
    engine_deployment,
    get_cr,
    hold,
    patch_spec,
    seed,
    wait_cr,
    wait_ready,
)

TRADE_REASON = "SharedHostPIDNamespace"


def test_host_pid_opt_in_renders_host_pid_on_engines_only_and_warns_once_per_generation(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    ns, name = namespace, "hostpid"
    doc = seed(name)
    doc["spec"].setdefault("kvTransfer", {})["processNamespace"] = "Host"
    create(api_client, ns, doc)
    cr = wait_ready(api_client, ns, name)
    for role in ("prefill", "decode"):
        assert engine_deployment(api_client, ns, name, role).spec.template.spec.host_pid is True, role
    assert not deployment(api_client, ns, f"{name}-router").spec.template.spec.host_pid
    assert "PID namespace shared with the node" in cond(cr, "DataPathVerified")["message"]
    profile = str(cr["status"]["profile"])
    assert "hostPID" in profile and "security trade" in profile

    def trades() -> list[client.CoreV1Event]:
        return [e for e in cr_warnings(api_client, ns, name) if e.reason == TRADE_REASON]

    wait_for(lambda: trades() or None, T, what=f"a {TRADE_REASON} Warning Event")
    # A metadata-only change reconciles the same generation again: the trade is not posted again.
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        "hybridpd.io", "v1alpha1", ns, "hybridpddeployments", name, {"metadata": {"labels": {"touched": "yes"}}}
    )
    hold(
        lambda: [(e.count or 1) for e in trades()] == [1],
        6,
        f"one {TRADE_REASON} Event, counted once, over several reconciles of one generation",
    )

    # Opting out: a new generation whose engine pods keep their own PID namespace; the message no longer says shared.
    patch_spec(api_client, ns, name, {"kvTransfer": {"processNamespace": "Pod"}})

    def own_pid_namespaces() -> bool:
        return all(
            not engine_deployment(api_client, ns, name, role).spec.template.spec.host_pid
            for role in ("prefill", "decode")
        )

    wait_for(own_pid_namespaces, T, what="engine Deployments without hostPID after opting out")
    cr = wait_cr(
        api_client,
        ns,
        name,
        lambda c: (
            cond(c, "Ready").get("status") == "True"
            and "PID namespace shared" not in cond(c, "DataPathVerified").get("message", "")
        ),
        "Ready without the shared-namespace note",
    )
    assert "hostPID" not in str(get_cr(api_client, ns, name)["status"]["profile"])
    assert [(e.count or 1) for e in trades()] == [1]
