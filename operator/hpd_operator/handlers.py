"""The event-driven reconcile: kopf's watches feed a cache and a work queue; worker threads converge one CR at a
time as a short list of named steps. The I/O lives in apply.py (children) and report.py (status, Events, reads no
watch covers); cache.py, drift.py, workqueue.py and status.py do no I/O.

- Watches, not lists: kopf watches the CRs, every child kind the operator makes (apply.KINDS; PodMonitors only
  where served at startup) and the pods, filtered by the apiserver on the managed-by label; the kubelet's
  probe-failure Events, filtered by reason (podevents.EVENT_FIELD_SELECTOR); and the nodes where RBAC allows.
  `@kopf.index` handlers put each object (trimmed) into `cache.Cache` first (the one store: kopf's own indexes stay
  empty): kopf holds every other handler until all indexed kinds finished their initial listing, so no reconcile
  sees a half-filled cache (no "create" of an existing child after a restart). An object that loses the managed-by label arrives as DELETED.
- One work queue (workqueue.py, client-go's semantics): `@kopf.on.event` handlers enqueue the (namespace, name) of
  the CR an event concerns: the CR itself when its uid, generation or deletion changed (not its own status writes
  or label edits: `_SEEN`), a child or pod by its instance label (a child also by its owner reference), a probe
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

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
import urllib3
from kubernetes import client, config

from hpd_operator import apply as k8s
from hpd_operator import blame, drift, generations, metrics, podevents, report, settings
from hpd_operator import leaderworkerset as lws
from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import instance_label, kv_reporter_name
from hpd_operator.api.parse import parse_cr
from hpd_operator.builders import Manifest, build_all, generation_hash, group_roles
from hpd_operator.builders.fallback import Fallback
from hpd_operator.builders.fallback import choose as choose_fallback
from hpd_operator.cache import Cache, CRKey, plain
from hpd_operator.conditions import Failure, Reason
from hpd_operator.errors import SpecError
from hpd_operator.profile import compute_profile
from hpd_operator.profile_model import Profile
from hpd_operator.rolestate import next_pod_check
from hpd_operator.rollout import generation_answering, generation_desired, generation_ready
from hpd_operator.scaling import Bounds, autoscaled_roles, autoscaler_status, compute_bounds, start_replicas
from hpd_operator.status import Observation, compute_status, transitions
from hpd_operator.validation import validate
from hpd_operator.workqueue import ShutDown, WorkQueue
from hpd_runtime import contract

RESOURCE = (contract.GROUP, contract.VERSION, contract.PLURAL)
PODMONITOR = ("monitoring.coreos.com/v1", "PodMonitor")
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
Key = tuple[str, str, str]
log = logging.getLogger("hpd_operator")

CACHE = Cache()
QUEUE: WorkQueue[CRKey] = WorkQueue(metrics.CONTROLLER)


@dataclass(frozen=True)
class Capabilities:
    """What the apiserver serves and the operator may watch, decided once at startup."""

    podmonitors: bool
    nodes: bool
    lws: bool = False
    """LeaderWorkerSet is served: roles whose replicas span nodes can be built (lws.py: re-checked while missing)."""


_STATE: dict[str, Any] = {}
"""The ApiClient and Capabilities set by `setup` (before kopf runs); the workers and the resync task."""


def new_client() -> client.ApiClient:
    """One kubernetes ApiClient for our own calls (kopf uses its own for watching), counting its requests."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    api = client.ApiClient(cfg)
    request = api.rest_client.request

    def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        metrics.API_REQUESTS.labels(method.upper()).inc()
        return request(method, url, *args, **kwargs)  # type: ignore[no-untyped-call]

    api.rest_client.request = counted  # type: ignore[method-assign]
    return api


def setup(deadline_s: float = 120.0) -> Capabilities:
    """Connect, decide the optional watches (retrying while the apiserver is unreachable), register them."""
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
            log.warning(f"startup: the apiserver did not answer as expected ({describe(e)[1]}); retrying")
            time.sleep(2)
    _STATE["api"], _STATE["caps"] = api, caps
    _register_children(caps)
    log.info(f"watching PodMonitors: {caps.podmonitors}; LeaderWorkerSets: {caps.lws}; nodes: {caps.nodes}")
    return caps


def _api() -> client.ApiClient:
    return cast("client.ApiClient", _STATE["api"])


def _caps() -> Capabilities:
    return cast("Capabilities", _STATE.get("caps") or Capabilities(podmonitors=False, nodes=False))


# --- watches -> cache + queue ----------------------------------------------------------------------------------------
# Per watch event kopf calls the index handler (not on DELETED), then the event handler: the index handler stores
# the object (trimmed straight from kopf's body, once), the event handler forgets a deleted one and queues the CRs
# it concerns. The index handlers return nothing, so kopf's own indexes stay empty: the cache is the one store.
def _cr_key(body: Mapping[str, Any]) -> CRKey:
    md = body.get("metadata") or {}
    return str(md.get("namespace")), str(md.get("name"))


@kopf.index(*RESOURCE, id="cache-crs")
async def _index_cr(body: kopf.Body, **_: Any) -> None:
    CACHE.put_cr(body, instance_label(str(body["metadata"]["name"])))


_SEEN: dict[CRKey, tuple[str, object, bool]] = {}
"""CR key -> (uid, generation, being deleted) of the last event that queued it (controller-runtime's
GenerationChangedPredicate): a status write (the operator's own, every reconcile that changes something) or a
label/annotation edit changes none of these, and the operator uses none of them, so such events queue nothing."""


