"""The event-driven reconcile's pure parts: the work queue's semantics (client-go's), the drift test, the cache."""

from __future__ import annotations

import threading
from typing import Any

from hpd_operator import drift
from hpd_operator.cache import Cache
from hpd_operator.workqueue import ShutDown, WorkQueue
from hpd_runtime import contract

# --- work queue ------------------------------------------------------------------------------------------------------


def test_a_waiting_key_is_queued_once() -> None:
    q: WorkQueue[str] = WorkQueue("t1")
    for k in ("a", "b", "a", "a"):
        q.add(k)
    assert len(q) == 2
    assert q.get() == "a" and q.get() == "b"
    q.shutdown()


def test_a_key_added_while_in_flight_runs_once_more_afterwards_never_twice_at_once() -> None:
    q: WorkQueue[str] = WorkQueue("t2")
    q.add("a")
    assert q.get() == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0  # not handed to a second worker while the first holds it
    q.done("a")
    assert len(q) == 1 and q.get() == "a"
    q.done("a")
    assert q.idle()
    q.shutdown()


def test_add_after_and_backoff_per_key() -> None:
    q: WorkQueue[str] = WorkQueue("t3", base_delay=0.01, max_delay=0.04)
    assert [q.add_rate_limited("a") for _ in range(4)] == [0.01, 0.02, 0.04, 0.04]
    q.forget("a")
    assert q.add_rate_limited("a") == 0.01
    got = threading.Event()

    def take() -> None:
        assert q.get() == "a"
        got.set()

    t = threading.Thread(target=take)
    t.start()
    assert got.wait(5), "a delayed add never arrived"
    t.join()
    q.shutdown()


def test_a_key_waits_at_most_once_and_the_earliest_time_wins() -> None:
    q: WorkQueue[str] = WorkQueue("t5")
    for _ in range(50):  # e.g. a retry after every event of a CR stuck in a conflict
        q.add_after("a", 30.0)
    q.add_after("a", 60.0)  # later: changes nothing
    assert q._due.keys() == {"a"} and 29 < (q.waiting("a") or 0) <= 30
    q.add_after("a", 0.05)  # earlier: moves the one entry forward
    assert 0 < (q.waiting("a") or 0) <= 0.05
    assert q.get() == "a"
    q.done("a")
    assert q.waiting("a") is None and q._due == {}
    assert len(q._heap) <= 2  # the stale heap entries are skipped, not re-added: nothing else arrives
    q.shutdown()


