"""The observed state, kept from watches (no I/O here): the CRs, the children the operator manages, their pods, and
the node names. handlers.py feeds it from kopf's watch streams; the reconcile reads it instead of listing.

- Thread-safe: the watch handlers write from kopf's event loop, the reconcile workers read from their threads. Every
  read returns copies of the small dicts it hands out (never a live structure another thread may change).
- Trimmed, straight from kopf's body (no full copy first): a child or pod is kept only with the fields the reconcile
  reads (name, uid, versions, our three labels, the hash annotation, owner references, other managers' entries
  reduced to "annotations only, which" or "more"; a Deployment's spec.replicas, status counts and problem
  conditions; a pod's node, IP, creation time, phase, Ready and unschedulable conditions; a kv-reporter Lease's
  reports); a CR without managedFields and annotations.
  Repeated strings are interned.
- Write-through: what the operator itself applied, deleted or wrote as status goes in at once (`put_*` with the
  apiserver's answer), so the next reconcile does not act on a copy older than its own write. A watch event older
  than what is cached (a smaller integer resourceVersion; Kubernetes' are etcd revisions) is ignored.
- Probe-failure Events (podevents.py) about our pods are kept too (watched with a field selector), so the reason a
  pod is not Ready reaches the status without a list call.
- Grouping: children and pods by (namespace, instance label), the label every child and pod carries; a CR maps to
  its instance label value through `api.names.instance_label` (names longer than a label value are shortened).
"""

from __future__ import annotations

import copy
import sys
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from hpd_runtime import contract

CRKey = tuple[str, str]
"""(namespace, name) of a CR: the work queue's key."""
ObjKey = tuple[str, str, str, str]
"""(namespace, apiVersion, kind, name) of a child."""


def _rv(obj: Mapping[str, Any]) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


def newer_or_same(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether `new` may replace `old` (same uid and not an older resourceVersion; another uid always may)."""
    if old is None:
        return True
    if (new.get("metadata") or {}).get("uid") != (old.get("metadata") or {}).get("uid"):
        return True
    a, b = _rv(new), _rv(old)
    return a is None or b is None or a >= b


def managed(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(contract.LABEL_MANAGED_BY) == contract.MANAGED_BY and contract.LABEL_INSTANCE in labels


def _s(value: Any) -> Any:
    """Strings that repeat across objects (label values, kinds, managers, condition types) are kept once."""
    return sys.intern(value) if isinstance(value, str) else value


_LABELS = (
    contract.LABEL_MANAGED_BY,
    contract.LABEL_INSTANCE,
    contract.LABEL_COMPONENT,
    contract.LABEL_GENERATION,
    contract.LABEL_GENERATION_NUMBER,
    contract.LABEL_GROUP_ROLE,
)
"""The only labels the reconcile reads (grouping, `managed`, a pod's role, the generation it belongs to, a group
leader: status.ready_count)."""
OTHER_FIELDS: dict[str, Any] = {"f:(more than annotations)": {}}
"""Stands for another manager's field set that sets more than annotations: all drift.touched_by_others needs."""


def _labels(md: Mapping[str, Any]) -> dict[str, str]:
    labels = md.get("labels") or {}
    return {k: _s(labels[k]) for k in _LABELS if k in labels}


def _fields(fields: Any) -> Any:
    """Another manager's field set: kept only when it sets annotations and nothing else (their keys), else
    OTHER_FIELDS (drift._annotations_only tells the two apart)."""
    if not isinstance(fields, Mapping) or set(fields) != {"f:metadata"}:
        return OTHER_FIELDS
    meta = fields["f:metadata"]
    if not isinstance(meta, Mapping) or set(meta) - {"f:annotations"}:
        return OTHER_FIELDS
    return {"f:metadata": {"f:annotations": {_s(str(k)): {} for k in meta.get("f:annotations") or {}}}}


def _meta(md: Mapping[str, Any]) -> dict[str, Any]:
    ann = md.get("annotations") or {}
    out = {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "generation") if k in md}
    out["namespace"] = _s(out.get("namespace"))
    out["labels"] = _labels(md)
    out["annotations"] = {k: v for k, v in ann.items() if k == contract.ANNOTATION_DESIRED_HASH}
    out["ownerReferences"] = [
        {k: v if k == "uid" else _s(v) for k, v in r.items() if k != "blockOwnerDeletion"}
        for r in md.get("ownerReferences") or []
    ]
    if md.get("deletionTimestamp"):
        out["deletionTimestamp"] = md["deletionTimestamp"]
    # managedFields on the main resource (not status/scale): ours without its field set, others' reduced (_fields).
    mf = []
    for e in md.get("managedFields") or []:
        if e.get("subresource"):
            continue
        entry = {k: _s(e.get(k)) for k in ("manager", "operation")}
        entry["time"] = e.get("time")
        if e.get("manager") != contract.FIELD_MANAGER:
            entry["fieldsV1"] = _fields(e.get("fieldsV1"))
        elif "f:replicas" in ((e.get("fieldsV1") or {}).get("f:spec") or {}):
            entry["ownsReplicas"] = True  # handlers.hand_off_replicas: an autoscaling role's field goes to its HPA
        mf.append(entry)
    out["managedFields"] = mf
    return out