@kopf.on.event(*RESOURCE, id="enqueue-crs")
async def _cr_event(type: str | None, body: kopf.Body, **_: Any) -> None:
    key = _cr_key(body)
    md = body["metadata"]
    if type == "DELETED":
        CACHE.drop_cr(key, instance_label(key[1]))
        forget(key, str(md.get("uid")))
        return
    seen = (str(md.get("uid")), md.get("generation"), bool(md.get("deletionTimestamp")))
    if _SEEN.get(key) == seen:
        return
    _SEEN[key] = seen
    QUEUE.add(key)


def _owners(obj: Mapping[str, Any]) -> set[CRKey]:
    """The CRs an event on this child or pod concerns: by its instance label and its owner references."""
    md = obj.get("metadata") or {}
    ns = str(md.get("namespace"))
    out: set[CRKey] = set()
    instance = (md.get("labels") or {}).get(contract.LABEL_INSTANCE)
    if instance is not None and (md.get("labels") or {}).get(contract.LABEL_MANAGED_BY) == contract.MANAGED_BY:
        out.update(CACHE.crs_of(ns, str(instance)))
    for ref in md.get("ownerReferences") or []:
        if ref.get("kind") == contract.KIND and str(ref.get("apiVersion", "")).startswith(f"{contract.GROUP}/"):
            out.add((ns, str(ref.get("name"))))
    return out


async def _index_child(body: kopf.Body, **_: Any) -> None:
    CACHE.put_child(body)


async def _child_event(type: str | None, body: kopf.Body, **_: Any) -> None:
    if type == "DELETED":
        CACHE.drop_child(body)
        _CHECKED.pop(str(body["metadata"].get("uid")), None)
    for key in _owners(body):
        QUEUE.add(key)


async def _index_pod(body: kopf.Body, **_: Any) -> None:
    CACHE.put_pod(body)


async def _pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
    if type == "DELETED":
        CACHE.drop_pod(body)
    for key in _owners(body):
        QUEUE.add(key)


async def _index_event(body: kopf.Body, **_: Any) -> None:
    CACHE.put_event(body)


async def _event_event(type: str | None, body: Mapping[str, Any], **_: Any) -> None:
    if type == "DELETED":
        CACHE.drop_event(body)
        return
    group = CACHE.pod_group(str(body["metadata"].get("namespace")), str((body.get("involvedObject") or {}).get("name")))
    if group is not None:  # about one of our pods
        for key in CACHE.crs_of(*group):
            QUEUE.add(key)


async def _index_node(body: kopf.Body, **_: Any) -> None:
    CACHE.add_node(str(body["metadata"]["name"]))


async def _node_event(type: str | None, body: kopf.Body, **_: Any) -> None:
    name = str(body["metadata"]["name"])
    if type != "DELETED":
        return
    CACHE.drop_node(name)
    for ns, instance in CACHE.groups_on_node(name):
        for key in CACHE.crs_of(ns, instance):
            QUEUE.add(key)


MANAGED = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"


def _watched(caps: Capabilities) -> list[tuple[str, str, str]]:
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


