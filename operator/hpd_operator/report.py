"""I/O beside apply.py: shape what the watch cache holds about what runs (role Deployments, pods), read what no
watch covers (permissions), and report (status, Events).

Events follow the core/v1 series semantics that client-go's EventCorrelator uses: one object per CR, type, reason
and message, named deterministically; a repeat patches `count` and `lastTimestamp` on that object instead of
creating another. The handlers post Events only on transitions, so a CR stuck on one problem has one Event whose
count says how often it was reported, never an Event storm.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client

from hpd_operator import apply as k8s
from hpd_operator import metrics
from hpd_operator.api.names import component_names, group_name, role_name
from hpd_operator.generations import roles_of
from hpd_operator.status import COMPONENTS
from hpd_runtime import contract

MAX_EVENT_MESSAGE = 1024


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- read ---------------------------------------------------------------------------------------------------------
# The CRs, children, pods and nodes come from the watch cache (cache.py); these shape what it holds, or read what
# no watch covers.
def observe_deployments(
    children: Iterable[Mapping[str, Any]], name: str, uid: str, generation: str | None = None
) -> dict[str, dict[str, Any] | None]:
    """Component -> its live workload, if this CR owns it (from the CR's cached children): the router's Deployment,
    and the engines of `generation` (hpd_operator.generations): a role's Deployment, or its LeaderWorkerSet when its
    replicas span nodes in that generation (a generation has one or the other: the shape is in its hash)."""
    owned = [d for d in children if k8s.owned_by(d, uid)]
    deployments = {d["metadata"]["name"]: dict(d) for d in owned if d.get("kind") == "Deployment"}
    groups = {d["metadata"]["name"]: dict(d) for d in owned if d.get("kind") == "LeaderWorkerSet"}
    out = {comp: deployments.get(n) for comp, n in component_names(name, generation).items()}
    pair = deployments.get(role_name(name, contract.COMPONENT_PAIR, generation))
    for role in contract.ROLES:
        group = groups.get(group_name(name, role, generation))
        if group is not None and out[role] is None:
            out[role] = group
        if pair is not None and out[role] is None:  # pair pods: one Deployment runs both roles
            out[role] = pair
    return out


def observe_autoscalers(
    children: Iterable[Mapping[str, Any]], name: str, uid: str, generation: str | None = None
) -> dict[str, dict[str, Any] | None]:
    """Role -> its live HorizontalPodAutoscaler of `generation` (the serving one), if this CR owns it (named like the
    role's Deployment of that generation)."""
    by_name = {
        d["metadata"]["name"]: dict(d)
        for d in children
        if d.get("kind") == "HorizontalPodAutoscaler" and k8s.owned_by(d, uid)
    }
    pair = by_name.get(role_name(name, contract.COMPONENT_PAIR, generation))  # decode's, scaling the pair pods
    out: dict[str, dict[str, Any] | None] = {
        role: by_name.get(role_name(name, role, generation)) for role in contract.ROLES
    }
    if pair is not None and out["decode"] is None:
        out["decode"] = pair
    return out


def observe_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Component -> its live pods (for the scheduler's verdict and the nodes they are bound to); a pair pod counts under
    both roles (generations.roles_of)."""
    out: dict[str, list[dict[str, Any]]] = {comp: [] for comp in COMPONENTS}
    for pod in pods:
        comp = ((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_COMPONENT)
        for c in roles_of(comp) or ((comp,) if comp in out else ()):
            out[c].append(dict(pod))
    return out


def may(api: client.ApiClient, verb: str, resource: str, group: str = "") -> bool:
    """Whether the operator may `verb` the cluster-scoped `resource` (a SelfSubjectAccessReview, at startup)."""
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, group=group)
        )
    )
    out = client.AuthorizationV1Api(api).create_self_subject_access_review(review)
    return out.status is not None and bool(out.status.allowed)


# --- report -------------------------------------------------------------------------------------------------------
def status_differs(body: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    current = body.get("status") or {}
    return not all(current.get(k) == v for k, v in status.items())


def write_status(api: client.ApiClient, body: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
    """Patch the status subresource when something changed; returns the CR as stored (None: nothing written)."""
    if not status_differs(body, status):
        return None
    md = body["metadata"]
    path = (
        f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{md['namespace']}/{contract.PLURAL}/{md['name']}/status"
    )
    try:
        return k8s.send(api, "PATCH", path, {"status": status}, "application/merge-patch+json")
    except client.ApiException as e:
        metrics.api_error("status", e.status)
        if e.status != 404:  # the CR is gone: nothing to report on
            raise
        return None


def event_name(body: Mapping[str, Any], type_: str, reason: str, message: str) -> str:
    """One Event object per CR, type, reason and message (client-go's aggregation key, minus the source)."""
    md = body["metadata"]
    digest = hashlib.sha256(f"{md.get('uid')}\0{type_}\0{reason}\0{message}".encode()).hexdigest()[:16]
    return f"{str(md['name'])[:200]}.{digest}"


def event(api: client.ApiClient, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Record a core/v1 Event on the CR: create it, or count one more on the same Event. Best effort: never fails
    a reconcile."""
    md = body["metadata"]
    message = message if len(message) <= MAX_EVENT_MESSAGE else message[: MAX_EVENT_MESSAGE - 3] + "..."
    name, ns = event_name(body, type_, reason, message), md["namespace"]
    stamp = now()
    ev = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "involvedObject": {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "name": md["name"],
            "namespace": ns,
            "uid": md.get("uid"),
            "resourceVersion": md.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": contract.MANAGED_BY},
        "reportingComponent": contract.MANAGED_BY,
        "reportingInstance": contract.MANAGED_BY,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    path = f"/api/v1/namespaces/{ns}/events"
    try:
        try:
            k8s.send(api, "POST", path, ev)
        except client.ApiException as e:
            if e.status != 409:
                raise
            old = k8s.read(api, f"{path}/{name}")
            patch = {"count": int(old.get("count") or 1) + 1, "lastTimestamp": stamp}
            k8s.send(api, "PATCH", f"{path}/{name}", patch, "application/merge-patch+json")
    except client.ApiException as e:
        if not k8s.namespace_terminating(e):  # an Event in a namespace being deleted is refused: nothing to tell
            metrics.api_error("event", e.status)
