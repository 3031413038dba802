"""A generation the apiserver refuses costs a few requests a minute, not a write loop.

When the apiserver refused both engine Deployments of the desired generation, every reconcile gave that generation a
new number and wrote it into the router Deployment, the generation's Services and status.rollout; each write queued
the next reconcile, so the backoff never applied (a router at generation 514 with 405 ReplicaSets in 60 s, ~4,000
operator writes a minute). Two triggers, each reproduced here beside a CR that serves and then gets the bad edit:

- a spec the CRD admits and server-side apply refuses (two env entries named `A`);
- a site ValidatingAdmissionPolicy that refuses Deployments labelled `hybridpd.io/role`.

The operator runs without the safety resync; after the backoff has reached its cap (60 s), a window of a minute must
hold fewer than 10 writes over all the CRs' retries, the router's ReplicaSets must not grow, and the status must say
the target generation is Blocked with the apiserver's refusal while the old generation keeps serving.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import T, create, get_cr, operator_metrics, patch_spec, seed, wait_cr, wait_ready

WINDOW = 60.0
"""Seconds over which writes are counted, after the backoff reached its cap."""
SETTLE = 35.0
"""Seconds after the refusal before the window opens: the backoff (0.5 s doubling) has passed 16 s by then, so the
window holds its 32 s and 64 s steps: about two retries per CR."""
DUPLICATE_ENV = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def writes_total(op: Operator) -> float:
    return operator_metrics(op.metrics_port, method=WRITES).get("hpd_operator_api_requests_total", 0.0)


@pytest.fixture()
def role_deployments_refused(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """A site policy (as a platform team writes one) refusing Deployments labelled hybridpd.io/role of the CR
    instance `site-policy` in this test's namespace; returns that instance name. Removed afterwards."""
    adm = client.AdmissionregistrationV1Api(api_client)
    name = f"refuse-engines-{namespace}"
    instance = "site-policy"
    rule = {
        "apiGroups": ["apps"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["deployments"],
    }
    ours = (
        f"object.metadata.namespace == '{namespace}' && "
        f"object.metadata.?labels['{contract.LABEL_INSTANCE}'].orValue('') == '{instance}'"
    )
    refuse = f"!has(object.metadata.labels) || !('{contract.LABEL_ROLE}' in object.metadata.labels)"
    spec = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [rule]},
        "matchConditions": [{"name": "ours", "expression": ours}],
        "validations": [{"expression": refuse, "message": "site policy: engine Deployments need an approved GPU pool"}],
    }
    adm.create_validating_admission_policy({"metadata": {"name": name}, "spec": spec})
    adm.create_validating_admission_policy_binding(
        {"metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
    )
    yield instance
    adm.delete_validating_admission_policy_binding(name)
    adm.delete_validating_admission_policy(name)


def router_replicasets(api: client.ApiClient, ns: str, name: str) -> int:
    sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}={contract.COMPONENT_ROUTER}"
    return len(client.AppsV1Api(api).list_namespaced_replica_set(ns, label_selector=sel).items)


def blocked(cr: dict[str, Any]) -> bool:
    ro = (cr.get("status") or {}).get("rollout") or {}
    return (cr.get("status") or {}).get("observedGeneration") == cr["metadata"]["generation"] and ro.get(
        "state"
    ) == "Blocked"


def test_a_refused_generation_backs_off_and_writes_no_new_number(
    operator_factory: Callable[..., Operator],
    api_client: client.ApiClient,
    namespace: str,
    role_deployments_refused: str,
    tmp_path: Path,
) -> None:
    ns = namespace
    op = operator_factory()  # no safety resync: only events and the backoff drive reconciles
    create(api_client, ns, seed("serving"))
    wait_ready(api_client, ns, "serving")
    bad_env = seed("bad-env")
    bad_env["spec"]["env"] = DUPLICATE_ENV
    create(api_client, ns, bad_env)
    create(api_client, ns, seed(role_deployments_refused))
    patch_spec(api_client, ns, "serving", {"env": DUPLICATE_ENV})  # the same bad edit on a CR that serves
    names = ("serving", "bad-env", role_deployments_refused)
    first = {n: wait_cr(api_client, ns, n, blocked, f"{n}: rollout Blocked", timeout=T) for n in names}
    time.sleep(SETTLE)

    before = writes_total(op)
    rollouts = {n: get_cr(api_client, ns, n)["status"]["rollout"] for n in names}
    replicasets = {n: router_replicasets(api_client, ns, n) for n in names}
    time.sleep(WINDOW)
    made = writes_total(op) - before
    after = {n: get_cr(api_client, ns, n)["status"]["rollout"] for n in names}

    print(f"\noperator writes in {WINDOW:.0f} s for {len(names)} CRs with a refused generation: {made:.0f}")
    # 3 CRs, about 2 retries each in the window, each retry 2 refused applies (prefill and decode): a loop is 1000s
    assert made < 10 * len(names), f"{made:.0f} operator writes in {WINDOW:.0f} s for {len(names)} stuck CRs"
    for n in names:
        assert router_replicasets(api_client, ns, n) == replicasets[n], f"{n}: the router rolled again"
        same = ("targetGeneration", "targetHash", "latestGeneration", "servingGeneration", "state")
        assert {k: after[n][k] for k in same} == {k: rollouts[n][k] for k in same}, (n, rollouts[n], after[n])
        assert after[n]["targetGeneration"] == first[n]["status"]["rollout"]["targetGeneration"], n
        assert "cannot be created: the apiserver refused Deployment" in after[n]["message"], after[n]["message"]

    served = get_cr(api_client, ns, "serving")["status"]["rollout"]
    assert (served["servingGeneration"], served["targetGeneration"]) == (1, 2), served
    assert "generation 1 (" in served["message"] and "keeps serving" in served["message"], served["message"]
    assert "duplicate entries" in served["message"], served["message"]
    site = get_cr(api_client, ns, role_deployments_refused)["status"]["rollout"]
    assert "site policy: engine Deployments need an approved GPU pool" in site["message"], site["message"]
    assert "nothing serves yet" in site["message"], site["message"]

    # the fix converges: the refused generation keeps its number and serves once the apiserver takes it
    patch_spec(api_client, ns, "bad-env", {"env": [{"name": "A", "value": "1"}]})
    ok = wait_ready(api_client, ns, "bad-env", timeout=T + 60)  # at most one backoff step (60 s) away
    wait_for(lambda: get_cr(api_client, ns, "bad-env")["status"]["rollout"]["state"] == "Complete", T, what="done")
    assert ok["status"]["rollout"]["servingGeneration"] == 1, ok["status"]["rollout"]