def test_rate_limited_retries_back_off_per_key_capped_and_counted() -> None:
    from hpd_operator import metrics

    q: WorkQueue[str] = WorkQueue("t6", base_delay=1.0, max_delay=60.0)
    before = metrics.WORKQUEUE_RETRIES.labels("t6")._value.get()
    delays = [q.add_rate_limited("a") for _ in range(9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert [q.add_rate_limited("b", max_delay=10.0) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert q.failures("a") == 9 and metrics.WORKQUEUE_RETRIES.labels("t6")._value.get() - before == 15
    assert set(q._due) == {"a", "b"}  # one waiting entry each, however many retries were asked for
    q.forget("a")
    assert q.failures("a") == 0 and q.add_rate_limited("a") == 1.0
    q.shutdown()


def test_shutdown_releases_waiting_workers() -> None:
    q: WorkQueue[str] = WorkQueue("t4")
    out: list[str] = []

    def worker() -> None:
        try:
            q.get()
        except ShutDown:
            out.append("stopped")

    t = threading.Thread(target=worker)
    t.start()
    q.shutdown()
    t.join(5)
    assert out == ["stopped"]


# --- drift -----------------------------------------------------------------------------------------------------------
def _svc(**meta: Any) -> dict[str, Any]:
    md = {"name": "x", "namespace": "ns", "labels": {"a": "1"}, **meta}
    return {"apiVersion": "v1", "kind": "Service", "metadata": md, "spec": {"ports": [{"port": 80}]}}


def test_the_hash_ignores_its_own_annotation_and_follows_the_manifest() -> None:
    a = drift.stamped(_svc())
    assert drift.live_hash(a) == drift.desired_hash(_svc()) == drift.desired_hash(a)
    changed = _svc()
    changed["spec"]["ports"][0]["port"] = 81
    assert drift.desired_hash(changed) != drift.desired_hash(_svc())


def _entry(manager: str, time: str, fields: Any = None, operation: str = "Update") -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "time": time, "fieldsV1": fields}


def test_touched_by_others_only_when_another_manager_wrote_since_us() -> None:
    ours = _entry(contract.FIELD_MANAGER, "2026-01-01T00:00:10Z", operation="Apply")
    older = _entry("kubectl-edit", "2026-01-01T00:00:05Z", {"f:spec": {}})
    newer = _entry("kubectl-edit", "2026-01-01T00:00:20Z", {"f:spec": {}})
    revision = _entry(
        "kube-controller-manager",
        "2026-01-01T00:00:20Z",
        {"f:metadata": {"f:annotations": {".": {}, "f:deployment.kubernetes.io/revision": {}}}},
    )
    desired = _svc()
    assert drift.touched_by_others(_svc(managedFields=[ours, older]), desired) is None
    assert drift.touched_by_others(_svc(managedFields=[ours, revision]), desired) is None
    assert drift.touched_by_others(_svc(managedFields=[ours, newer]), desired) == "2026-01-01T00:00:20Z"
    # an annotation the operator sets itself is ours to keep
    mine = _svc(annotations={"deployment.kubernetes.io/revision": "9"})
    assert drift.touched_by_others(_svc(managedFields=[ours, revision]), mine) == "2026-01-01T00:00:20Z"


def test_mismatch_names_the_first_differing_path_and_allows_defaults() -> None:
    want = {"spec": {"replicas": 1, "template": {"args": ["a", "b"]}, "paused": False}}
    assert drift.mismatch(want, {"spec": {"replicas": 1, "template": {"args": ["a", "b"]}, "extra": 1}}) is None
    assert drift.mismatch(want, {"spec": {"replicas": 4, "template": {"args": ["a", "b"]}}}) == ".spec.replicas"
    assert drift.mismatch(want, {"spec": {"replicas": 1, "template": {"args": ["x"]}}}) == ".spec.template.args"


# --- cache -----------------------------------------------------------------------------------------------------------
def _child(name: str, rv: str, instance: str = "cr", uid: str = "u1", **extra: Any) -> dict[str, Any]:
    labels = {contract.LABEL_INSTANCE: instance, contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
    md = {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv, "labels": labels}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": md, "spec": {"replicas": 2}, **extra}


def test_cache_groups_by_instance_and_ignores_older_versions() -> None:
    c = Cache()
    c.put_child(_child("d", "5", status={"readyReplicas": 2}))
    c.put_child(_child("d", "4", status={"readyReplicas": 0}))  # a late, older event
    (d,) = c.children("ns", "cr")
    assert d["status"] == {"readyReplicas": 2} and d["spec"] == {"replicas": 2}
    assert c.child("ns", "apps/v1", "Deployment", "d") is not None
    # losing our labels drops it from the group; a delete of another uid leaves the live one
    unlabelled = _child("d", "6")
    unlabelled["metadata"]["labels"] = {}
    c.put_child(unlabelled)
    assert c.children("ns", "cr") == []
    c.put_child(_child("d", "7"))
    c.drop_child(_child("d", "1", uid="someone-else"))
    assert len(c.children("ns", "cr")) == 1


def test_cache_maps_pods_and_nodes_to_their_crs() -> None:
    c = Cache()
    c.put_cr({"metadata": {"name": "cr", "namespace": "ns", "uid": "x", "resourceVersion": "1"}}, "cr")
    pod = _child("p", "1")
    pod.update(apiVersion="v1", kind="Pod", spec={"nodeName": "n1"}, status={"conditions": [{"type": "Ready"}]})
    c.put_pod(pod)
    assert c.crs_of("ns", "cr") == [("ns", "cr")]
    assert c.groups_on_node("n1") == [("ns", "cr")] and c.groups_on_node("n2") == []
    (p,) = c.pods("ns", "cr")
    assert p["spec"] == {"nodeName": "n1"} and p["status"]["conditions"] == [{"type": "Ready"}]
    c.drop_cr(("ns", "cr"), "cr")
    assert c.crs_of("ns", "cr") == [] and c.cr(("ns", "cr")) is None


# --- liveness ----------------------------------------------------------------------------------------------------
def test_liveness_fails_when_a_reconcile_worker_died_and_never_on_the_apiserver() -> None:
    import kopf
    import pytest

    from hpd_operator.workers import workers_alive

    done = threading.Thread(target=lambda: None, name="reconcile-1")
    done.start()
    done.join()
    alive = threading.Event()
    running = threading.Thread(target=alive.wait, name="reconcile-0")
    running.start()
    try:
        assert workers_alive([running]) == 1  # no apiserver call: liveness does not depend on it
        with pytest.raises(kopf.PermanentError, match="reconcile-1"):
            workers_alive([running, done])
    finally:
        alive.set()
        running.join()


def test_env_entries_another_manager_added_to_our_containers_are_deleted_and_only_those() -> None:
    """Server-side apply cannot take back another manager's env entry: drift.foreign_env names what a strategic merge
    patch deletes (the operator's entries, other containers and other fields stay)."""
    desired = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "env": [{"name": "A", "value": "1"}]}]}}}}
    live = {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "env": [{"name": "A", "value": "1"}, {"name": "HAND", "value": "x"}, {"name": "B"}]},
        {"name": "sidecar", "env": [{"name": "S", "value": "1"}]},
    ]}}}}  # fmt: skip
    assert drift.foreign_env(desired, live) == {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "env": [{"name": "B", "$patch": "delete"}, {"name": "HAND", "$patch": "delete"}]}]}}}}  # fmt: skip
    assert drift.foreign_env(desired, desired) is None
    assert drift.foreign_env({"spec": {}}, live) is None  # no pod template of ours: nothing to take back
