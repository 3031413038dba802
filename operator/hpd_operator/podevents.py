"""Pure: the kubelet's probe-failure Events of a role's pods -> why that role is not Ready, for its condition.

The engine pods' startup and readiness probes are exec probes (`python3 -m hpd_runtime probe`) that print the
runtime's reason. For a failing exec probe the kubelet records a Warning Event on the pod, reason `Unhealthy`,
message `"<Startup|Readiness> probe failed: <the probe's output>"` (pkg/kubelet/prober/prober.go); an HTTP probe's
Event would carry only the status code. So the decode runtime's "P->D output differs from local ..." reaches
`kubectl describe hpd` without the pod holding any Kubernetes credentials: the operator reads its pods' Events
and copies the newest message into the role condition (DecodeReady / PrefillReady).

The KV path report is the one thing an engine pod writes itself (hpd_runtime/kube_events.py): a decode pod patches
its annotation `kv.hybridpd.io/<its uid>` of the Lease `<cr>-kv-reporter`, which only that CR's kv-reporter
ServiceAccount may patch (its Role names the Lease), and posts the same report as a `KVPath` Event on itself for
`kubectl describe pod`. The operator reads only the Lease (`kv_path`): an Event can be posted by anyone who may create Events in the namespace
(another CR's decode pods included), about any pod, with any timestamp, so Events never reach the status. The same
report lists the prefill peers whose pair check with that decode passed and still holds (`verified_prefills`):
degraded mode's switch back to the router waits for a Ready prefill pod in it.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hpd_runtime import contract

UNHEALTHY = "Unhealthy"
EVENT_FIELD_SELECTOR = f"involvedObject.kind=Pod,reason={UNHEALTHY}"
"""What the operator lists (core/v1 Events support these field selectors)."""
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


def _int(x: Any) -> int | None:
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return None


STALE_REPORT_SECONDS = 600.0
"""A report of a pod the CR no longer has is removed once it is this old (a new pod may write its report before the
operator's cache has seen the pod)."""
CLOCK_SKEW_SECONDS = 60.0
"""A report stamped later than now by more than this is ignored: a time in the future would win over every genuine
report for the pod's life."""


def _report(raw: object) -> dict[str, Any] | None:
    try:
        doc = json.loads(str(raw))
    except (TypeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _stamp(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)


def stale_reports(pods: Iterable[Mapping[str, Any]], reports: Mapping[str, Any] | None, now: str | None) -> list[str]:
    """The uids on the kv-reporter Lease of pods that are gone (none of `pods`, any state), reported more than
    STALE_REPORT_SECONDS before `now` or unreadable: the annotations to remove, so they do not pile up."""
    t_now, live = _stamp(now), {str((p.get("metadata") or {}).get("uid")) for p in pods}
    out = []
    for uid, raw in (reports or {}).items():
        if uid in live:
            continue
        when = _stamp((_report(raw) or {}).get("observedTime"))
        if when is None or (t_now is not None and (t_now - when).total_seconds() > STALE_REPORT_SECONDS):
            out.append(uid)
    return sorted(out)


def kv_path(
    pods: Iterable[Mapping[str, Any]], reports: Mapping[str, Any] | None, now: str | None
) -> dict[str, Any] | None:
    """`status.kvPath` (camelCase) from the newest report on the CR's kv-reporter Lease (`reports`: pod uid -> JSON)
    of a decode pod that is Ready now and not stamped in the future (beyond CLOCK_SKEW_SECONDS of `now`); None when no
    report qualifies."""
    t_now = _stamp(now)
    best: tuple[datetime.datetime, dict[str, Any]] | None = None
    for pod, uid in _uids(pods, ready=True).items():
        doc = _report((reports or {}).get(uid)) if uid else None
        if doc is None or doc.get("uid") != uid:
            continue
        when = _stamp(doc.get("observedTime"))
        if when is None or (t_now is not None and (when - t_now).total_seconds() > CLOCK_SKEW_SECONDS):
            continue
        out = {
            "pod": pod,
            "message": str(doc.get("message") or "")[:MESSAGE_LIMIT],
            "bytesPerSecond": _int(doc.get("bytesPerSecond")),
            "bytesPerRequest": _int(doc.get("bytesPerRequest")),
            "fabric": str(doc["fabric"]) if isinstance(doc.get("fabric"), str) else None,
            "transport": str(doc["transport"])[:200] if isinstance(doc.get("transport"), str) else None,
            "belowFloor": doc.get("belowFloor") is True,
            "observedTime": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if best is None or when > best[0]:
            best = (when, {k: v for k, v in out.items() if v is not None})
    return best[1] if best is not None else None


def verified_prefills(
    decode_pods: Iterable[Mapping[str, Any]],
    prefill_pods: Iterable[Mapping[str, Any]],
    reports: Mapping[str, Any] | None,
) -> list[frozenset[str]] | None:
    """Per Ready decode pod (of `decode_pods`) whose report on the kv-reporter Lease lists its prefill peers
    (`prefills`, contract.KV_REPORT_PREFILLS: the pairs it has verified and that still hold): the uids of the
    `prefill_pods` among them. None when no Ready decode's report carries the list (no report yet, or a runtime from
    before it): then nothing waits on it.

    A peer is named by its pod IP (prefill pods have no downward-API uid) and when its pair check passed: it is a
    prefill pod with that IP unless the check is older than the pod (by more than CLOCK_SKEW_SECONDS), which makes
    it a check of an earlier pod that had the same IP; a check without a readable time counts. A peer at
    contract.PAIR_LOOPBACK is the decode's own pod (a pair pod: decode checks the prefill beside it on 127.0.0.1)."""
    own_ip = {
        str(md.get("uid")): (p.get("status") or {}).get("podIP") for p in decode_pods if (md := p.get("metadata") or {})
    }
    prefills = [
        (str(md.get("uid") or ""), ip, _stamp(md.get("creationTimestamp")))
        for p in prefill_pods
        if (ip := (p.get("status") or {}).get("podIP")) and (md := p.get("metadata") or {}).get("uid")
    ]
    out: list[frozenset[str]] = []
    for uid in _uids(decode_pods, ready=True).values():
        doc = _report((reports or {}).get(uid)) if uid else None
        if doc is None or doc.get("uid") != uid or not isinstance(doc.get(contract.KV_REPORT_PREFILLS), list):
            continue
        peers: dict[str, list[datetime.datetime | None]] = {}
        for entry in doc[contract.KV_REPORT_PREFILLS]:
            if isinstance(entry, Mapping) and isinstance(entry.get("ip"), str):
                ip = (own_ip.get(uid) or entry["ip"]) if entry["ip"] == contract.PAIR_LOOPBACK else entry["ip"]
                peers.setdefault(ip, []).append(_stamp(entry.get("verifiedTime")))
        out.append(frozenset(
            pod for pod, ip, created in prefills
            if any(at is None or created is None or (created - at).total_seconds() <= CLOCK_SKEW_SECONDS
                   for at in peers.get(ip, ()))
        ))  # fmt: skip
    return out if out else None
