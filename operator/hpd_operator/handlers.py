"""kopf's handlers: the watches feed the cache and the work queue, nothing else; `setup` (called by `run`) creates the
one Controller that owns the operator's state and registers every handler on it. The rest of the event-driven
reconcile lives beside it: workers.py (worker threads, retries, the safety resync) takes keys from the queue,
reconcile.py converges one CR as a list of named steps over context.Run (children.py applies and prunes, outcome.py
observes and writes the status). The I/O lives in apply.py (children) and report.py (status, Events, reads no watch
covers); cache.py, drift.py, workqueue.py and status.py do no I/O.

- Watches, not lists: kopf watches the CRs, every child kind the operator makes (apply.KINDS; PodMonitors only
  where served at startup) and the pods, filtered by the apiserver on the managed-by label; the kubelet's
  probe-failure Events, filtered by reason (podevents.EVENT_FIELD_SELECTOR); and the nodes where RBAC allows.
  `@kopf.index` handlers put each object (trimmed) into `cache.Cache` first (the one store: kopf's own indexes stay
  empty): kopf holds every other handler until all indexed kinds finished their initial listing, so no reconcile
  sees a half-filled cache (no "create" of an existing child after a restart). An object that loses the managed-by label arrives as DELETED.
- One work queue (workqueue.py, client-go's semantics): `@kopf.on.event` handlers enqueue the (namespace, name) of
  the CR an event concerns: the CR itself when its uid, generation or deletion changed (not its own status writes
  or label edits: `Memory.seen`), a child or pod by its instance label (a child also by its owner reference), a probe
  Event by its pod, the CRs with pods on a deleted node. A key waits at most once, and has at most one delayed
  entry (the earliest wins); one that arrives while its CR is being converged runs once more afterwards.
  `--workers` threads (default 4; the kubernetes client is synchronous) converge keys.
- Every reconcile that does not converge is retried with per-key backoff (0.5 s doubling to 60 s, reset on
  success; `schedule`), as controller-runtime retries every error: an apiserver refusal ends in the CR's status
  (ApplyFailed names the child, the code and the apiserver's message) and is retried all the same, a failure to
  reach the apiserver or to write the status is retried without a status. Nothing waits for the safety resync. A
  retry writes no status and posts no Event unless the failure's message changed.
- `converge`: parse -> build -> claim -> apply -> prune, then observe + write_report. `build` plans the rollout
  between generations of prefill + decode first (generations.py, docs/rollouts.md): the engines of the generation
  the spec asks for are built, the router routes to the one the plan says (the new one only once it is Ready), and
  the children of the generations the plan keeps (the serving one, one still draining) are neither applied nor
  pruned. Only what differs is written:
  a child the cache does not hold is created by one apply that only creates (apply.create: no GET first; a name
  held by an object the operator does not watch answers 409, then one GET says who holds it); a child is applied
  when its desired-hash annotation differs, or it drifted (drift.py: another manager's newer field set, or a
  changed generation, then one GET and a field compare); the status only when it differs from the stored one
  (compute_status has no always-changing field: lastTransitionTime moves only on a transition); Events only on
  transitions (RiskySpec once per spec generation). A reconcile of a settled CR makes no request at all; a child's
  status change reaches the CR's status in one reconcile.
- The one thing no event announces is the deletion of an object without our label that holds a desired name
  (OwnershipConflict): such a CR's backoff is capped at settings.recheck_seconds (default 10 s) until it converges.
- A CRD created moments before its first CR: the apiserver refuses blockOwnerDeletion on the children for up to 30 s
  (`apply.owner_kind_unknown`); they are written without it at once and completed on a retry (`unblocked`).
- A slow safety resync (settings.resync_seconds, default 300 s) re-enqueues every cached CR (no list call); when
  nothing changed it writes nothing. It is an asyncio task, not a kopf timer: kopf puts a finalizer on objects
  with timers/daemons. No finalizer and no annotation is put on the CR (event and index handlers write nothing):
  deletion works with the operator down (children carry owner references; the garbage collector deletes them).
- Nodes: watched (names kept) when a SelfSubjectAccessReview at startup says the operator may list and watch them
  (the chart's rbac.readNodes, a ClusterRole in both RBAC scopes: kopf watches a cluster-scoped resource
  cluster-wide even when it serves named namespaces); otherwise the NodeLost check is skipped (the pod garbage
  collector eventually removes such pods). A Prometheus Operator installed later needs an operator restart.
- Limits: kopf re-lists after a watch gap (410 Gone) without reporting what was deleted in the gap; such an object
  stays cached until the operator restarts (a deleted child would not be re-created). The apiserver sends
  bookmarks (kopf asks for them), so gaps are rare: an apiserver restart is the realistic case.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf
import urllib3
from kubernetes import client

from hpd_operator import apply as k8s
from hpd_operator import podevents, report, workers
from hpd_operator.api.names import instance_label
from hpd_operator.cache import CRKey
from hpd_operator.context import LWS, PODMONITOR
from hpd_operator.controller import Capabilities, Controller, new_client
from hpd_operator.settings import OperatorConfig
from hpd_runtime import contract

RESOURCE = (contract.GROUP, contract.VERSION, contract.PLURAL)
MANAGED = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
log = logging.getLogger("hpd_operator")


def setup(cfg: OperatorConfig, deadline_s: float = 120.0) -> Controller:
    """Connect, decide the optional watches (retrying while the apiserver is unreachable), create the Controller and
    register every handler on it."""
    api = new_client()
    end = time.monotonic() + deadline_s
    while True:
        try:
            caps = Capabilities(
                podmonitors=k8s.api_available(api, *PODMONITOR),
                nodes=report.may(api, "list", "nodes") and report.may(api, "watch", "nodes"),
                lws=k8s.api_available(api, *LWS),
            )
            break
        except (client.ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            if time.monotonic() > end:
                raise
            log.warning(f"startup: the apiserver did not answer as expected ({workers.describe(e)[1]}); retrying")
            time.sleep(2)
    ctl = Controller(api, caps, cfg)
    register(ctl)
    log.info(f"watching PodMonitors: {caps.podmonitors}; LeaderWorkerSets: {caps.lws}; nodes: {caps.nodes}")
    return ctl


# --- watches -> cache + queue ----------------------------------------------------------------------------------------
# Per watch event kopf calls the index handler (not on DELETED), then the event handler: the index handler stores
# the object (trimmed straight from kopf's body, once), the event handler forgets a deleted one and queues the CRs
# it concerns. The index handlers return nothing, so kopf's own indexes stay empty: the cache is the one store.
def cr_key(body: Mapping[str, Any]) -> CRKey:
    md = body.get("metadata") or {}
    return str(md.get("namespace")), str(md.get("name"))


class Watches:
    """The kopf index and event handlers of one Controller: each stores what it saw in the cache and queues the CRs
    it concerns."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    async def index_cr(self, body: kopf.Body, **_: Any) -> None:
        self.ctl.cache.put_cr(body, instance_label(str(body["metadata"]["name"])))

    async def cr_event(self, type: str | None, body: kopf.Body, **_: Any) -> None:
        """Queue the CR when its uid, generation or deletion changed (Memory.seen), not on its own status writes."""
        key, md, seen_by = cr_key(body), body["metadata"], self.ctl.memory.seen
        if type == "DELETED":
            self.ctl.cache.drop_cr(key, instance_label(key[1]))
            self.ctl.forget(key, str(md.get("uid")))
            return
        seen = (str(md.get("uid")), md.get("generation"), bool(md.get("deletionTimestamp")))
        if seen_by.get(key) == seen:
            return
        seen_by[key] = seen
        self.ctl.queue.add(key)

    def owners(self, obj: Mapping[str, Any]) -> set[CRKey]:
        """The CRs an event on this child or pod concerns: by its instance label and its owner references."""
        md = obj.get("metadata") or {}
        ns = str(md.get("namespace"))
        out: set[CRKey] = set()
        instance = (md.get("labels") or {}).get(contract.LABEL_INSTANCE)
        if instance is not None and (md.get("labels") or {}).get(contract.LABEL_MANAGED_BY) == contract.MANAGED_BY:
            out.update(self.ctl.cache.crs_of(ns, str(instance)))
        for ref in md.get("ownerReferences") or []:
            if ref.get("kind") == contract.KIND and str(ref.get("apiVersion", "")).startswith(f"{contract.GROUP}/"):
                out.add((ns, str(ref.get("name"))))
        return out

    def queue_owners(self, obj: Mapping[str, Any]) -> None:
        for key in self.owners(obj):
            self.ctl.queue.add(key)

    async def index_child(self, body: kopf.Body, **_: Any) -> None:
        self.ctl.cache.put_child(body)

    async def child_event(self, type: str | None, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            self.ctl.cache.drop_child(body)
            self.ctl.memory.checked.pop(str(body["metadata"].get("uid")), None)
        self.queue_owners(body)

    async def index_pod(self, body: kopf.Body, **_: Any) -> None:
        self.ctl.cache.put_pod(body)

    async def pod_event(self, type: str | None, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            self.ctl.cache.drop_pod(body)
        self.queue_owners(body)

    async def index_event(self, body: kopf.Body, **_: Any) -> None:
        self.ctl.cache.put_event(body)

    async def event_event(self, type: str | None, body: Mapping[str, Any], **_: Any) -> None:
        cache = self.ctl.cache
        if type == "DELETED":
            cache.drop_event(body)
            return
        group = cache.pod_group(
            str(body["metadata"].get("namespace")), str((body.get("involvedObject") or {}).get("name"))
        )
        if group is not None:  # about one of our pods
            for key in cache.crs_of(*group):
                self.ctl.queue.add(key)

    async def index_node(self, body: kopf.Body, **_: Any) -> None:
        self.ctl.cache.add_node(str(body["metadata"]["name"]))

    async def node_event(self, type: str | None, body: kopf.Body, **_: Any) -> None:
        name, cache = str(body["metadata"]["name"]), self.ctl.cache
        if type != "DELETED":
            return
        cache.drop_node(name)
        for ns, instance in cache.groups_on_node(name):
            for key in cache.crs_of(ns, instance):
                self.ctl.queue.add(key)


def watched(caps: Capabilities) -> list[tuple[str, str, str]]:
    """(group, version, plural) of every child kind watched."""
    out = []
    for kind in k8s.KINDS:
        if (kind.api_version, kind.kind) == PODMONITOR and not caps.podmonitors:
            continue
        if (kind.api_version, kind.kind) == LWS and not caps.lws:
            continue
        group, _, version = kind.api_version.rpartition("/")
        out.append((group, version, kind.plural))
    return out


def register(ctl: Controller) -> None:
    """Every kopf handler of the operator, bound to `ctl`: the watches, the selectors, the workers' start, liveness
    probe and stop."""
    w = Watches(ctl)
    kopf.index(*RESOURCE, id="cache-crs")(w.index_cr)
    kopf.on.event(*RESOURCE, id="enqueue-crs")(w.cr_event)
    for group, version, plural in watched(ctl.caps):
        what = f"{plural}.{group or 'core'}"
        kopf.index(group, version, plural, id=f"cache-{what}")(w.index_child)
        kopf.on.event(group, version, plural, id=f"enqueue-{what}")(w.child_event)
    kopf.index("", "v1", "pods", id="cache-pods")(w.index_pod)
    kopf.on.event("", "v1", "pods", id="enqueue-pods")(w.pod_event)
    kopf.index("", "v1", "events", id="cache-probe-events")(w.index_event)
    kopf.on.event("", "v1", "events", id="enqueue-probe-events")(w.event_event)
    if ctl.caps.nodes:
        ctl.cache.set_nodes(())
        kopf.index("", "v1", "nodes", id="cache-nodes")(w.index_node)
        kopf.on.event("", "v1", "nodes", id="enqueue-nodes")(w.node_event)
    register_lifecycle(ctl)


def register_lifecycle(ctl: Controller) -> None:
    """Server-side selectors and the workers' start, liveness probe and stop."""

    def server_side_selectors(settings: kopf.OperatorSettings, **_: Any) -> None:
        """Watch only what the operator manages: children and pods by the managed-by label, Events by reason (the
        apiserver filters; an object that loses the managed-by label arrives as DELETED)."""
        for group, version, plural in [*watched(ctl.caps), ("", "v1", "pods")]:
            settings.watching.label_selectors[group, version, plural] = MANAGED
        settings.watching.field_selectors["", "v1", "events"] = podevents.EVENT_FIELD_SELECTOR

    async def start_workers(**_: Any) -> None:
        workers.start(ctl)

    def workers_alive(**_: Any) -> int:
        return workers.workers_alive(ctl.workers)

    async def stop_workers(**_: Any) -> None:
        workers.stop(ctl)

    kopf.on.startup(id="selectors")(server_side_selectors)
    kopf.on.startup(id="workers")(start_workers)
    kopf.on.probe(id="workers")(workers_alive)
    kopf.on.cleanup(id="workers")(stop_workers)
