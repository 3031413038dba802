"""kopf handlers only: parse -> profile -> build -> apply + prune -> status. No manifest is built here.

- `reconcile` (create, update of spec, resume): the whole desired set every time; an invalid spec becomes
  `Ready=False, reason=InvalidSpec` + a Warning Event naming the field + kopf.PermanentError (not retried until
  the spec changes), and nothing is applied or pruned.
- the resync loop (every settings.current().resync_seconds): lists the CRs in the watched namespaces and runs the
  same converge for each (drift correction: an edited or deleted child comes back) + fresh status from the
  observed Deployments. Never posts the InvalidSpec Event again. It is a plain asyncio task started at startup,
  NOT a kopf timer: kopf always puts a finalizer on objects with timers/daemons, and a finalizer would block
  `kubectl delete` while the operator is down.
- No finalizer: children carry owner references, so the garbage collector deletes them even when the operator is
  down; the delete handler is optional and only forgets metrics.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client, config

from hpd_operator import apply as k8s
from hpd_operator import metrics, podevents, settings
from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.builders import build_all, instance_selector, role_name, router_name, selector_labels
from hpd_operator.errors import SpecError
from hpd_operator.profile import Profile, compute_profile
from hpd_operator.render import parse_cr
from hpd_operator.status import COMPONENTS, compute_status
from hpd_runtime import contract

RESOURCE = (contract.GROUP, contract.VERSION, contract.PLURAL)
PODMONITOR = ("monitoring.coreos.com/v1", "PodMonitor")
_DEPLOYMENT = k8s.kind_of({"apiVersion": "apps/v1", "kind": "Deployment"})


@kopf.on.startup(id="client")
def connect(memo: kopf.Memo, **_: Any) -> None:
    """One kubernetes ApiClient for our own calls (kopf uses its own for watching and the CR)."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    memo.api = client.ApiClient(cfg)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def _write_status(api: client.ApiClient, body: kopf.Body, status: dict[str, Any]) -> None:
    current = body.get("status") or {}
    if all(current.get(k) == v for k, v in status.items()):
        return
    md = body["metadata"]
    try:
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            contract.GROUP, contract.VERSION, md["namespace"], contract.PLURAL, md["name"], {"status": status}
        )
    except client.ApiException as e:
        metrics.API_ERRORS.labels(op="status", status=str(e.status)).inc()
        if e.status != 404:  # the CR is gone: nothing to report on
            raise


def _observe(api: client.ApiClient, namespace: str, name: str) -> dict[str, dict[str, Any] | None]:
    deps = k8s.list_children(api, namespace, instance_selector(name), kinds=[_DEPLOYMENT])
    by_name = {d["metadata"]["name"]: d for d in deps}
    names = {"prefill": role_name(name, "prefill"), "decode": role_name(name, "decode")}
    names[contract.COMPONENT_ROUTER] = router_name(name)
    return {comp: by_name.get(names[comp]) for comp in COMPONENTS}


def _event(api: client.ApiClient, body: kopf.Body, type_: str, reason: str, message: str) -> None:
    """A core/v1 Event on the CR (posted directly: it works the same from handlers and the resync loop)."""
    md = body["metadata"]
    now = datetime.datetime.now(datetime.UTC)
    ev = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{md['name']}.", namespace=md["namespace"]),
        involved_object=client.V1ObjectReference(
            api_version=body.get("apiVersion"),
            kind=body.get("kind"),
            name=md["name"],
            namespace=md["namespace"],
            uid=md.get("uid"),
            resource_version=md.get("resourceVersion"),
        ),
        type=type_,
        reason=reason,
        message=message[:1024],
        source=client.V1EventSource(component=contract.MANAGED_BY),
        reporting_component=contract.MANAGED_BY,
        reporting_instance=contract.MANAGED_BY,
        first_timestamp=now,
        last_timestamp=now,
        count=1,
    )
    try:
        client.CoreV1Api(api).create_namespaced_event(md["namespace"], ev)
    except client.ApiException as e:  # an Event is best effort; never fail a reconcile over it
        metrics.API_ERRORS.labels(op="event", status=str(e.status)).inc()


