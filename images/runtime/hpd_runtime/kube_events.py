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


def _stamp(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(t: Target, type_: str, message: str, annotations: Mapping[str, str], when: float) -> dict[str, Any]:
    """A core/v1 Event about the pod (pure)."""
    stamp = _stamp(when)
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
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
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
    with open(t.token_path, encoding="utf-8") as fh:
        token = fh.read().strip()
    ctx = ssl.create_default_context(cafile=t.ca_path) if t.ca_path else ssl.create_default_context()
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


@dataclasses.dataclass
class Reporter:
    """Posts KV path reports for one decode pod, rate-limited (see the module doc)."""

    target: Target | None
    last_rate: float | None = None
    last_slow: bool | None = None
    last_at: float = 0.0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def due(self, rate: float, slow: bool, now: float) -> bool:
        if self.last_rate is None or slow != self.last_slow or now - self.last_at >= REPOST_SECONDS:
            return True
        return not (self.last_rate / RATE_CHANGE_FACTOR <= rate <= self.last_rate * RATE_CHANGE_FACTOR)

    def report(
        self, message: str, *, rate: float, per_request: float, fabric: str, slow: bool, transport: str | None = None
    ) -> bool:
        """Write one report if due (the Lease, then the Event); True when the Lease took it (or, with no Lease
        configured, when the Event was created)."""
        if self.target is None:
            return False
        now = time.time()
        with self._lock:
            if not self.due(rate, slow, now):
                return False
            annotations = {
                c.ANNOTATION_KV_BYTES_PER_SECOND: f"{rate:.0f}",
                c.ANNOTATION_KV_BYTES_PER_REQUEST: f"{per_request:.0f}",
                c.ANNOTATION_KV_FABRIC: fabric,
                c.ANNOTATION_KV_BELOW_FLOOR: "true" if slow else "false",
            }
            report = {
                "uid": self.target.uid, "bytesPerSecond": round(rate), "bytesPerRequest": round(per_request),
                "fabric": fabric, "belowFloor": slow, "message": message[:1024], "observedTime": _stamp(now),
                "transport": transport,
            }  # fmt: skip
            stored = patch_report(self.target, report_patch(self.target, report))
            if self.target.lease is not None and stored != 200:
                log_event("kv_path_report_failed", level="warning", status=stored, server=self.target.server)
            body = event_body(self.target, "Warning" if slow else "Normal", message, annotations, now)
            status = post(self.target, body)
            if status != 201:
                log_event("kv_path_event_failed", level="warning", status=status, server=self.target.server)
            if (stored if self.target.lease is not None else status) not in (200, 201):
                return False
            self.last_rate, self.last_slow, self.last_at = rate, slow, now
        log_event("kv_path_event", pod=self.target.pod, type="Warning" if slow else "Normal")
        return True
