"""Decode's KV path report: the only calls the runtime makes to the Kubernetes API.

The pair check and the canary measure the KV rate (`kvstats`); /readyz and the metrics carry it, and this module
writes it twice:
- into the annotation `kv.hybridpd.io/<pod uid>` of the Lease `<cr>-kv-reporter` (HPD_KV_REPORT_LEASE), a JSON object
  with the keys `contract.KV_REPORT_FIELDS`. The operator reads only this into the CR's `status.kvPath` and its
  DataPathVerified condition: only the CR's kv-reporter ServiceAccount may patch that Lease (its Role names it), so
  no other CR's pods and no one who may merely create Events can put a figure there;
- as a core/v1 Event about the decode pod, reason `KVPath` (Normal; Warning below the declared fabric's floor), with
  the figures in annotations, for `kubectl describe pod`.

The pod's ServiceAccount (`<cr>-kv-reporter`, made by the operator) may patch that Lease and create Events, nothing
else. Outside a cluster (no token, no KUBERNETES_SERVICE_HOST, no HPD_POD_NAME) nothing is sent. A failed write is
logged, never raised: the report is a convenience, Ready does not depend on it.

Posting is rate-limited (`Reporter.due`): the first report, a change of the below-floor verdict, a rate that moved by
more than RATE_CHANGE_FACTOR since the last posted one, or REPOST_SECONDS since it. A canary every 5 minutes thus
posts about once an hour per decode pod while nothing changes.

The report also lists the prefill peers whose pair check passed and still holds (`prefills`,
contract.KV_REPORT_PREFILLS): degraded mode's switch back to the router waits until a decode lists a Ready prefill
pod there. A change of that list is written to the Lease at once, with or without new figures and whatever the
rate limit (`Reporter.peers`; the last figures are re-sent unchanged, since the annotation is replaced whole); a
write that failed is retried from the monitor's poll, at most every PEERS_RETRY_SECONDS. No Event for it: the
Event carries the figures.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from hpd_runtime import contract as c
from hpd_runtime.log import log_event

TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
TIMEOUT_SECONDS = 5.0
RATE_CHANGE_FACTOR = 2.0
REPOST_SECONDS = 3600.0
PEERS_RETRY_SECONDS = 30.0
"""After a failed write of a changed prefill list, the next try of the same list waits this long (each try may
block the monitor's poll for TIMEOUT_SECONDS when the apiserver does not answer)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """Where to post: the apiserver, the credentials, and the pod the Event is about."""

    server: str
    token_path: str
    ca_path: str | None
    pod: str
    namespace: str
    uid: str
    lease: str | None = None
    """The CR's kv-reporter Lease (None: no report into the status, the Event only)."""


def target_from_env(env: Mapping[str, str] | None = None) -> Target | None:
    """The in-cluster apiserver and this pod, or None outside a cluster (or without the downward-API env)."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    pod, ns, uid = (env.get(n, "").strip() for n in (c.ENV_POD_NAME, c.ENV_POD_NAMESPACE, c.ENV_POD_UID))
    token = env.get("HPD_KUBE_TOKEN_PATH", TOKEN_PATH)
    if not (host and pod and ns and os.path.exists(token)):
        return None
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    ca = env.get("HPD_KUBE_CA_PATH", CA_PATH)
    lease = env.get(c.ENV_KV_REPORT_LEASE, "").strip() or None
    return Target(server, token, ca if os.path.exists(ca) else None, pod, ns, uid, lease)


def stamp(when: float) -> str:
    """An RFC 3339 UTC time to the second, as the apiserver writes them."""
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(t: Target, type_: str, message: str, annotations: Mapping[str, str], when: float) -> dict[str, Any]:
    """A core/v1 Event about the pod (pure)."""
    at = stamp(when)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{t.pod}.", "namespace": t.namespace, "annotations": dict(annotations)},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": t.pod, "namespace": t.namespace, "uid": t.uid},
        "reason": c.EVENT_REASON_KV_PATH,
        "message": message[:1024],
        "type": type_,
        "source": {"component": c.EVENT_COMPONENT_RUNTIME},
        "reportingComponent": c.EVENT_COMPONENT_RUNTIME,
        "reportingInstance": t.pod,
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }


def report_patch(t: Target, report: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that puts this pod's report on the kv-reporter Lease (pure): only its own annotation changes."""
    doc = {k: report[k] for k in c.KV_REPORT_FIELDS if report.get(k) is not None}
    value = json.dumps({**doc, "pod": t.pod}, sort_keys=True, separators=(",", ":"))
    return {"metadata": {"annotations": {c.ANNOTATION_KV_REPORT_PREFIX + t.uid: value}}}


def post(t: Target, body: Mapping[str, Any]) -> int:
    """POST the Event; the HTTP status (201 on success), 0 when the apiserver could not be reached."""
    return _send(t, "POST", f"/api/v1/namespaces/{t.namespace}/events", body, "application/json")


def patch_report(t: Target, body: Mapping[str, Any]) -> int:
    """PATCH the kv-reporter Lease; the HTTP status (200 on success), 0 when unreachable or no Lease."""
    if t.lease is None:
        return 0
    path = f"/apis/coordination.k8s.io/v1/namespaces/{t.namespace}/leases/{t.lease}"
    return _send(t, "PATCH", path, body, "application/merge-patch+json")


def _send(t: Target, method: str, path: str, body: Mapping[str, Any], content_type: str) -> int:
    try:  # a failed write is logged by the caller, never raised (a token or CA file gone counts as one)
        with open(t.token_path, encoding="utf-8") as fh:
            token = fh.read().strip()
        ctx = ssl.create_default_context(cafile=t.ca_path) if t.ca_path else ssl.create_default_context()
    except OSError:  # ssl.SSLError too
        return 0
    req = urllib.request.Request(
        f"{t.server}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_SECONDS, context=ctx) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return 0


Peers = list[dict[str, str]]
"""The report's `prefills` (contract.KV_REPORT_PREFILLS)."""


@dataclasses.dataclass
class Reporter:
    """Posts KV path reports for one decode pod, rate-limited (see the module doc)."""

    target: Target | None
    last_rate: float | None = None
    last_slow: bool | None = None
    last_at: float = 0.0
    last_figures: dict[str, Any] | None = None
    """The figures the Lease took last (re-sent with a changed prefill list)."""
    last_peers: Peers | None = None
    """The prefill list the Lease holds (None: none written yet)."""
    failed_peers: tuple[Peers, float] | None = None
    """A prefill list whose write failed, and when."""
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def due(self, rate: float, slow: bool, now: float) -> bool:
        if self.last_rate is None or slow != self.last_slow or now - self.last_at >= REPOST_SECONDS:
            return True
        return not (self.last_rate / RATE_CHANGE_FACTOR <= rate <= self.last_rate * RATE_CHANGE_FACTOR)

    def _store(self, t: Target, figures: Mapping[str, Any] | None, peers: Peers | None, now: float) -> int:
        """Write the report to the Lease (the caller holds the lock); the HTTP status. On success the Lease holds
        `figures` (or the last ones) and `peers` (or the last list)."""
        figures = dict(figures if figures is not None else self.last_figures or {})
        peers = peers if peers is not None else self.last_peers
        report = {**figures, "uid": t.uid}
        if peers is not None:
            report[c.KV_REPORT_PREFILLS] = peers
        stored = patch_report(t, report_patch(t, report))
        if stored == 200:
            self.last_figures, self.last_peers, self.failed_peers = figures or None, peers, None
        else:
            if t.lease is not None:
                log_event("kv_path_report_failed", level="warning", status=stored, server=t.server)
            if peers is not None and peers != self.last_peers:
                self.failed_peers = (peers, now)
        return stored

    def _peers_locked(self, t: Target, peers: Peers, now: float) -> bool:
        if t.lease is None or peers == (self.last_peers or []):  # (an empty list before any write says nothing)
            return False
        failed = self.failed_peers
        if failed is not None and failed[0] == peers and now - failed[1] < PEERS_RETRY_SECONDS:
            return False
        if self._store(t, None, peers, now) != 200:
            return False
        log_event("kv_path_peers", pod=t.pod, prefills=[p.get("ip") for p in peers])
        return True

    def peers(self, peers: Peers) -> bool:
        """Write a changed prefill list to the Lease now, with the last figures unchanged (see the module doc); True
        when the Lease took it. Nothing without a Lease, for an unchanged list, or for the list whose write failed
        less than PEERS_RETRY_SECONDS ago."""
        if self.target is None:
            return False
        with self._lock:
            return self._peers_locked(self.target, peers, time.time())

    def report(  # noqa: PLR0913 - the report's figures, each named
        self,
        message: str,
        *,
        rate: float,
        per_request: float,
        fabric: str,
        slow: bool,
        transport: str | None = None,
        prefills: Peers | None = None,
    ) -> bool:
        """Write one report if due (the Lease, then the Event); True when the Lease took it (or, with no Lease
        configured, when the Event was created). `prefills`: the verified prefill peers now; a changed list is
        written at once (as `peers` does) even when the figures are not due."""
        t = self.target
        if t is None:
            return False
        now = time.time()
        with self._lock:
            if not self.due(rate, slow, now):
                return prefills is not None and self._peers_locked(t, prefills, now)
            annotations = {
                c.ANNOTATION_KV_BYTES_PER_SECOND: f"{rate:.0f}",
                c.ANNOTATION_KV_BYTES_PER_REQUEST: f"{per_request:.0f}",
                c.ANNOTATION_KV_FABRIC: fabric,
                c.ANNOTATION_KV_BELOW_FLOOR: "true" if slow else "false",
            }
            figures = {
                "bytesPerSecond": round(rate), "bytesPerRequest": round(per_request), "fabric": fabric,
                "belowFloor": slow, "message": message[:1024], "observedTime": stamp(now), "transport": transport,
            }  # fmt: skip
            stored = self._store(t, figures, prefills, now)
            body = event_body(t, "Warning" if slow else "Normal", message, annotations, now)
            status = post(t, body)
            if status != 201:
                log_event("kv_path_event_failed", level="warning", status=status, server=t.server)
            if (stored if t.lease is not None else status) not in (200, 201):
                return False
            self.last_rate, self.last_slow, self.last_at = rate, slow, now
        log_event("kv_path_event", pod=t.pod, type="Warning" if slow else "Normal")
        return True
