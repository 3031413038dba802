"""Pure: the kubelet's probe-failure Events of a role's pods -> why that role is not Ready, for its condition.

The engine pods' startup and readiness probes are exec probes (`python3 -m hpd_runtime probe`) that print the
runtime's reason. For a failing exec probe the kubelet records a Warning Event on the pod, reason `Unhealthy`,
message `"<Startup|Readiness> probe failed: <the probe's output>"` (pkg/kubelet/prober/prober.go); an HTTP probe's
Event would carry only the status code. So the decode runtime's "P->D output differs from local ..." reaches
`kubectl describe hpd` without the pod holding any Kubernetes credentials: the operator reads its pods' Events
and copies the newest message into the role condition (DecodeReady / PrefillReady).

The KV path report is the one Event an engine pod posts itself (reason `KVPath`, hpd_runtime/kube_events.py, with a
ServiceAccount that may only create Events): the operator watches those through events.k8s.io/v1 (kopf takes one
field selector per resource, and core/v1 Events are already watched by reason=Unhealthy), turns them into the same
shape (`core_shape`) and puts the newest of a Ready decode pod into `status.kvPath` (`kv_path`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hpd_runtime import contract

UNHEALTHY = "Unhealthy"
EVENT_FIELD_SELECTOR = f"involvedObject.kind=Pod,reason={UNHEALTHY}"
"""What the operator lists (core/v1 Events support these field selectors)."""
KV_EVENT_FIELD_SELECTOR = f"regarding.kind=Pod,reason={contract.EVENT_REASON_KV_PATH}"
"""The decode pods' KV path reports, watched as events.k8s.io/v1 Events (their field names)."""
_PROBE_PREFIX = re.compile(r"^(?:\(combined from similar events\):\s*)?(Startup|Readiness) probe failed:\s*", re.S)
MESSAGE_LIMIT = 600


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _when(event: Mapping[str, Any]) -> str:
    # RFC 3339 timestamps in UTC sort as strings; eventTime (events.k8s.io) or the legacy fields
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def _uids(pods: Iterable[Mapping[str, Any]], ready: bool) -> dict[str, str]:
    """Name -> uid of the pods whose readiness is `ready`."""
    return {
        str((p.get("metadata") or {}).get("name")): str((p.get("metadata") or {}).get("uid") or "")
        for p in pods
        if pod_ready(p) is ready
    }


def _about(pods: Mapping[str, str], events: Iterable[Mapping[str, Any]], reason: str) -> Iterator[Mapping[str, Any]]:
    """The Events of `reason` about these pods (name -> uid); one about an earlier pod of the same name is skipped."""
    for ev in events:
        obj = ev.get("involvedObject") or {}
        name = str(obj.get("name"))
        if obj.get("kind") != "Pod" or name not in pods or ev.get("reason") != reason:
            continue
        if pods[name] and obj.get("uid") and obj.get("uid") != pods[name]:
            continue  # an earlier pod of the same name
        yield ev


def probe_failure(pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]) -> str | None:
    """`pod NAME: <reason>` from the newest Startup/Readiness probe failure of a pod that is not Ready now.

    Events of Ready pods (stale), of other pods, and other reasons are ignored; None when nothing applies."""
    best: tuple[str, str, str] | None = None
    for ev in _about(_uids(pods, ready=False), events, UNHEALTHY):
        m = _PROBE_PREFIX.match(str(ev.get("message") or ""))
        if m is None:
            continue
        text = str(ev["message"])[m.end() :].strip()
        key = (_when(ev), str((ev.get("involvedObject") or {}).get("name")), text)
        if best is None or key[0] > best[0]:
            best = key
    if best is None:
        return None
    text = best[2] if len(best[2]) <= MESSAGE_LIMIT else best[2][: MESSAGE_LIMIT - 3] + "..."
    return f"pod {best[1]}: {text}"


def core_shape(ev: Mapping[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event in the core/v1 field names the rest of this module reads."""
    series = ev.get("series") or {}
    return {
        "metadata": ev.get("metadata") or {},
        "involvedObject": ev.get("regarding") or {},
        "reason": ev.get("reason"),
        "message": ev.get("note"),
        "type": ev.get("type"),
        "lastTimestamp": series.get("lastObservedTime") or ev.get("deprecatedLastTimestamp") or ev.get("eventTime"),
    }


def _int(x: Any) -> int | None:
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return None


def kv_path(pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """`status.kvPath` from the newest KVPath Event about one of these pods that is Ready now (camelCase), or None."""
    ev = max(_about(_uids(pods, ready=True), events, contract.EVENT_REASON_KV_PATH), key=_when, default=None)
    if ev is None:
        return None
    ann = (ev.get("metadata") or {}).get("annotations") or {}
    out = {
        "pod": str((ev.get("involvedObject") or {}).get("name")),
        "message": str(ev.get("message") or "")[:MESSAGE_LIMIT],
        "bytesPerSecond": _int(ann.get(contract.ANNOTATION_KV_BYTES_PER_SECOND)),
        "bytesPerRequest": _int(ann.get(contract.ANNOTATION_KV_BYTES_PER_REQUEST)),
        "fabric": ann.get(contract.ANNOTATION_KV_FABRIC),
        "belowFloor": ann.get(contract.ANNOTATION_KV_BELOW_FLOOR) == "true" or ev.get("type") == "Warning",
        "observedTime": _when(ev) or None,
    }
    return {k: v for k, v in out.items() if v is not None}
