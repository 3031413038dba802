"""I/O: server-side apply of children and prune of stale ones (the only place that writes children).

A fixed table of the kinds the builders make maps apiVersion/kind to REST paths, so there is no discovery round
trip per reconcile. Every apply is `PATCH application/apply-patch+yaml` with fieldManager hybrid-pd-operator and
force=true: a changed spec updates the child in place, and drift by someone else is overwritten. Force is only
used on objects this CR owns: a desired name held by another object (another CR's child, or one nobody manages) is
reported instead of taken over (same field manager = silent takeover). A child the watch cache does not hold is made
by `create`: the same apply with a resourceVersion precondition that no stored object meets, so it creates an absent
object in one request and answers 409 for an existing one (which the caller then reads to say who holds it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from hpd_runtime import contract

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str

    def base(self, namespace: str) -> str:
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{root}/namespaces/{namespace}/{self.plural}"


KINDS: tuple[Kind, ...] = (
    Kind("v1", "Service", "services"),
    Kind("coordination.k8s.io/v1", "Lease", "leases"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
    Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets"),
    Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
)
"""Every kind the builders can produce: apply and prune both walk this table."""
_BY_KEY = {(k.api_version, k.kind): k for k in KINDS}


def kind_of(obj: Mapping[str, Any]) -> Kind:
    return _BY_KEY[(str(obj["apiVersion"]), str(obj["kind"]))]


def _call(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query_params: list[tuple[str, str]] | None = None,
    header_params: dict[str, str] | None = None,
    body: Any = None,
) -> Any:
    """One raw REST call through the client's auth and TLS; JSON in, JSON out; ApiException on >= 400."""
    m, url, headers, data, _ = api.param_serialize(
        method,
        path,
        query_params=query_params,
        header_params=header_params,
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(m, url, header_params=headers, body=data)
    raw = resp.read()  # type: ignore[no-untyped-call]
    if not 200 <= resp.status < 300:
        raise client.ApiException(status=resp.status, reason=resp.reason, body=raw.decode(errors="replace"))
    return json.loads(raw) if raw else {}


CREATE_ONLY = "1"
"""The resourceVersion `create` sends. Server-side apply with metadata.resourceVersion set is an optimistic-lock
precondition on an existing object (409 Conflict unless equal) and is ignored when the object is created. Stored
objects carry the etcd revision of their last write, and etcd's first write is revision 2, so no object meets it."""


def create(api: client.ApiClient, obj: Manifest) -> Manifest | None:
    """Server-side apply `obj` only if no object holds its name: the object as stored, or None when one does."""
    try:
        return apply(api, {**obj, "metadata": {**obj["metadata"], "resourceVersion": CREATE_ONLY}})
    except client.ApiException as e:
        if e.status == 409:
            return None
        raise


def apply(api: client.ApiClient, obj: Manifest) -> Manifest:
    """Server-side apply one object; returns the object as stored."""
    k = kind_of(obj)
    md = obj["metadata"]
    out: Manifest = _call(
        api,
        "PATCH",
        f"{k.base(md['namespace'])}/{md['name']}",
        query_params=[("fieldManager", contract.FIELD_MANAGER), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        # JSON is YAML, but a YAML parser rejects JSON's surrogate-pair escapes of non-BMP characters (an emoji in
        # an env value -> 400): send the characters themselves, UTF-8 encoded.
        body=json.dumps(obj, ensure_ascii=False).encode(),
    )
    return out


HANDOFF_MANAGER = contract.FIELD_MANAGER + "-replicas-handoff"
"""The field manager that holds an autoscaling role's `spec.replicas` between the operator letting go of it and the
HPA's first write (which takes it over: an update through the scale subresource)."""


def hand_off_replicas(api: client.ApiClient, deployment: Manifest, replicas: int) -> Manifest:
    """Give up the operator's ownership of a Deployment's `spec.replicas` without changing it: apply the live value
    under HANDOFF_MANAGER first, so that the operator's next apply (which leaves the field out) does not delete it
    (server-side apply would remove a field no other manager owns, and the Deployment default would reset it to 1)."""
    md = deployment["metadata"]
    body = {
        "apiVersion": deployment["apiVersion"],
        "kind": deployment["kind"],
        "metadata": {"name": md["name"], "namespace": md["namespace"]},
        "spec": {"replicas": replicas},
    }
    out: Manifest = _call(
        api,
        "PATCH",
        f"{kind_of(deployment).base(md['namespace'])}/{md['name']}",
        query_params=[("fieldManager", HANDOFF_MANAGER), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=json.dumps(body).encode(),
    )
    return out


def owns_replicas(live: Mapping[str, Any]) -> bool:
    """Whether the operator's own managedFields entry holds `spec.replicas` (cache.py keeps that flag)."""
    entries = (live.get("metadata") or {}).get("managedFields") or []
    return any(e.get("manager") == contract.FIELD_MANAGER and e.get("ownsReplicas") for e in entries)


def read(
    api: client.ApiClient,
    path: str,
    query_params: list[tuple[str, str]] | None = None,
    accept: str = "application/json",
) -> Manifest:
    """GET one REST path as JSON (lists of pods, nodes: no model round trip)."""
    out: Manifest = _call(api, "GET", path, query_params=query_params, header_params={"Accept": accept})
    return out


def patch(api: client.ApiClient, obj: Mapping[str, Any], body: Mapping[str, Any]) -> Manifest:
    """A strategic merge patch of the object named like `obj`, as the operator's field manager (an Update entry beside
    its Apply entry, so the drift test does not take it for another manager's write)."""
    k, md = kind_of(obj), obj["metadata"]
    out: Manifest = _call(
        api,
        "PATCH",
        f"{k.base(md['namespace'])}/{md['name']}",
        query_params=[("fieldManager", contract.FIELD_MANAGER)],
        header_params={"Content-Type": "application/strategic-merge-patch+json", "Accept": "application/json"},
        body=dict(body),
    )
    out["apiVersion"], out["kind"] = k.api_version, k.kind
    return out


def send(api: client.ApiClient, method: str, path: str, body: Any, content_type: str = "application/json") -> Manifest:
    """One JSON request (a status merge patch, an Event) without the client's model classes: their per-call
    argument validation and first-use schema building cost more CPU than the request itself."""
    out: Manifest = _call(
        api, method, path, header_params={"Content-Type": content_type, "Accept": "application/json"}, body=body
    )
    return out


METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
"""Accept header for a list of metadata only (names of nodes without their status)."""


def get(api: client.ApiClient, obj: Mapping[str, Any]) -> Manifest | None:
    """The live object named like `obj` (None if absent)."""
    k = kind_of(obj)
    md = obj["metadata"]
    try:
        out: Manifest = _call(
            api, "GET", f"{k.base(md['namespace'])}/{md['name']}", header_params={"Accept": "application/json"}
        )
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    out["apiVersion"], out["kind"] = k.api_version, k.kind
    return out


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


def holder(obj: Mapping[str, Any]) -> str:
    """Who controls `obj`, in words (for the OwnershipConflict message)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    ctl = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ctl is None:
        return "not owned by any object"
    return f"owned by {ctl.get('kind')} {ctl.get('name')}"


def api_message(e: client.ApiException) -> str:
    """The apiserver's own message (it names the field: `spec.ports[1].port: Duplicate value: 8000`)."""
    try:
        body = json.loads(e.body or "")
    except (TypeError, ValueError):
        body = None
    msg = body.get("message") if isinstance(body, dict) else None
    return f"{e.status} {e.reason}: {msg or str(e.body or '')[:1000]}"


REFUSED_500 = ("failed to create typed patch object", "failed to convert new object", "unable to convert unstructured")
"""Server-side apply answers 500 (not 422) when the object does not fit the kind's schema (a string where a map
belongs, duplicate keys of a list map, a malformed quantity): as permanent as a 422."""


def refused(e: client.ApiException) -> bool:
    """The apiserver refused this object (rather than failing to answer): reported in the CR's status. Every
    failure is retried with backoff all the same (handlers.schedule): RBAC gets fixed, a quota raised, a namespace
    or a CRD's discovery appears, a spec gets edited."""
    if e.status in (400, 403, 404, 409, 422):
        return True
    return e.status == 500 and any(m in str(e.body) for m in REFUSED_500)


NAMESPACE_TERMINATING = "NamespaceTerminating"
"""The cause kube-apiserver's NamespaceLifecycle admission attaches to its 403 for an object created in a namespace
that is being deleted (`unable to create new content in namespace X because it is being terminated`;
k8s.io/api/core/v1 NamespaceTerminatingCause)."""


def namespace_terminating(e: client.ApiException) -> bool:
    """The apiserver refused a create only because the namespace is being deleted: not a permission problem (no
    `api_errors` count, no ApplyFailed, no retry): the CR goes with its namespace."""
    if e.status != 403:
        return False
    try:
        body = json.loads(e.body or "")
    except (TypeError, ValueError):
        return False
    causes = ((body.get("details") or {}).get("causes") or []) if isinstance(body, dict) else []
    return any(isinstance(c, dict) and c.get("reason") == NAMESPACE_TERMINATING for c in causes)


BLOCK_OWNER_DELETION_REFUSED = "cannot set blockOwnerDeletion"
"""kube-apiserver's OwnerReferencesPermissionEnforcement admission (on in OpenShift and in our local control plane)
checks that whoever sets blockOwnerDeletion may update the owner's finalizers; it resolves the owner's kind through
a RESTMapper built from discovery and reset every 30 s (k8s.io/apiserver pkg/server/options/admission.go), so for up to
30 s after a CRD is created it answers 403 "cannot set blockOwnerDeletion in this case because cannot find
RESTMapping for APIVersion ... Kind ...". helm install, then kubectl apply, meets it."""


def owner_kind_unknown(e: client.ApiException) -> bool:
    """The apiserver refused an object's blockOwnerDeletion only because it does not resolve the owner's kind yet."""
    return e.status == 403 and BLOCK_OWNER_DELETION_REFUSED in str(e.body) and "RESTMapping" in str(e.body)


def without_block_owner_deletion(obj: Mapping[str, Any]) -> Manifest:
    """A copy of `obj` whose owner references do not set blockOwnerDeletion (pure)."""
    md = dict(obj["metadata"])
    md["ownerReferences"] = [
        {k: v for k, v in ref.items() if k != "blockOwnerDeletion"} for ref in md.get("ownerReferences") or []
    ]
    return {**obj, "metadata": md}


def list_children(
    api: client.ApiClient, namespace: str, selector: Mapping[str, str], kinds: Iterable[Kind] = KINDS
) -> list[Manifest]:
    """Every object of our kinds in `namespace` carrying the selector's labels (apiVersion/kind filled in)."""
    sel = ",".join(f"{k}={v}" for k, v in selector.items())
    found: list[Manifest] = []
    for k in kinds:
        data = _call(
            api,
            "GET",
            k.base(namespace),
            query_params=[("labelSelector", sel)],
            header_params={"Accept": "application/json"},
        )
        for item in data.get("items", []):
            item["apiVersion"], item["kind"] = k.api_version, k.kind
            found.append(item)
    return found


def delete(api: client.ApiClient, obj: Mapping[str, Any]) -> None:
    k = kind_of(obj)
    md = obj["metadata"]
    body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    if md.get("uid"):
        body["preconditions"] = {"uid": md["uid"]}
    try:
        _call(
            api,
            "DELETE",
            f"{k.base(md['namespace'])}/{md['name']}",
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
        )
    except client.ApiException as e:
        if e.status not in (404, 409):  # already gone, or replaced by a new object of the same name
            raise


def key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(obj["apiVersion"]), str(obj["kind"]), str(obj["metadata"]["name"]))


def stale(existing: Iterable[Manifest], desired: Iterable[Manifest]) -> list[Manifest]:
    """Existing children that are not in the desired set (pure)."""
    want = {key(d) for d in desired}
    return [e for e in existing if key(e) not in want]


def api_available(api: client.ApiClient, api_version: str, kind: str) -> bool:
    """Whether the apiserver serves `kind` in `api_version` (e.g. PodMonitor only with the Prometheus Operator)."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    try:
        data = _call(api, "GET", root, header_params={"Accept": "application/json"})
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise
    return any(r.get("kind") == kind for r in data.get("resources", []))