def _probe_details(
    api: client.ApiClient, namespace: str, name: str, observed: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, str]:
    """Why an engine role's pods are not Ready, from the kubelet's probe Events (only for roles not all Ready:
    two list calls per such role, none when everything is Ready)."""
    out: dict[str, str] = {}
    core = client.CoreV1Api(api)
    events: list[dict[str, Any]] | None = None
    for role in contract.ROLES:
        st = (observed.get(role) or {}).get("status") or {}
        if int(st.get("readyReplicas") or 0) >= int(st.get("replicas") or 0) and st:
            continue
        sel = ",".join(f"{k}={v}" for k, v in selector_labels(name, role).items())
        try:
            raw_pods = core.list_namespaced_pod(namespace, label_selector=sel).items
            pods: list[dict[str, Any]] = api.sanitize_for_serialization(raw_pods)  # type: ignore[no-untyped-call]
            if events is None:
                raw = core.list_namespaced_event(namespace, field_selector=podevents.EVENT_FIELD_SELECTOR).items
                events = api.sanitize_for_serialization(raw)  # type: ignore[no-untyped-call]
        except client.ApiException as e:  # best effort: the condition still says how many replicas are ready
            metrics.API_ERRORS.labels(op="probe-events", status=str(e.status)).inc()
            return out
        detail = podevents.probe_failure(pods, events or [])
        if detail:
            out[role] = detail
    return out