_DEPLOYMENT_STATUS = ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas", "observedGeneration")


def _problem_conditions(conditions: Any) -> list[dict[str, Any]]:
    """A Deployment's conditions that status.py reports (Progressing False, ReplicaFailure True); the rest are
    the usual progress and take room."""
    out = []
    for c in conditions or []:
        if (c.get("type"), c.get("status")) in (("Progressing", "False"), ("ReplicaFailure", "True")):
            out.append({k: _s(c[k]) for k in ("type", "status", "reason", "message") if k in c})
    return out


_GROUP_STATUS = ("replicas", "readyReplicas", "updatedReplicas", "observedGeneration")
"""A LeaderWorkerSet's status counts groups (status.role_state)."""


def trim_child(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the reconcile reads of a child: metadata (ownership, hash, generation, managers), and for Deployments
    spec.replicas + the status counts and problem conditions, for LeaderWorkerSets spec.replicas, the group size and
    the status counts (status.py)."""
    out: dict[str, Any] = {"apiVersion": _s(obj.get("apiVersion")), "kind": _s(obj.get("kind"))}
    out["metadata"] = _meta(obj.get("metadata") or {})
    if obj.get("kind") == "LeaderWorkerSet":
        sp, st = obj.get("spec") or {}, obj.get("status") or {}
        size = (sp.get("leaderWorkerTemplate") or {}).get("size")
        out["spec"] = {"replicas": sp.get("replicas"), "leaderWorkerTemplate": {"size": size}}
        out["status"] = {k: st[k] for k in _GROUP_STATUS if k in st}
    if obj.get("kind") == "Deployment":
        st = obj.get("status") or {}
        out["spec"] = {"replicas": (obj.get("spec") or {}).get("replicas")}
        out["status"] = {k: st[k] for k in _DEPLOYMENT_STATUS if k in st}
        problems = _problem_conditions(st.get("conditions"))
        if problems:
            out["status"]["conditions"] = problems
    elif obj.get("kind") == "HorizontalPodAutoscaler":
        out.update(_trim_hpa(obj))
    elif obj.get("kind") == "Lease":  # the decode pods' KV path reports, by pod uid (podevents.kv_path)
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        prefix = contract.ANNOTATION_KV_REPORT_PREFIX
        out["reports"] = {k.removeprefix(prefix): v for k, v in ann.items() if k.startswith(prefix)}
    return out


_HPA_STATUS = ("currentReplicas", "desiredReplicas", "lastScaleTime")


def _trim_hpa(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What scaling.py reads of an HPA: its bounds, its replica counts, its conditions, its metrics' values."""
    sp, st = obj.get("spec") or {}, obj.get("status") or {}
    status: dict[str, Any] = {k: st[k] for k in _HPA_STATUS if k in st}
    status["conditions"] = [
        {k: _s(c[k]) for k in ("type", "status", "reason", "message") if k in c} for c in st.get("conditions") or []
    ]
    status["currentMetrics"] = [
        {"external": {"metric": {"name": _s(((m.get("external") or {}).get("metric") or {}).get("name"))},
                      "current": dict((m.get("external") or {}).get("current") or {})}}
        for m in st.get("currentMetrics") or [] if m.get("type") == "External"
    ]  # fmt: skip
    return {"spec": {k: sp.get(k) for k in ("minReplicas", "maxReplicas")}, "status": status}


def _pod_conditions(conditions: Any) -> list[dict[str, Any]]:
    """Ready (status.py, podevents.py) and an unschedulable PodScheduled (status.py) only."""
    out = []
    for c in conditions or []:
        if c.get("type") == "Ready":
            out.append({k: _s(c[k]) for k in ("type", "status") if k in c})
        elif c.get("type") == "PodScheduled" and c.get("status") == "False":
            out.append({k: _s(c[k]) for k in ("type", "status", "reason", "message") if k in c})
    return out


def trim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What status.py and podevents.py read of a pod: name, uid, creation time, our labels, deletion, node, IP,
    phase and the Ready and unschedulable conditions; for a pod not bound to a node, its scheduler. (The IP and the
    creation time name a prefill pod in decode's KV path report: podevents.verified_prefills.)"""
    md, sp, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    meta = {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp") if k in md}
    meta["namespace"] = _s(meta.get("namespace"))
    meta["labels"] = _labels(md)
    meta["creationTimestamp"] = _s(md.get("creationTimestamp"))  # unbound: how long it waits (NotScheduled)
    node = sp.get("nodeName")
    spec: dict[str, Any] = {"nodeName": _s(node)} if node else {}
    if not node and sp.get("schedulerName"):  # unbound: for which scheduler (status.py: NotScheduled)
        spec["schedulerName"] = _s(sp.get("schedulerName"))
    status: dict[str, Any] = {"phase": _s(st.get("phase")), "conditions": _pod_conditions(st.get("conditions"))}
    if st.get("podIP"):
        status["podIP"] = st["podIP"]
    return {"metadata": meta, "spec": spec, "status": status}


def trim_cr(body: Mapping[str, Any]) -> dict[str, Any]:
    """A CR as the reconcile reads it (a plain copy): all but metadata.managedFields and annotations (kubectl's
    last-applied copy of the whole object would double it)."""
    md = body.get("metadata") or {}
    out = {k: plain(v) for k, v in body.items() if k != "metadata"}
    out["metadata"] = {k: plain(v) for k, v in md.items() if k not in ("managedFields", "annotations")}
    return out


def plain(x: Any) -> Any:
    """A plain dict/list copy of a (kopf view of a) JSON value."""
    if isinstance(x, Mapping):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    return x


def trim_event(ev: Mapping[str, Any]) -> dict[str, Any]:
    """What podevents.probe_failure and podevents.kv_path read of an Event."""
    md = ev.get("metadata") or {}
    obj = ev.get("involvedObject") or {}
    out = {k: ev.get(k) for k in ("reason", "message", "type", "lastTimestamp", "eventTime", "firstTimestamp")}
    out["involvedObject"] = {k: obj.get(k) for k in ("kind", "name", "uid")}
    meta: dict[str, Any] = {k: md.get(k) for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")}
    ann = {k: v for k, v in (md.get("annotations") or {}).items() if str(k).startswith(contract.GROUP + "/")}
    if ann:  # the KV path report's figures (hpd_runtime/kube_events.py)
        meta["annotations"] = ann
    out["metadata"] = meta
    return out


def obj_key(obj: Mapping[str, Any]) -> ObjKey:
    md = obj.get("metadata") or {}
    return (str(md.get("namespace")), str(obj.get("apiVersion")), str(obj.get("kind")), str(md.get("name")))


def _group(obj: Mapping[str, Any]) -> tuple[str, str]:
    md = obj.get("metadata") or {}
    return str(md.get("namespace")), str((md.get("labels") or {}).get(contract.LABEL_INSTANCE))


class Cache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._crs: dict[CRKey, dict[str, Any]] = {}
        self._instance: dict[tuple[str, str], set[str]] = defaultdict(set)
        """(namespace, instance label value) -> CR names."""
        self._children: dict[ObjKey, dict[str, Any]] = {}
        self._child_groups: dict[tuple[str, str], set[ObjKey]] = defaultdict(set)
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._pod_groups: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
        self._events: dict[tuple[str, str], dict[str, Any]] = {}
        """(namespace, Event name) -> a probe-failure Event about one of our pods."""
        self._pod_events: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
        """(namespace, pod name) -> its Events' keys."""
        self.nodes: frozenset[str] | None = None
        """Existing node names; None while nodes are not watched (no permission)."""

    # --- CRs ---------------------------------------------------------------------------------------------------
    def put_cr(self, body: Mapping[str, Any], instance: str) -> bool:
        """Store a CR body (a plain dict copy); False when `body` is older than what is cached."""
        md = body.get("metadata") or {}
        key = (str(md.get("namespace")), str(md.get("name")))
        with self._lock:
            if not newer_or_same(body, self._crs.get(key)):
                return False
            self._crs[key] = trim_cr(body)
            self._instance[(key[0], instance)].add(key[1])
        return True

    def drop_cr(self, key: CRKey, instance: str) -> None:
        with self._lock:
            self._crs.pop(key, None)
            names = self._instance.get((key[0], instance))
            if names is not None:
                names.discard(key[1])
                if not names:
                    del self._instance[(key[0], instance)]

    def cr(self, key: CRKey) -> dict[str, Any] | None:
        with self._lock:
            body = self._crs.get(key)
            return copy.deepcopy(body) if body is not None else None

    def cr_keys(self) -> list[CRKey]:
        with self._lock:
            return list(self._crs)

    def crs_of(self, namespace: str, instance: str) -> list[CRKey]:
        """The CRs whose children and pods carry this instance label value."""
        with self._lock:
            return [(namespace, n) for n in self._instance.get((namespace, instance), ())]

    # --- children ----------------------------------------------------------------------------------------------
    def put_child(self, obj: Mapping[str, Any]) -> None:
        """Store (trimmed) an object of a child kind; one without our labels is forgotten instead."""
        k = obj_key(obj)
        with self._lock:
            if not newer_or_same(obj, self._children.get(k)):
                return
            self._remove_child(k)
            if managed(obj):
                trimmed = trim_child(obj)
                self._children[k] = trimmed
                self._child_groups[_group(trimmed)].add(k)

    def drop_child(self, obj: Mapping[str, Any]) -> None:
        """Forget a deleted object (only the one with this uid: a new object of the same name stays)."""
        k = obj_key(obj)
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            old = self._children.get(k)
            if old is not None and (uid is None or old["metadata"].get("uid") == uid):
                self._remove_child(k)

    def _remove_child(self, k: ObjKey) -> None:
        old = self._children.pop(k, None)
        if old is not None:
            group = self._child_groups.get(_group(old))
            if group is not None:
                group.discard(k)
                if not group:
                    del self._child_groups[_group(old)]

    def children(self, namespace: str, instance: str) -> list[dict[str, Any]]:
        """Every cached child carrying this instance label (copies)."""
        with self._lock:
            keys = self._child_groups.get((namespace, instance), set())
            return [copy.deepcopy(self._children[k]) for k in keys]

    def child(self, namespace: str, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        """A cached child by name, whichever CR labelled it (the ownership check)."""
        with self._lock:
            obj = self._children.get((namespace, api_version, kind, name))
            return copy.deepcopy(obj) if obj is not None else None

    # --- pods --------------------------------------------------------------------------------------------------
    def put_pod(self, pod: Mapping[str, Any]) -> None:
        md = pod.get("metadata") or {}
        k = (str(md.get("namespace")), str(md.get("name")))
        with self._lock:
            if not newer_or_same(pod, self._pods.get(k)):
                return
            self._remove_pod(k)
            if managed(pod):
                trimmed = trim_pod(pod)
                self._pods[k] = trimmed
                self._pod_groups[_group(trimmed)].add(k)

    def drop_pod(self, pod: Mapping[str, Any]) -> None:
        md = pod.get("metadata") or {}
        k = (str(md.get("namespace")), str(md.get("name")))
        with self._lock:
            old = self._pods.get(k)
            if old is not None and old["metadata"].get("uid") == md.get("uid"):
                self._remove_pod(k)
                for ek in self._pod_events.pop(k, set()):  # its Events go with it
                    self._events.pop(ek, None)

    def _remove_pod(self, k: tuple[str, str]) -> None:
        old = self._pods.pop(k, None)
        if old is not None:
            group = self._pod_groups.get(_group(old))
            if group is not None:
                group.discard(k)
                if not group:
                    del self._pod_groups[_group(old)]

    def pods(self, namespace: str, instance: str) -> list[dict[str, Any]]:
        with self._lock:
            keys = self._pod_groups.get((namespace, instance), set())
            return [copy.deepcopy(self._pods[k]) for k in keys]

    def pod_group(self, namespace: str, pod: str) -> tuple[str, str] | None:
        """(namespace, instance) of a cached pod."""
        with self._lock:
            p = self._pods.get((namespace, pod))
            return _group(p) if p is not None else None

    # --- probe-failure Events ------------------------------------------------------------------------------------
    def put_event(self, ev: Mapping[str, Any]) -> bool:
        """Keep a kubelet probe-failure Event about one of our (cached) pods; False when it is about another pod."""
        md, obj = ev.get("metadata") or {}, ev.get("involvedObject") or {}
        ns, pod = str(md.get("namespace")), str(obj.get("name"))
        k = (ns, str(md.get("name")))
        with self._lock:
            if (ns, pod) not in self._pods:
                return False
            if not newer_or_same(ev, self._events.get(k)):
                return True
            self._events[k] = trim_event(ev)
            self._pod_events[(ns, pod)].add(k)
        return True

    def drop_event(self, ev: Mapping[str, Any]) -> None:
        md, obj = ev.get("metadata") or {}, ev.get("involvedObject") or {}
        ns = str(md.get("namespace"))
        k, pk = (ns, str(md.get("name"))), (ns, str(obj.get("name")))
        with self._lock:
            self._events.pop(k, None)
            keys = self._pod_events.get(pk)
            if keys is not None:
                keys.discard(k)
                if not keys:
                    del self._pod_events[pk]

    def events(self, namespace: str, pods: Iterable[str]) -> list[dict[str, Any]]:
        """The cached probe-failure Events about these pods."""
        with self._lock:
            keys = [k for p in pods for k in self._pod_events.get((namespace, p), ())]
            return [copy.deepcopy(self._events[k]) for k in keys if k in self._events]

    def groups_on_node(self, node: str) -> list[tuple[str, str]]:
        """(namespace, instance) of every pod group with a pod bound to `node`."""
        with self._lock:
            return sorted({_group(p) for p in self._pods.values() if (p.get("spec") or {}).get("nodeName") == node})

    # --- nodes -------------------------------------------------------------------------------------------------
    def set_nodes(self, names: Iterable[str] | None) -> None:
        with self._lock:
            self.nodes = frozenset(names) if names is not None else None

    def add_node(self, name: str) -> None:
        with self._lock:
            self.nodes = (self.nodes or frozenset()) | {name}

    def drop_node(self, name: str) -> None:
        with self._lock:
            self.nodes = (self.nodes or frozenset()) - {name}

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {
                "crs": len(self._crs),
                "children": len(self._children),
                "pods": len(self._pods),
                "events": len(self._events),
            }