@kopf.on.startup(id="selectors")
def server_side_selectors(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Watch only what the operator manages: children and pods by the managed-by label, Events by reason (the
    apiserver filters; an object that loses the label arrives as DELETED)."""
    for group, version, plural in [*_watched(_caps()), ("", "v1", "pods")]:
        settings.watching.label_selectors[group, version, plural] = MANAGED
    settings.watching.field_selectors["", "v1", "events"] = podevents.EVENT_FIELD_SELECTOR


def _register_children(caps: Capabilities) -> None:
    """Index + event handlers on every child kind, the pods, their probe Events, and (if allowed) the nodes."""
    for group, version, plural in _watched(caps):
        what = f"{plural}.{group or 'core'}"
        kopf.index(group, version, plural, id=f"cache-{what}")(_index_child)
        kopf.on.event(group, version, plural, id=f"enqueue-{what}")(_child_event)
    kopf.index("", "v1", "pods", id="cache-pods")(_index_pod)
    kopf.on.event("", "v1", "pods", id="enqueue-pods")(_pod_event)
    kopf.index("", "v1", "events", id="cache-probe-events")(_index_event)
    kopf.on.event("", "v1", "events", id="enqueue-probe-events")(_event_event)
    if caps.nodes:
        CACHE.set_nodes(())
        kopf.index("", "v1", "nodes", id="cache-nodes")(_index_node)
        kopf.on.event("", "v1", "nodes", id="enqueue-nodes")(_node_event)


# --- one reconcile ---------------------------------------------------------------------------------------------------
def _cr_object(body: Mapping[str, Any]) -> dict[str, Any]:
    md = body.get("metadata", {})
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace")},
        "spec": plain(body.get("spec", {})),
    }


@dataclass
class Run:
    """One reconcile of one CR: what each step found, in order."""

    api: client.ApiClient
    cache: Cache
    body: Mapping[str, Any]
    podmonitor_served: bool = False
    lws_served: bool = False
    cr: HybridPDDeployment | None = None
    profile: Profile | None = None
    desired: list[Manifest] = field(default_factory=list)
    bounds: dict[str, Bounds] = field(default_factory=dict)
    """Each autoscaling role's HPA min/max (scaling.compute_bounds, from what runs)."""
    hpas: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    """Each role's HPA of the generation the router routes to, as observed before this run's writes."""
    start: dict[str, int] = field(default_factory=dict)
    """The count each autoscaling role's Deployment starts at (scaling.start_replicas: the serving generation's)."""
    ours: dict[Key, Manifest] = field(default_factory=dict)
    conflicts: dict[Key, str] = field(default_factory=dict)
    absent: set[Key] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    actions: dict[Reason, list[str]] = field(default_factory=lambda: defaultdict(list))
    observed: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    nodes: frozenset[str] | None = None
    role_details: dict[str, str] = field(default_factory=dict)
    plan: generations.Plan | None = None
    """Which generation the spec asks for, which one the router routes to, which ones stay (set by `build`)."""
    fallback: Fallback | None = None
    """Degraded mode: the endpoint serves colocated on the role left of the routed generation (set by `build`)."""
    rollout: generations.RolloutView | None = None
    """The generations as observed after the writes (set by `observe`): what the status reports."""
    failure: Failure | None = None
    retry: str | None = None
    """Why this CR must be reconciled again with backoff although no failure is reported (a step that will succeed
    once the apiserver catches up, e.g. `owner_kind_unknown`)."""
    requeue_after: float | None = None
    """Reconcile again after this many seconds (something will change that no event announces)."""

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        return str(self.body["metadata"].get("uid"))

    @property
    def instance(self) -> str:
        return instance_label(self.name)


class TransientError(Exception):
    """The API failed in a way worth retrying (5xx, 429, no connection): no status is written for it."""


def parse(run: Run) -> None:
    """Parse once, validate once (raises SpecError naming every field), then the profile."""
    cfg = settings.current()
    run.cr = parse_cr(
        _cr_object(run.body),
        vllm_image=cfg.vllm_image,
        router_image=cfg.router_image,
        pod_monitor_labels=dict(cfg.pod_monitor_labels),
        vllm_digests=dict(cfg.vllm_image_digests),
    )
    run.profile = compute_profile(validate(run.cr))
    run.notes.extend(run.profile.warnings)


def plan(run: Run) -> generations.Plan:
    """The rollout plan from what the cache holds: the spec's generation (its engine templates' hash), whether each
    running generation is Ready, the highest number the status recorded (generations.plan_rollout)."""
    assert run.cr is not None and run.profile is not None
    want = generation_hash(run.cr, run.profile)
    live = generations.observe(
        run.cache.children(run.namespace, run.instance), run.cache.pods(run.namespace, run.instance), run.uid
    )
    nodes, now, spec = run.cache.nodes, report.now(), run.cr.spec
    ready, answering = {}, {}
    for h, g in live.generations.items():
        desired = generation_desired(spec, g, want)
        ready[h], answering[h] = generation_ready(g, desired, nodes, now), generation_answering(g, desired, nodes, now)
    latest = int(((run.body.get("status") or {}).get("rollout") or {}).get("latestGeneration") or 0)
    served = served_generations(run.body)
    groups = group_roles(run.cr)
    return generations.plan_rollout(want, live, ready, latest, answering=answering, served=served, groups=groups)


def served_generations(body: Mapping[str, Any]) -> list[str]:
    """The generations the CR's status recorded as having served."""
    stored = (body.get("status") or {}).get("rollout") or {}
    return [str(g.get("hash")) for g in stored.get("generations") or [] if g.get("served")]


def build(run: Run) -> None:
    """The whole desired set, owned by the CR, each stamped with its hash; PodMonitors only where served. The
    engines are the spec's generation's, the router routes to the one the plan says."""
    assert run.cr is not None and run.profile is not None
    try:
        run.plan = plan(run)
        scale(run, run.plan)
        run.fallback = degraded_mode(run, run.plan)
        desired = build_all(run.cr, run.profile, run.plan, run.bounds, run.start, fallback=run.fallback)
    except Exception as e:  # the schema let through something a builder cannot use: say where to look
        free = free_form_fields(run.cr)
        hint = f" (set free-form fields, taken as written: {', '.join(free)})" if free else ""
        raise BuildError(f"{type(e).__name__}: {e}{hint}") from e
    if not run.podmonitor_served and any((d["apiVersion"], d["kind"]) == PODMONITOR for d in desired):
        run.notes.append(
            "PodMonitors skipped: monitoring.coreos.com/v1 PodMonitor is not served (no Prometheus Operator)"
        )
        desired = [d for d in desired if (d["apiVersion"], d["kind"]) != PODMONITOR]
    if not run.lws_served and any((d["apiVersion"], d["kind"]) == LWS for d in desired):
        run.failure = lws.missing(run.api)  # nothing is applied, nothing half-built
        return
    for obj in desired:
        kopf.append_owner_reference(obj, owner=cast("kopf.Body", run.body))
    run.desired = [drift.stamped(obj) for obj in desired]


def degraded_mode(run: Run, plan: generations.Plan) -> Fallback | None:
    """Whether the endpoint serves colocated (hpd_operator.builders.fallback.choose), from the routed generation's
    pods as the cache holds them: the pod watch reconciles the CR when a pod's readiness changes."""
    assert run.cr is not None
    live = generations.observe(
        run.cache.children(run.namespace, run.instance), run.cache.pods(run.namespace, run.instance), run.uid
    )
    gen = live.generations.get(plan.route.hash)
    return choose_fallback(run.cr, plan, gen.pods if gen is not None else {}, run.cache.nodes)


def scale(run: Run, plan: generations.Plan) -> None:
    """The autoscaling roles' HPA bounds and start counts, from the generation the router routes to (its Deployments'
    replicas and its HPAs as the cache holds them): scaling.compute_bounds, scaling.start_replicas."""
    assert run.cr is not None
    children = run.cache.children(run.namespace, run.instance)
    deployments = report.observe_deployments(children, run.name, run.uid, plan.route.hash)
    run.hpas = dict(report.observe_autoscalers(children, run.name, run.uid, plan.route.hash))
    current: dict[str, Any] = {
        r: ((deployments.get(r) or {}).get("spec") or {}).get("replicas") for r in contract.ROLES
    }
    run.bounds = compute_bounds(run.cr.spec, current, run.hpas)
    run.start = start_replicas(run.cr.spec, current, run.bounds)


class BuildError(Exception):
    """A builder raised on a spec the schema accepted."""


def free_form_fields(cr: HybridPDDeployment) -> list[str]:
    """The spec fields the CRD preserves as written (podTemplate, affinity, tolerations, env valueFrom)."""
    out = []
    for role in contract.ROLES:
        rs = cr.spec.role(role)
        for fname, value in (
            ("podTemplate", rs.pod_template),
            ("affinity", rs.affinity),
            ("tolerations", rs.tolerations),
        ):
            if value:
                out.append(f"spec.{role}.{fname}")
    out += [f"spec.env[{i}].valueFrom" for i, e in enumerate(cr.spec.env) if e.value_from is not None]
    return out


def claim(run: Run) -> None:
    """What this CR owns, the desired names another CR's child holds (never taken over), and the desired names the
    cache does not hold at all (created only if nothing holds them: `create_child`). No request."""
    labelled = {k8s.key(e): e for e in run.cache.children(run.namespace, run.instance)}
    run.ours = {k: e for k, e in labelled.items() if k8s.owned_by(e, run.uid)}
    for obj in run.desired:
        k = k8s.key(obj)
        held = labelled.get(k) or run.cache.child(run.namespace, *k)
        if held is None:
            run.absent.add(k)
        elif not k8s.owned_by(held, run.uid):
            run.conflicts[k] = k8s.holder(held)
    report_conflicts(run)


def report_conflicts(run: Run) -> None:
    """The OwnershipConflict failure naming every desired name held by something else (the rest is applied)."""
    if not run.conflicts:
        return
    held = "; ".join(f"{kind} {name} exists and is {who}" for (_, kind, name), who in run.conflicts.items())
    run.failure = Failure(
        Reason.OWNERSHIP_CONFLICT,
        f"{held}: left alone (rename this {contract.KIND} or delete that object); the other children are applied",
    )


_CHECKED: dict[str, tuple[str | None, int | None]] = {}
"""Child uid -> (another manager's newest write time, generation) as last verified or applied by this process:
the drift test reads the child back only when that signature moves (drift.py)."""


def _signature(live: Mapping[str, Any], desired: Mapping[str, Any]) -> tuple[str | None, int | None]:
    return drift.touched_by_others(live, desired), (live.get("metadata") or {}).get("generation")


def needs_apply(run: Run, obj: Manifest, live: Manifest | None) -> str | None:
    """Why `obj` must be applied (None: the live child is what we want). Reads the child only on suspicion."""
    if live is None:
        return "missing"
    if drift.live_hash(live) != drift.live_hash(obj):
        return "changed"
    uid = str(live["metadata"].get("uid"))
    sig = _signature(live, obj)
    last = _CHECKED.get(uid)
    if (last is None and sig[0] is None) or last == sig:
        _CHECKED[uid] = sig  # first sight, untouched by others since our write; or already verified as it is
        return None
    full = k8s.get(run.api, obj)
    if full is None:
        return "missing"
    where = drift.mismatch(obj, full)
    if where is None:
        _CHECKED[uid] = _signature(full, obj)
        return None
    return f"drifted at {where}"


def create_child(run: Run, obj: Manifest) -> Manifest | None:
    """Create a child the cache does not hold, in one request unless its name is taken; then read who holds it: our
    own child (the watch has not delivered it yet) is applied as usual, anything else is a conflict (None)."""
    for _ in range(2):  # the holder may be deleted between the create and the read: try once more
        new = k8s.create(run.api, obj)
        if new is not None:
            return new
        live = k8s.get(run.api, obj)
        if live is None:
            continue
        if k8s.owned_by(live, run.uid):
            return k8s.apply(run.api, obj)
        run.conflicts[k8s.key(obj)] = k8s.holder(live)
        return None
    what = f"{obj['kind']} {obj['metadata']['name']}"
    raise client.ApiException(status=409, reason="Conflict", body=f"{what} keeps being created and deleted by another")


def write_child(run: Run, obj: Manifest) -> Manifest | None:
    """Create `obj` if the cache does not hold it, else apply it if it differs; the object as stored, or None when
    nothing was written (unchanged, or its name is held by another object: `run.conflicts`)."""
    k = k8s.key(obj)
    what = f"{obj['kind']} {obj['metadata']['name']}"
    role = autoscaled_role(run, obj)
    if k in run.absent:
        log.debug(f"{run.namespace}/{run.name}: create {what}")
        return create_child(run, obj if role is None else with_initial_replicas(run, obj, role))
    live = run.ours.get(k)
    why = needs_apply(run, obj, live)
    if why is None:
        return None
    if role is not None and live is not None and k8s.owns_replicas(live):
        hand_off_replicas(run, obj, live, role)
    log.debug(f"{run.namespace}/{run.name}: apply {what} ({why})")
    new = k8s.apply(run.api, obj)
    extra = drift.foreign_env(obj, new) if obj["kind"] == "Deployment" else None
    if extra is not None:  # env entries added by hand stay after an apply (another manager's fields): delete them
        log.info(f"{run.namespace}/{run.name}: {what}: removing env entries another manager added")
        new = k8s.patch(run.api, obj, extra)
    return new


def autoscaled_role(run: Run, obj: Manifest) -> contract.Role | None:
    """The role of an engine Deployment whose replicas an HPA owns (the builder left them out), else None."""
    if obj["kind"] != "Deployment" or "replicas" in obj["spec"] or run.cr is None:
        return None
    role = (obj["metadata"].get("labels") or {}).get(contract.LABEL_ROLE)
    return cast("contract.Role", role) if role in contract.ROLES else None


def with_initial_replicas(run: Run, obj: Manifest, role: contract.Role) -> Manifest:
    """A new autoscaling role's Deployment of the serving generation starts at scaling.start_replicas (a first
    generation: spec.<role>.replicas within its autoscaler's bounds; written once, at creation; the HPA's first scale
    takes the field over, and the operator never writes it again)."""
    assert run.cr is not None
    n = run.start.get(role, run.cr.spec.role(role).replicas)
    return {**obj, "spec": {"replicas": n, **obj["spec"]}}


def hand_off_replicas(run: Run, obj: Manifest, live: Manifest, role: contract.Role) -> None:
    """The operator owned this Deployment's replicas (the role just started to autoscale, or was created by this
    process): keep the live value under the hand-off manager before the apply that leaves the field out."""
    replicas = (live.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int):
        return
    k8s.hand_off_replicas(run.api, obj, replicas)
    metrics.REPLICAS_HANDED_OFF.labels(role=role).inc()
    log.info(f"{run.namespace}/{run.name}: {role} autoscales: spec.replicas ({replicas}) handed to its autoscaler")


def unblocked(run: Run, obj: Manifest) -> Manifest:
    """`obj` without blockOwnerDeletion, to write after the apiserver refused it because it cannot resolve the
    owner's kind yet (`k8s.owner_kind_unknown`): the child exists at once and is garbage-collected with its CR all
    the same; the CR is retried with backoff until the full owner reference is taken (the apiserver's admission
    discovery refreshes every 30 s). Only foreground deletion of the CR in that window would not wait for it."""
    run.retry = (
        f"children written without blockOwnerDeletion: the apiserver cannot resolve kind {contract.KIND} yet (a CRD "
        "created moments ago; its admission discovery refreshes every 30 s)"
    )
    return drift.stamped(k8s.without_block_owner_deletion(obj))


def apply_children(run: Run) -> None:
    """Create or server-side apply each desired child this CR may own that differs from what runs. Any refusal of
    the apiserver is reported (ApplyFailed, naming the child, the code and the apiserver's message; the CR is
    retried with backoff), the rest still applied; only a lost connection ends the step. A workload whose
    ServiceAccount could not be created in this pass waits for the retry (its pods would fail "serviceaccount not
    found" and the Deployment controller would report a RolloutFailed of its own)."""
    refused: list[str] = []
    missing_accounts: set[str] = set()
    conflicts = len(run.conflicts)
    for desired in run.desired:
        k, obj = k8s.key(desired), desired
        if k in run.conflicts:
            continue
        account = pod_service_account(obj)
        if account is not None and account in missing_accounts:
            refused.append(
                f"{obj['kind']} {obj['metadata']['name']}: not applied until ServiceAccount {account} exists"
            )
            continue
        try:
            try:
                new = write_child(run, obj)
            except client.ApiException as e:
                if not k8s.owner_kind_unknown(e):
                    raise
                metrics.api_error("apply", e.status)
                metrics.OWNER_REFERENCES_DEFERRED.labels(kind=obj["kind"]).inc()
                obj = unblocked(run, obj)
                new = write_child(run, obj)
        except client.ApiException as e:
            metrics.api_error("apply", e.status)
            why = blame.hint(k8s.api_message(e), obj, run.body.get("spec") or {})
            refused.append(f"{obj['kind']} {obj['metadata']['name']}: {why}")
            if obj["kind"] == "ServiceAccount" and k in run.absent:
                missing_accounts.add(str(obj["metadata"]["name"]))
            continue
        if new is None:
            continue
        run.cache.put_child(new)
        _CHECKED[str(new["metadata"].get("uid"))] = _signature(new, obj)
        action = _action(run.ours.get(k), new)
        metrics.OBJECTS_APPLIED.labels(kind=obj["kind"], action=str(action or "unchanged").lower()).inc()
        if action is not None:
            run.actions[action].append(f"{obj['kind']} {obj['metadata']['name']}")
    if len(run.conflicts) > conflicts:
        report_conflicts(run)
    if refused:
        message = "the apiserver refused " + "; ".join(refused)
        run.failure = run.failure or Failure(Reason.APPLY_FAILED, message)
        if run.failure.reason != Reason.APPLY_FAILED:
            run.failure = Failure(run.failure.reason, f"{run.failure.message}; {message}")


def pod_service_account(obj: Mapping[str, Any]) -> str | None:
    """The ServiceAccount a workload's pods run as (a Deployment's template, a LeaderWorkerSet's leader or worker)."""
    spec = obj.get("spec") or {}
    group = spec.get("leaderWorkerTemplate") or {}
    for template in (spec.get("template"), group.get("leaderTemplate"), group.get("workerTemplate")):
        name = ((template or {}).get("spec") or {}).get("serviceAccountName")
        if name:
            return str(name)
    return None


def _action(old: Manifest | None, new: Manifest) -> Reason | None:
    if old is None:
        return Reason.CREATED
    gen_old, gen_new = old["metadata"].get("generation"), new["metadata"].get("generation")
    if gen_old is not None:
        changed = gen_old != gen_new
    else:
        changed = old["metadata"].get("resourceVersion") != new["metadata"].get("resourceVersion")
    return Reason.UPDATED if changed else None


def prune(run: Run) -> None:
    """Delete what this CR owns and no longer wants (only after a clean apply): a generation the plan no longer
    keeps (drained, or cancelled before it served) goes with the rest; a kept one stays as it is."""
    if run.failure is not None:
        return
    for obj in k8s.stale(run.ours.values(), run.desired):
        if run.plan is not None and generations.kept(obj, run.plan):
            continue
        k8s.delete(run.api, obj)
        run.cache.drop_child(obj)
        metrics.OBJECTS_PRUNED.labels(kind=obj["kind"]).inc()
        run.actions[Reason.PRUNED].append(f"{obj['kind']} {obj['metadata']['name']}")


STEPS: tuple[tuple[str, Callable[[Run], None]], ...] = (
    ("parse", parse),
    ("build", build),
    ("claim", claim),
    ("apply", apply_children),
    ("prune", prune),
)
"""The reconcile of one CR; any step may end it with a Failure (see `run_steps`), then observe + report run."""


def run_steps(run: Run) -> None:
    for name, step in STEPS:
        try:
            step(run)
        except SpecError as err:
            run.failure = Failure(Reason.INVALID_SPEC, err.message)
        except client.ApiException as e:
            if not k8s.refused(e):
                raise TransientError(f"{name}: {k8s.api_message(e)}") from e
            run.failure = Failure(Reason.RECONCILE_ERROR, f"step {name} failed: {k8s.api_message(e)}")
        except (urllib3.exceptions.HTTPError, OSError) as e:  # no connection: nothing to say about this CR
            raise TransientError(f"{name}: {e!r}") from e
        except Exception as e:  # a bug or input no check foresaw: this CR's problem only
            what = str(e) if isinstance(e, BuildError) else f"{type(e).__name__}: {e}"
            run.failure = Failure(Reason.RECONCILE_ERROR, f"step {name} failed: {what}")
        if run.failure is not None and run.failure.reason != Reason.OWNERSHIP_CONFLICT:
            return


def observe(run: Run) -> None:
    """What runs now, from the cache (after this run's own writes went into it): the router, every generation of the
    engines (the one the router routes to stands for the engines), their pods and why they are not Ready."""
    children, pods = run.cache.children(run.namespace, run.instance), run.cache.pods(run.namespace, run.instance)
    live = generations.observe(children, pods, run.uid)
    plan = run.plan or generations.hold_plan(live, served_generations(run.body))  # an invalid spec moves nothing
    run.observed = report.observe_deployments(children, run.name, run.uid, plan.route.hash if plan else None)
    run.pods = report.observe_pods(pods)
    run.nodes = run.cache.nodes
    if plan is not None:
        run.rollout = generations.RolloutView(live, plan, probe_details(run, live))


def probe_details(run: Run, live: generations.Live) -> dict[tuple[str, str], str]:
    """Why the engine pods of each generation and role are not Ready, from the kubelet's probe Events (the exec probe
    prints the runtime's reason, e.g. "P->D output differs from local"), as the watch cache holds them."""
    out: dict[tuple[str, str], str] = {}
    for gen in live.generations.values():
        for role in contract.ROLES:
            pods = gen.pods[role]
            waiting = [str(p["metadata"]["name"]) for p in pods if not podevents.pod_ready(p)]
            if not waiting:
                continue
            detail = podevents.probe_failure(pods, run.cache.events(run.namespace, waiting))
            if detail:
                out[(gen.hash, role)] = detail
    return out


def kv_path_report(run: Run) -> dict[str, Any] | None:
    """status.kvPath: the newest KV path report of a Ready decode pod of the CR (during a rollout, either
    generation's) on the CR's kv-reporter Lease, as the watch cache holds it (podevents.kv_path)."""
    pods = (run.pods or {}).get("decode") or []
    held = run.cache.child(run.namespace, "coordination.k8s.io/v1", "Lease", kv_reporter_name(run.name))
    if held is None or not k8s.owned_by(held, run.uid):
        return None
    now = report.now()
    stale = podevents.stale_reports(run.cache.pods(run.namespace, run.instance), held.get("reports"), now)
    if stale:  # reports of pods long gone: removed so the Lease's annotations do not grow with every restart
        gone = {contract.ANNOTATION_KV_REPORT_PREFIX + uid: None for uid in stale}
        try:
            k8s.patch(run.api, held, {"metadata": {"annotations": gone}})
        except client.ApiException as e:
            log.warning(
                f"{run.namespace}/{run.name}: removing {len(stale)} stale KV path reports: {k8s.api_message(e)}"
            )
    return podevents.kv_path(pods, held.get("reports"), now)


def write_report(run: Run) -> dict[str, Any]:
    """Status from what runs now (written only when it differs), Events for what changed, metrics."""
    md = run.body["metadata"]
    stored = run.body.get("status") or {}
    # What this process wrote last is at least as new as the cached body: compare with it, so no transition is
    # reported twice.
    previous = _REPORTED.get(run.uid) or stored.get("conditions") or []
    previous_rollout = _REPORTED_ROLLOUT.get(run.uid) or stored.get("rollout")
    status = compute_status(
        Observation(
            autoscalers=autoscaler_report(run),
            name=run.name,
            namespace=run.namespace,
            spec=run.cr.spec if run.cr is not None and run.profile is not None else None,
            observed=run.observed,
            pods=run.pods,
            nodes=run.nodes,
            generation=md.get("generation"),
            profile=run.profile,
            failure=run.failure,
            notes=run.notes,
            previous=previous,
            now=report.now(),
            role_details=run.role_details,
            not_scheduled_after=settings.current().not_scheduled_seconds,
            rollout=run.rollout,
            kv_path=kv_path_report(run),
            fallback=(run.fallback.reason, run.fallback.message, run.fallback.serving) if run.fallback else None,
        )
    )
    new_generation = stored.get("observedGeneration") != md.get("generation")
    try:
        written = report.write_status(run.api, run.body, status)
    except client.ApiException as e:
        status_refused(run, e)
        raise TransientError(f"status: {k8s.api_message(e)}") from e
    _STATUS_REFUSED.pop(run.uid, None)
    if written is not None:
        run.cache.put_cr(written, run.instance)
    _REPORTED[run.uid] = status["conditions"]
    if status.get("rollout") is not None:
        _REPORTED_ROLLOUT[run.uid] = status["rollout"]
    for action, whats in run.actions.items():
        report.event(run.api, run.body, "Normal", action, f"{str(action).lower()} " + ", ".join(whats))
    if new_generation and run.profile is not None:  # once per spec change, not per reconcile
        for warning in run.profile.warnings:
            report.event(run.api, run.body, "Warning", Reason.RISKY_SPEC, warning)
    for type_, reason, message in transitions(previous, status["conditions"]):
        report.event(run.api, run.body, type_, reason, message)
    for type_, reason, message in generations.rollout_transitions(previous_rollout, status.get("rollout")):
        report.event(run.api, run.body, type_, reason, message)
    metrics.record_status(run.namespace, run.name, status, md.get("creationTimestamp"))
    return status


def autoscaler_report(run: Run) -> dict[str, dict[str, Any]]:
    """status.<role>.autoscaler of each autoscaling role (its HPA as the cache holds it after this run's writes)."""
    if run.cr is None or run.profile is None:
        return {}
    route = run.rollout.plan.route.hash if run.rollout is not None else None
    hpas = report.observe_autoscalers(run.cache.children(run.namespace, run.instance), run.name, run.uid, route)
    out: dict[str, dict[str, Any]] = {}
    for role in autoscaled_roles(run.cr.spec):
        a = run.cr.spec.role(role).autoscaling
        assert a is not None
        dep = run.observed.get(role) or {}
        bounds = run.bounds.get(role) or Bounds(a.min_replicas, a.max_replicas)
        out[role] = autoscaler_status(role, a, bounds, hpas.get(role), (dep.get("spec") or {}).get("replicas"))
    return out


_REPORTED: dict[str, list[dict[str, Any]]] = {}
"""CR uid -> the conditions this process last wrote."""
_REPORTED_ROLLOUT: dict[str, dict[str, Any]] = {}
"""CR uid -> the status.rollout this process last wrote (one Event per rollout transition)."""
_STATUS_REFUSED: dict[str, str] = {}
"""CR uid -> why the apiserver refused its last status write (one Warning Event per distinct reason)."""


def status_refused(run: Run, e: client.ApiException) -> None:
    """A refused status write leaves the CR without the status that would say why: say it in a Warning Event (once
    per distinct answer; the retries with backoff post nothing new) and in the log."""
    why = (
        f"the apiserver refused this {contract.KIND}'s status ({k8s.api_message(e)}); if it names the object's "
        "size, the spec is too large to store a status beside it (shorten spec.env values or podTemplate)"
    )
    log.warning(f"{run.namespace}/{run.name}: {why}")
    if _STATUS_REFUSED.get(run.uid) != why:
        _STATUS_REFUSED[run.uid] = why
        report.event(run.api, run.body, "Warning", Reason.STATUS_WRITE_FAILED, why)


def converge(api: client.ApiClient, cache: Cache, body: Mapping[str, Any]) -> Run:
    """The steps, then observe + report. Raises TransientError (and lets connection errors through) only for
    failures worth a blind retry; everything else ends in this CR's status."""
    with metrics.reconcile() as outcome:
        run = Run(api, cache, body, podmonitor_served=_caps().podmonitors, lws_served=_caps().lws)
        run_steps(run)
        try:
            observe(run)
        except client.ApiException as e:
            raise TransientError(f"observe: {k8s.api_message(e)}") from e
        after = settings.current().not_scheduled_seconds
        pod_check = next_pod_check((p for pods in run.pods.values() for p in pods), report.now(), after)
        if pod_check is not None:  # a pod no scheduler looked at turns NotScheduled then: no event announces it
            run.requeue_after = min(run.requeue_after or pod_check, pod_check)
        write_report(run)
        outcome.failed(run.failure.reason if run.failure is not None else None)
        outcome.requeue(retry=run.retry is not None, after=run.requeue_after is not None)
        return run


def reconcile_key(api: client.ApiClient, key: CRKey) -> Run | None:
    """Converge the CR `key` as cached now (nothing when it is gone or being deleted)."""
    body = CACHE.cr(key)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        return None
    return converge(api, CACHE, body)


def forget(key: CRKey, uid: str) -> None:
    """A CR is gone: drop its metrics and what this process remembers of it (children go by garbage collection)."""
    metrics.forget(*key)
    _REPORTED.pop(uid, None)
    _REPORTED_ROLLOUT.pop(uid, None)
    _STATUS_REFUSED.pop(uid, None)
    _SEEN.pop(key, None)
    QUEUE.forget(key)


# --- workers and the safety resync -----------------------------------------------------------------------------------
def describe(e: BaseException) -> tuple[str, str]:
    """(code, text) of a failure for the log and the api_errors metric: the apiserver's code and message when an API
    call failed (also behind a TransientError), else the exception itself."""
    for err in (e, e.__cause__):
        if isinstance(err, client.ApiException):
            return str(err.status), k8s.api_message(err)
    return type(e).__name__, str(e) or repr(e)


def schedule(queue: WorkQueue[CRKey], key: CRKey, run: Run | None) -> None:
    """After a reconcile: forget the key's backoff when the CR converged; otherwise retry it with backoff, whatever
    the failure (controller-runtime requeues every error): RBAC gets fixed, a quota raised, a namespace or a CRD's
    discovery appears, a name is freed, a spec edited. Spec-bound failures back off to the cap like the rest; a name
    held by another object is looked at again at least every settings.recheck_seconds (no event announces its
    deletion). Retries write no status and post no Event unless the failure's message changed."""
    why = None if run is None else (run.failure.message if run.failure is not None else run.retry)
    if run is None or why is None:
        queue.forget(key)
        if run is not None and run.requeue_after is not None:
            queue.add_after(key, run.requeue_after)
        return
    # no event announces what these wait for: the deletion of an object without our label, LWS being installed
    recheck = run.failure is not None and run.failure.reason in (Reason.OWNERSHIP_CONFLICT, Reason.LWS_MISSING)
    first = queue.failures(key) == 0
    delay = queue.add_rate_limited(key, settings.current().recheck_seconds if recheck else None)
    (log.info if first else log.debug)(f"{key[0]}/{key[1]}: not converged, retrying in {delay:.1f} s: {why}")


def worker(api: client.ApiClient, queue: WorkQueue[CRKey]) -> None:
    """Take keys until the queue shuts down; one CR's failure never stops the worker."""
    while True:
        try:
            key = queue.get()
        except ShutDown:
            return
        try:
            run = reconcile_key(api, key)
        except Exception as e:  # transient API trouble or a refused status write: back off and retry this key
            delay = queue.add_rate_limited(key)
            code, text = describe(e)
            metrics.api_error("reconcile", code)
            log.warning(f"reconcile {key[0]}/{key[1]} failed ({text}); retrying in {delay:.1f} s")
        else:
            schedule(queue, key, run)
        finally:
            queue.done(key)


def resync_once(cache: Cache, queue: WorkQueue[CRKey]) -> int:
    """Queue every cached CR (drift correction and fresh status without a list call); returns how many."""
    keys = cache.cr_keys()
    for key in keys:
        queue.add(key)
    for what, n in cache.sizes().items():
        metrics.OBSERVED_OBJECTS.labels(what).set(n)
    return len(keys)


async def _resync_loop() -> None:
    interval = settings.current().resync_seconds
    while True:
        await asyncio.sleep(interval)
        resync_once(CACHE, QUEUE)


@kopf.on.startup(id="workers")
async def start_workers(**_: Any) -> None:
    """The reconcile workers (threads: the kubernetes client is synchronous) and the safety resync. Kept in _STATE,
    not in kopf's memo: kopf copies the memo into its memory of every watched object."""
    if "api" not in _STATE:
        raise kopf.PermanentError("start the operator with `python -m hpd_operator run` (it calls handlers.setup)")
    n = settings.current().workers
    workers = [
        threading.Thread(target=worker, args=(_api(), QUEUE), name=f"reconcile-{i}", daemon=True) for i in range(n)
    ]
    for t in workers:
        t.start()
    _STATE["workers"], _STATE["resync_task"] = workers, asyncio.create_task(_resync_loop())


@kopf.on.probe(id="workers")
def workers_alive(**_: Any) -> int:
    """What liveness (/healthz) means: this process can still converge CRs. kopf answers /healthz from its own event
    loop; this probe adds the reconcile threads (a dead worker thread would leave CRs unconverged while the loop looks
    healthy), and /healthz answers 500 when one died, so the kubelet restarts the operator. The apiserver's
    reachability is NOT part of it: a restart cannot bring an apiserver back, and every operator of a cluster
    restarting through a control-plane outage would only add load when it returns (the watches and the backoff
    resume on their own: tests/cluster/test_reliability.py)."""
    workers: list[threading.Thread] = _STATE.get("workers") or []
    dead = [t.name for t in workers if not t.is_alive()]
    if dead:
        raise kopf.PermanentError(f"reconcile worker thread(s) exited: {', '.join(dead)}")
    return len(workers)


@kopf.on.cleanup(id="workers")
async def stop_workers(**_: Any) -> None:
    task = _STATE.get("resync_task")
    if task is not None:
        task.cancel()
    QUEUE.shutdown()
