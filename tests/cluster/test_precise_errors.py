"""Issue #32 item 5 on the real control plane: each error names what the CR author wrote and can fix.

- a typed extraArgs value vLLM's parser would refuse is InvalidSpec naming the item (not a crash-looping pod);
- a child the apiserver refuses names the CR's field behind the child's field (ApplyFailed);
- a pod waiting for a scheduler that does not exist makes its role Degraded (NotScheduled), not silently Pending.
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client

from .conftest import Operator
from .kube import T, cond, create, seed, wait_cr


def test_a_value_vllm_would_refuse_is_invalid_spec_naming_the_item(
    operator_factory: Callable[..., Operator], api_client: client.ApiClient, namespace: str
) -> None:
    operator_factory()
    doc = seed("typed")
    doc["spec"]["decode"]["extraArgs"] = ["--max-num-seqs", "\N{ROCKET}"]
    create(api_client, namespace, doc)
    cr = wait_cr(
        api_client, namespace, "typed", lambda c: cond(c, "Ready").get("reason") == "InvalidSpec", "InvalidSpec"
    )
    msg = cond(cr, "Ready")["message"]
    assert "spec.decode.extraArgs[1]" in msg and "--max-num-seqs invalid int value" in msg, msg


def test_a_refused_child_names_the_crs_field(
    operator_factory: Callable[..., Operator], api_client: client.ApiClient, namespace: str
) -> None:
    """spec.env names are not checked by the CRD: the apiserver refuses the Deployment, naming its own field
    (`spec.template.spec.containers[0].env[N].name`); the condition adds `spec.env[0].name`."""
    operator_factory()
    doc = seed("badenv")
    doc["spec"]["env"] = [{"name": "BAD=NAME", "value": "x"}]  # "=" is refused even with relaxed env names
    create(api_client, namespace, doc)
    cr = wait_cr(
        api_client, namespace, "badenv", lambda c: cond(c, "Ready").get("reason") == "ApplyFailed", "ApplyFailed"
    )
    msg = cond(cr, "Ready")["message"]
    assert "spec.template.spec.containers[0].env[" in msg and "[the CR's field: spec.env[0].name]" in msg, msg


def test_a_pod_no_scheduler_looks_at_makes_its_role_degraded(
    operator_factory: Callable[..., Operator], api_client: client.ApiClient, namespace: str
) -> None:
    operator_factory("--not-scheduled-seconds", "3")
    doc = seed("nosched")
    doc["spec"]["decode"]["podTemplate"] = {"spec": {"schedulerName": "no-such-scheduler"}}
    create(api_client, namespace, doc)
    cr = wait_cr(
        api_client, namespace, "nosched", lambda c: cond(c, "Degraded").get("reason") == "NotScheduled", "NotScheduled",
        timeout=T + 10,
    )  # fmt: skip
    msg = cond(cr, "DecodeReady")["message"]
    assert "'no-such-scheduler'" in msg and "no scheduler has looked at it" in msg, msg
    assert cond(cr, "Ready")["status"] == "False"
