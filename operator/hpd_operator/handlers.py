"""kopf handlers and the reconcile of one CR as a short list of named steps; the I/O lives in apply.py (children)
and report.py (reads, status, Events); status.py is pure.

- `reconcile` (create, update of spec, resume) and the resync loop both run `converge`: parse -> build -> claim ->
  apply -> prune, then observe -> report. Each CR is isolated: whatever one step raises for one CR (an invalid spec,
  a child the apiserver refuses, a name held by someone else, a bug) becomes THAT CR's `Ready=False` condition
  with a reason from conditions.Reason and a message naming the step, child or field, plus one Warning Event on the
  transition; the remaining steps that change children are skipped, observedGeneration is written, and the loop
  goes on with the next CR. Only transient API failures (5xx, 429, no connection) are retried without a status.
- the resync loop (every settings.current().resync_seconds): lists the CRs in the watched namespaces and converges
  each (drift correction: an edited or deleted child comes back) with fresh status from the observed Deployments
  and pods. It is a plain asyncio task started at startup, NOT a kopf timer: kopf always puts a finalizer on
  objects with timers/daemons, and a finalizer would block `kubectl delete` while the operator is down.
- No finalizer: children carry owner references, so the garbage collector deletes them even when the operator is
  down; the delete handler is optional and only forgets metrics.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
import urllib3
from kubernetes import client, config

from hpd_operator import apply as k8s
from hpd_operator import metrics, podevents, report, settings
from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.builders import Manifest, build_all, instance_selector
from hpd_operator.conditions import Failure, Reason
from hpd_operator.errors import SpecError
from hpd_operator.profile import Profile, compute_profile
from hpd_operator.render import parse_cr
from hpd_operator.status import compute_status, transitions
from hpd_runtime import contract

RESOURCE = (contract.GROUP, contract.VERSION, contract.PLURAL)
PODMONITOR = ("monitoring.coreos.com/v1", "PodMonitor")
Key = tuple[str, str, str]


@kopf.on.startup(id="client")
def connect(memo: kopf.Memo, **_: Any) -> None:
    """One kubernetes ApiClient for our own calls (kopf uses its own for watching and the CR)."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    memo.api = client.ApiClient(cfg)


def _cr_object(body: Mapping[str, Any]) -> dict[str, Any]:
    md = body.get("metadata", {})
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace")},
        "spec": _plain(body.get("spec", {})),
    }


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