def _update_metrics(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    metrics.set_phase(namespace, name, status.get("phase"))
    for comp in COMPONENTS:
        rs = status.get(comp) or {}
        metrics.READY_REPLICAS.labels(namespace, name, comp).set(rs.get("readyReplicas", 0))
        desired = str(rs.get("summary", "0/0")).split("/")[-1]
        metrics.DESIRED_REPLICAS.labels(namespace, name, comp).set(int(desired or 0))


def _reject(api: client.ApiClient, body: kopf.Body, err: SpecError, *, post_event: bool) -> dict[str, Any]:
    md = body["metadata"]
    if post_event:
        _event(api, body, "Warning", "InvalidSpec", err.message)
    observed = _observe(api, md["namespace"], md["name"])
    status = compute_status(
        name=md["name"],
        namespace=md["namespace"],
        spec=None,
        observed=observed,
        generation=md.get("generation"),
        error=err,
        previous=(body.get("status") or {}).get("conditions") or [],
        now=_now(),
    )
    _write_status(api, body, status)
    _update_metrics(md["namespace"], md["name"], status)
    return status


def _apply_all(
    api: client.ApiClient, body: kopf.Body, cr: HybridPDDeployment, profile: Profile
) -> tuple[dict[str, dict[str, Any] | None], list[str]]:
    """Apply the desired set, prune the rest; returns the applied role Deployments and notes for status."""
    ns, name = cr.metadata.namespace or "", cr.metadata.name
    notes: list[str] = []
    desired = build_all(cr, profile)
    kinds = list(k8s.KINDS)
    if not k8s.api_available(api, *PODMONITOR):
        kinds = [k for k in kinds if (k.api_version, k.kind) != PODMONITOR]
        if any((d["apiVersion"], d["kind"]) == PODMONITOR for d in desired):
            notes.append(
                "PodMonitors skipped: monitoring.coreos.com/v1 PodMonitor is not served (no Prometheus Operator)"
            )
            desired = [d for d in desired if (d["apiVersion"], d["kind"]) != PODMONITOR]
    existing = {k8s.key(e): e for e in k8s.list_children(api, ns, instance_selector(name), kinds=kinds)}
    applied: dict[str, dict[str, Any]] = {}
    for obj in desired:
        kopf.append_owner_reference(obj, owner=body)
        old = existing.get(k8s.key(obj))
        new = k8s.apply(api, obj)
        if old is None:
            action = "created"
        else:
            gen_old, gen_new = old["metadata"].get("generation"), new["metadata"].get("generation")
            changed = (
                gen_old != gen_new
                if gen_old is not None
                else (old["metadata"].get("resourceVersion") != new["metadata"].get("resourceVersion"))
            )
            action = "updated" if changed else "unchanged"
        metrics.CHILDREN_APPLIED.labels(kind=obj["kind"], action=action).inc()
        if action != "unchanged":
            _event(api, body, "Normal", action.capitalize(), f"{action} {obj['kind']} {obj['metadata']['name']}")
        if obj["kind"] == "Deployment":
            applied[new["metadata"]["name"]] = new
    for obj in k8s.stale(existing.values(), desired):
        k8s.delete(api, obj)
        metrics.CHILDREN_APPLIED.labels(kind=obj["kind"], action="pruned").inc()
        _event(api, body, "Normal", "Pruned", f"deleted {obj['kind']} {obj['metadata']['name']} (no longer desired)")
    names = {"prefill": role_name(name, "prefill"), "decode": role_name(name, "decode")}
    names[contract.COMPONENT_ROUTER] = router_name(name)
    return {comp: applied.get(names[comp]) for comp in COMPONENTS}, notes


_LOCKS: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
"""One converge at a time per CR uid (the change handler and the resync timer run in kopf's thread pool)."""


def converge(api: client.ApiClient, body: kopf.Body, *, trigger: str) -> dict[str, Any]:
    """Parse once -> profile -> build -> apply + prune -> status. Raises SpecError for an invalid spec (after
    writing the InvalidSpec status) and ApiException for API failures."""
    with _LOCKS[str(body["metadata"].get("uid"))]:
        return _converge(api, body, trigger=trigger)


def _converge(api: client.ApiClient, body: kopf.Body, *, trigger: str) -> dict[str, Any]:
    start = time.monotonic()
    result = "error"
    try:
        try:
            cr = parse_cr(_cr_object(body))
            profile = compute_profile(cr.spec)
        except SpecError as err:
            result = "invalid"
            _reject(api, body, err, post_event=trigger != "resync")
            raise
        md = body["metadata"]
        if trigger != "resync":
            for warning in profile.warnings:
                _event(api, body, "Warning", "RiskySpec", warning)
        try:
            observed, notes = _apply_all(api, body, cr, profile)
        except client.ApiException as e:
            metrics.API_ERRORS.labels(op="apply", status=str(e.status)).inc()
            _event(api, body, "Warning", "ApplyFailed", f"{e.status} {e.reason}: {str(e.body)[:500]}")
            raise
        if trigger == "resync" or any(v is None for v in observed.values()):
            observed = _observe(api, md["namespace"], md["name"])
        status = compute_status(
            name=md["name"],
            namespace=md["namespace"],
            spec=cr.spec,
            observed=observed,
            generation=md.get("generation"),
            profile=profile,
            notes=[*notes, *profile.warnings],
            previous=(body.get("status") or {}).get("conditions") or [],
            now=_now(),
            role_details=_probe_details(api, md["namespace"], md["name"], observed),
        )
        _write_status(api, body, status)
        _update_metrics(md["namespace"], md["name"], status)
        result = "ok"
        return status
    finally:
        metrics.RECONCILES.labels(trigger=trigger, result=result).inc()
        metrics.RECONCILE_SECONDS.labels(result=result).observe(time.monotonic() - start)


def _transient(e: client.ApiException) -> kopf.TemporaryError:
    return kopf.TemporaryError(f"Kubernetes API error {e.status} {e.reason}; retrying", delay=10)


@kopf.on.resume(*RESOURCE, id="reconcile")
@kopf.on.create(*RESOURCE, id="reconcile")
@kopf.on.update(*RESOURCE, field="spec", id="reconcile")
def reconcile(body: kopf.Body, memo: kopf.Memo, reason: str, **_: Any) -> None:
    try:
        converge(memo.api, body, trigger=str(reason))
    except SpecError as err:
        raise kopf.PermanentError(err.message) from None
    except client.ApiException as e:
        raise _transient(e) from None
    except Exception as e:  # a bug or an unexpected reply: an Event, then kopf retries with backoff (no crash loop)
        _event(memo.api, body, "Warning", "ReconcileError", f"{type(e).__name__}: {e}")
        raise kopf.TemporaryError(f"reconcile failed: {e!r}", delay=30) from e


def _list_crs(api: client.ApiClient, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
    co = client.CustomObjectsApi(api)
    if not namespaces:
        data = cast("dict[str, Any]", co.list_cluster_custom_object(*RESOURCE))
        return list(data.get("items", []))
    out: list[dict[str, Any]] = []
    for ns in namespaces:
        page = cast(
            "dict[str, Any]", co.list_namespaced_custom_object(contract.GROUP, contract.VERSION, ns, contract.PLURAL)
        )
        out += page.get("items", [])
    return out


def resync_once(api: client.ApiClient, logger: kopf.Logger) -> None:
    """Converge every CR in the watched namespaces once (drift correction + fresh status)."""
    for raw in _list_crs(api, settings.current().namespaces):
        if raw.get("metadata", {}).get("deletionTimestamp"):
            continue
        body = kopf.Body(cast("kopf.RawBody", raw))
        try:
            converge(api, body, trigger="resync")
        except SpecError:
            pass  # status already says InvalidSpec; the Event was posted by reconcile
        except client.ApiException as e:
            logger.warning(f"resync {raw['metadata'].get('name')}: API error {e.status} {e.reason}; retry next round")


async def _resync_loop(api: client.ApiClient, logger: kopf.Logger) -> None:
    interval = settings.current().resync_seconds
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(resync_once, api, logger)
        except Exception as e:  # the loop must survive anything; the next round retries
            metrics.API_ERRORS.labels(op="resync", status=type(e).__name__).inc()
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
