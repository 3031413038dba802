"""Every failed reconcile is retried with capped per-key backoff, never left for the safety resync (issue #24), and
a CR stuck on one failure costs API requests at the backoff's rate however many events arrive (issue #32).

The operators here run with the safety resync out of the picture (`--resync-seconds 3600`): a CR that converges did so
by a retry. Faults come from a loopback proxy in front of the real kube-apiserver (tests/cluster/faultproxy.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for

from .conftest import Operator
from .faultproxy import Fault, FaultProxy, fault_proxy
from .kube import T, cond, cr_warnings, create, get_cr, seed, wait_cr, wait_ready
from .test_event_driven import op_metrics

NO_RESYNC = "3600"
BACKOFF_CAP = 60.0
"""The work queue's cap (WorkQueue.max_delay): a CR whose fault cleared converges within one more step of it."""


@pytest.fixture()
def proxy(kubeconfig: Path) -> Iterator[FaultProxy]:
    with fault_proxy(kubeconfig) as p:
        yield p


@pytest.fixture()
def start_proxied(
    proxy: FaultProxy, operator_factory: Callable[..., Operator], tmp_path: Path
) -> Callable[..., Operator]:
    """start(*extra_args): the operator, talking to the apiserver through `proxy`."""
    return lambda *extra: operator_factory(*extra, via=proxy.kubeconfig(tmp_path / "proxy.kubeconfig"))


def warnings(api: client.ApiClient, ns: str, name: str) -> list[client.CoreV1Event]:
    return cr_warnings(api, ns, name)


@pytest.mark.parametrize("code", [403, 409, 429, 500])
def test_an_apiserver_refusal_is_retried_with_backoff_and_reported_once(
    code: int, proxy: FaultProxy, start_proxied: Callable[..., Operator], api_client: client.ApiClient, namespace: str
) -> None:
    """The first applies of the CR's children are answered `code`; the CR converges after the fault clears, by a retry
    (the resync is an hour away), with exactly one Warning Event for the episode and the code in the status."""
    ns, name = namespace, f"fault-{code}"
    fault = Fault(code=code, count=4, path=rf"/namespaces/{ns}/")
    proxy.faults.append(fault)
    op = start_proxied()
    create(api_client, ns, seed(name))
    wait_for(lambda: fault.served == fault.count, T, what=f"the {fault.count} injected {code}s")
    wait_ready(api_client, ns, name, timeout=BACKOFF_CAP + T)
    # The ApplyFailed status lasts one backoff step (0.5 s): its Event, posted on the transition, is what stays.
    warned = wait_for(lambda: warnings(api_client, ns, name), T, what="the episode's Warning Event")
    assert [(e.reason, e.count) for e in warned] == [("ApplyFailed", 1)], [e.message for e in warned]
    assert f"{code} " in warned[0].message, warned[0].message
    assert op_metrics(op)["workqueue_retries_total"] >= 1


def test_a_refused_status_write_is_an_event_with_the_apiservers_code_and_is_retried(
    proxy: FaultProxy, start_proxied: Callable[..., Operator], api_client: client.ApiClient, namespace: str
) -> None:
    """Issue #32 item 4: a status PATCH the apiserver refuses (a CR too large to store a status beside it) was
    invisible: no status, no Event, `ApiException()` in the log. Now: one Warning Event naming the code and the
    apiserver's message, the code and message in the log, and the status written once the apiserver accepts it."""
    ns, name = namespace, "status-refused"
    path, too_large = rf"/namespaces/{ns}/hybridpddeployments/{name}/status", "etcdserver: request is too large"
    fault = Fault(code=500, count=3, path=path, content_type="merge-patch", message=too_large)
    proxy.faults.append(fault)
    op = start_proxied()
    create(api_client, ns, seed(name))
    wait_for(lambda: fault.served == fault.count, T, what="the refused status writes")
    evs = wait_for(
        lambda: [e for e in warnings(api_client, ns, name) if e.reason == "StatusWriteFailed"], T, what="Event"
    )
    assert len(evs) == 1 and evs[0].count == 1, [(e.message, e.count) for e in evs]
    assert "500" in evs[0].message and "etcdserver: request is too large" in evs[0].message
    wait_ready(api_client, ns, name, timeout=BACKOFF_CAP + T)
    log = op.log.read_text()
    assert re.search(r"500 [A-Za-z ]+: etcdserver: request is too large", log), "no code and message in the log"
    assert "ApiException()" not in log


def test_a_stuck_cr_costs_requests_at_the_backoff_rate_under_churn(
    operator_factory: Callable[..., Operator], api_client: client.ApiClient, namespace: str
) -> None:
    """Issue #32 item 1: a CR in OwnershipConflict made 60-72 create attempts a minute instead of 6, and ten metadata
    edits raised it to 120 (one more timer per event). Now one waiting entry per key and label/annotation edits queue
    nothing: under 40 edits its requests stay at the backoff's rate (capped at --recheck-seconds)."""
    ns, name, recheck = namespace, "stuck", 2.0
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service(  # holds the router Service's name, without the operator's label: a conflict
        ns, {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}}
    )
    op = operator_factory("--recheck-seconds", str(recheck))
    create(api_client, ns, seed(name))
    wait_cr(api_client, ns, name, lambda c: cond(c, "Ready").get("reason") == "OwnershipConflict", "conflict")
    time.sleep(2 * recheck)  # let the backoff reach its cap (0.5, 1, 2, 2 ...)
    before, t0 = op_metrics(op)["hpd_operator_api_requests_total"], time.monotonic()
    custom = client.CustomObjectsApi(api_client)
    for i in range(40):  # metadata churn: labels and annotations, no spec change
        custom.patch_namespaced_custom_object(
            "hybridpd.io", "v1alpha1", ns, "hybridpddeployments", name,
            {"metadata": {"labels": {"churn": str(i)}, "annotations": {"churn": str(i)}}},
        )  # fmt: skip
        time.sleep(0.25)
    elapsed = time.monotonic() - t0
    made = op_metrics(op)["hpd_operator_api_requests_total"] - before
    # each retry: one create-only apply (409) + one GET saying who holds the name
    allowed = 2 * (elapsed / recheck + 2)
    assert made <= allowed, f"{made:.0f} requests in {elapsed:.1f} s, the backoff allows {allowed:.0f}"
    assert made >= 2, "the conflict was not retried at all"
    core.delete_namespaced_service(name, ns)
    wait_ready(api_client, ns, name, timeout=recheck + T)
    assert get_cr(api_client, ns, name)["metadata"]["labels"]["churn"] == "39"
