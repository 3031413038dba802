"""A generation the apiserver refuses costs a few requests a minute, not a write loop.

When the apiserver refused both engine Deployments of the desired generation, every reconcile gave that generation a
new number and wrote it into the router Deployment, the generation's Services and status.rollout; each write queued
the next reconcile, so the backoff never applied (a router at generation 514 with 405 ReplicaSets in 60 s, ~4,000
operator writes a minute). Two triggers, each reproduced here beside a CR that serves and then gets the bad edit:

- a spec the CRD admits and server-side apply refuses (two env entries named `A`);
- a site ValidatingAdmissionPolicy that refuses Deployments labelled `hybridpd.io/role`.

The operator runs without the safety resync and with its retry backoff capped at BACKOFF seconds (`run
--max-backoff-seconds`; 60 s for users), so a window of PERIODS capped retry periods takes seconds, not minutes.
From the moment every CR says Blocked, each CR may be reconciled at most RAMP + PERIODS + 2 times in the window (the
backoff's steps below the cap, one per period, one at each edge), each time two refused applies (prefill and decode):
the retries and the writes must stay under that for the whole window (a write loop reconciles on its own writes'
watch events, hundreds a minute whatever the backoff), the router's ReplicaSets must not grow, the target generation
keeps its number, and the status must say it is Blocked with the apiserver's refusal while the old generation keeps
serving.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import T, create, get_cr, hold, operator_metrics, patch_spec, seed, wait_cr, wait_ready

BACKOFF = 4.0
"""The operator's retry backoff cap in this test (`--max-backoff-seconds`)."""
PERIODS = 4
"""Capped retry periods the window holds."""
WINDOW = PERIODS * BACKOFF
RAMP = math.ceil(math.log2(BACKOFF / 0.5))
"""The backoff's steps below the cap (0.5 s doubling: 0.5, 1, 2 s before 4 s) a CR may still take in the window."""
APPLIES_PER_RETRY = 2
"""A retry of a refused generation applies its prefill and decode Deployments, both refused (PATCH; measured: 26 of
26 writes in the window were PATCHes, for 14 retries and the reconciles in flight at its edges)."""
DUPLICATE_ENV = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def writes_total(op: Operator) -> float:
    return sum(writes_by_method(op).values())


def writes_by_method(op: Operator) -> dict[str, float]:
    return {m: operator_metrics(op.metrics_port, method=m).get("hpd_operator_api_requests_total", 0.0) for m in WRITES}


def retries_total(op: Operator) -> float:
    return operator_metrics(op.metrics_port).get("workqueue_retries_total", 0.0)


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
    op = operator_factory("--max-backoff-seconds", str(BACKOFF))  # no safety resync: events and the backoff only
    create(api_client, ns, seed("serving"))
    wait_ready(api_client, ns, "serving")
    bad_env = seed("bad-env")
    bad_env["spec"]["env"] = DUPLICATE_ENV
    create(api_client, ns, bad_env)
    create(api_client, ns, seed(role_deployments_refused))
    patch_spec(api_client, ns, "serving", {"env": DUPLICATE_ENV})  # the same bad edit on a CR that serves
    names = ("serving", "bad-env", role_deployments_refused)
    first = {n: wait_cr(api_client, ns, n, blocked, f"{n}: rollout Blocked", timeout=T) for n in names}

    by_method, retried = writes_by_method(op), retries_total(op)
    before = sum(by_method.values())
    rollouts = {n: get_cr(api_client, ns, n)["status"]["rollout"] for n in names}
    replicasets = {n: router_replicasets(api_client, ns, n) for n in names}
    most_retries = len(names) * (RAMP + PERIODS + 2)
    most_writes = APPLIES_PER_RETRY * most_retries
    seen: dict[str, float] = {}

    def bounded() -> bool:
        now = writes_by_method(op)
        seen.update({m: now[m] - by_method[m] for m in WRITES}, retries=retries_total(op) - retried)
        seen["writes"] = sum(seen[m] for m in WRITES)
        return seen["retries"] <= most_retries and seen["writes"] <= most_writes

    # a negative claim over PERIODS capped backoff periods: it fails the moment a write loop shows
    try:
        hold(bounded, WINDOW, f"at most {most_retries} retries and {most_writes} writes in {WINDOW:.0f} s")
    except AssertionError as e:
        raise AssertionError(f"{e}\nsince every CR said Blocked: {seen}") from None
    made = writes_total(op) - before
    assert retries_total(op) - retried >= len(names) * PERIODS // 2, f"the stuck CRs were not retried: {seen}"
    after = {n: get_cr(api_client, ns, n)["status"]["rollout"] for n in names}

    print(f"\noperator writes in {WINDOW:.0f} s for {len(names)} CRs with a refused generation: {made:.0f} ({seen})")
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
    ok = wait_ready(api_client, ns, "bad-env", timeout=T + BACKOFF)  # at most one backoff step away
    wait_for(lambda: get_cr(api_client, ns, "bad-env")["status"]["rollout"]["state"] == "Complete", T, what="done")
    assert ok["status"]["rollout"]["servingGeneration"] == 1, ok["status"]["rollout"]