@dataclass
class Run:
    """One reconcile of one CR: what each step found, in order."""

    api: client.ApiClient
    body: Mapping[str, Any]
    trigger: str
    nodes: frozenset[str] | None = None
    cr: HybridPDDeployment | None = None
    profile: Profile | None = None
    desired: list[Manifest] = field(default_factory=list)
    ours: dict[Key, Manifest] = field(default_factory=dict)
    conflicts: dict[Key, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    actions: dict[Reason, list[str]] = field(default_factory=lambda: defaultdict(list))
    observed: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    podmonitor_served: bool = False
    role_details: dict[str, str] = field(default_factory=dict)
    failure: Failure | None = None

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        return str(self.body["metadata"].get("uid"))


class TransientError(Exception):
    """The API failed in a way worth retrying (5xx, 429, no connection): no status is written for it."""


def parse(run: Run) -> None:
    """Parse once, then the profile (raises SpecError naming the field)."""
    cfg = settings.current()
    run.cr = parse_cr(
        _cr_object(run.body),
        vllm_image=cfg.vllm_image,
        router_image=cfg.router_image,
        pod_monitor_labels=dict(cfg.pod_monitor_labels),
    )
    run.profile = compute_profile(run.cr.spec)
    run.notes.extend(run.profile.warnings)


def build(run: Run) -> None:
    """The whole desired set, owned by the CR; PodMonitors only where the apiserver serves them."""
    assert run.cr is not None and run.profile is not None
    try:
        desired = build_all(run.cr, run.profile)
    except Exception as e:  # the schema let through something a builder cannot use: say where to look
        free = free_form_fields(run.cr)
        hint = f" (set free-form fields, taken as written: {', '.join(free)})" if free else ""
        raise BuildError(f"{type(e).__name__}: {e}{hint}") from e
    run.podmonitor_served = k8s.api_available(run.api, *PODMONITOR)
    if not run.podmonitor_served and any((d["apiVersion"], d["kind"]) == PODMONITOR for d in desired):
        run.notes.append(
            "PodMonitors skipped: monitoring.coreos.com/v1 PodMonitor is not served (no Prometheus Operator)"
        )
        desired = [d for d in desired if (d["apiVersion"], d["kind"]) != PODMONITOR]
    for obj in desired:
        kopf.append_owner_reference(obj, owner=cast("kopf.Body", run.body))
    run.desired = desired


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


def _kinds(run: Run) -> list[k8s.Kind]:
    return [k for k in k8s.KINDS if (k.api_version, k.kind) != PODMONITOR or run.podmonitor_served]


def claim(run: Run) -> None:
    """What this CR owns, and the desired names held by anything else (never taken over)."""
    labelled = {
        k8s.key(e): e for e in k8s.list_children(run.api, run.namespace, instance_selector(run.name), _kinds(run))
    }
    run.ours = {k: e for k, e in labelled.items() if k8s.owned_by(e, run.uid)}
    run.conflicts = k8s.foreign(run.api, run.desired, labelled, run.uid)
    if run.conflicts:
        held = "; ".join(f"{kind} {name} exists and is {who}" for (_, kind, name), who in run.conflicts.items())
        run.failure = Failure(
            Reason.OWNERSHIP_CONFLICT,
            f"{held}: left alone (rename this {contract.KIND} or delete that object); the other children are applied",
        )


def apply_children(run: Run) -> None:
    """Server-side apply every desired child this CR may own; a refused child is reported, the rest still applied."""
    refused: list[str] = []
    for obj in run.desired:
        k = k8s.key(obj)
        if k in run.conflicts:
            continue
        what = f"{obj['kind']} {obj['metadata']['name']}"
        try:
            new = k8s.apply(run.api, obj)
        except client.ApiException as e:
            metrics.api_error("apply", e.status)
            if not k8s.refused(e):
                raise
            refused.append(f"{what}: {k8s.api_message(e)}")
            continue
        action = _action(run.ours.get(k), new)
        metrics.OBJECTS_APPLIED.labels(kind=obj["kind"], action=str(action or "unchanged").lower()).inc()
        if action is not None:
            run.actions[action].append(what)
    if refused:
        message = "the apiserver refused " + "; ".join(refused)
        run.failure = run.failure or Failure(Reason.APPLY_FAILED, message)
        if run.failure.reason != Reason.APPLY_FAILED:
            run.failure = Failure(run.failure.reason, f"{run.failure.message}; {message}")


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
    """Delete what this CR owns and no longer wants (only after a clean apply)."""
    if run.failure is not None:
        return
    for obj in k8s.stale(run.ours.values(), run.desired):
        k8s.delete(run.api, obj)
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
    run.observed = report.observe_deployments(run.api, run.namespace, run.name, run.uid)
    run.pods = report.observe_pods(run.api, run.namespace, run.name)
    if run.trigger != "resync":  # a resync round lists the nodes once for every CR
        run.nodes = report.observe_nodes(run.api)
    run.role_details = probe_details(run)


def probe_details(run: Run) -> dict[str, str]:
    """Why an engine role's pods are not Ready, from the kubelet's probe Events (the exec probe prints the runtime's
    reason, e.g. "P->D output differs from local"); one Event list, and only while some engine pod is not Ready."""
    waiting = {role: run.pods.get(role, []) for role in contract.ROLES}
    if not any(not podevents.pod_ready(p) for pods in waiting.values() for p in pods):
        return {}
    events = report.observe_probe_events(run.api, run.namespace)
    out: dict[str, str] = {}
    for role, pods in waiting.items():
        detail = podevents.probe_failure(pods, events)
        if detail:
            out[role] = detail
    return out


def write_report(run: Run) -> dict[str, Any]:
    """Status from what runs now, Events for what changed, metrics."""
    md = run.body["metadata"]
    # What this process wrote last is at least as new as the body (a resync round lists the CRs before it converges
    # them, and the change handler may write in between): compare with it, so no transition is reported twice.
    previous = _REPORTED.get(run.uid) or (run.body.get("status") or {}).get("conditions") or []
    status = compute_status(
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
    )
    report.write_status(run.api, run.body, status)
    _REPORTED[run.uid] = status["conditions"]
    for action, whats in run.actions.items():
        report.event(run.api, run.body, "Normal", action, f"{str(action).lower()} " + ", ".join(whats))
    if run.trigger != "resync" and run.profile is not None:  # once per spec change, not per resync round
        for warning in run.profile.warnings:
            report.event(run.api, run.body, "Warning", Reason.RISKY_SPEC, warning)
    for type_, reason, message in transitions(previous, status["conditions"]):
        report.event(run.api, run.body, type_, reason, message)
    metrics.record_status(run.namespace, run.name, status, md.get("creationTimestamp"))
    return status


_REPORTED: dict[str, list[dict[str, Any]]] = {}
"""CR uid -> the conditions this process last wrote."""
_LOCKS: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
"""One converge at a time per CR uid (the change handler and the resync loop run in different threads)."""


def converge(
    api: client.ApiClient, body: Mapping[str, Any], *, trigger: str, nodes: frozenset[str] | None = None
) -> dict[str, Any]:
    """The steps, then observe + report; returns the status written. Raises TransientError (and lets connection
    errors through) only for failures worth a blind retry; everything else ends in this CR's status."""
    with _LOCKS[str(body["metadata"].get("uid"))], metrics.reconcile() as outcome:
        run = Run(api, body, trigger, nodes=nodes)
        run_steps(run)
        try:
            observe(run)
        except client.ApiException as e:
            raise TransientError(f"observe: {k8s.api_message(e)}") from e
        status = write_report(run)
        outcome.failed(run.failure.reason if run.failure is not None else None)
        return status


@kopf.on.resume(*RESOURCE, id="reconcile")
@kopf.on.create(*RESOURCE, id="reconcile")
@kopf.on.update(*RESOURCE, field="spec", id="reconcile")
def reconcile(body: kopf.Body, memo: kopf.Memo, reason: str, **_: Any) -> None:
    """A failure of this CR is in its status (and one Event); only transient API trouble is retried here (the
    resync loop retries everything else on its next round)."""
    try:
        converge(memo.api, body, trigger=str(reason))
    except Exception as e:
        raise kopf.TemporaryError(f"reconcile failed, retrying: {e!r}", delay=10) from e


def resync_once(api: client.ApiClient, logger: kopf.Logger) -> None:
    """Converge every CR in the watched namespaces once (drift correction + fresh status). One CR's failure never
    stops the round."""
    crs = report.list_crs(api, settings.current().namespaces)
    nodes = report.observe_nodes(api) if crs else None
    for raw in crs:
        if raw.get("metadata", {}).get("deletionTimestamp"):
            continue
        try:
            converge(api, raw, trigger="resync", nodes=nodes)
        except Exception as e:  # transient API trouble, or a failed status write: next round
            md = raw.get("metadata", {})
            metrics.api_error("resync", type(e).__name__)
            logger.warning(f"resync {md.get('namespace')}/{md.get('name')}: {e!r}; retry next round")


async def _resync_loop(api: client.ApiClient, logger: kopf.Logger) -> None:
    interval = settings.current().resync_seconds
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(resync_once, api, logger)
        except Exception as e:  # the loop must survive anything; the next round retries
            metrics.api_error("resync", type(e).__name__)
            logger.warning(f"resync round failed: {e!r}")


@kopf.on.startup(id="resync")
async def start_resync(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    memo.resync_task = asyncio.create_task(_resync_loop(memo.api, logger))


@kopf.on.cleanup(id="resync")
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("resync_task")
    if task is not None:
        task.cancel()


@kopf.on.delete(*RESOURCE, id="forget", optional=True)
def forget(meta: kopf.Meta, **_: Any) -> None:
    """No finalizer (optional=True): children go by garbage collection; only our metrics need forgetting."""
    metrics.forget(str(meta.get("namespace")), str(meta.get("name")))
    _LOCKS.pop(str(meta.get("uid")), None)
    _REPORTED.pop(str(meta.get("uid")), None)
