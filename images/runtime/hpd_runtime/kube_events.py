"""Decode's KV path report as an Event on its own pod (issue #26): the one call the runtime makes to the Kubernetes API.

The pair check and the canary measure the KV rate (`kvstats`); /readyz and the metrics carry it, and this module
posts it as a core/v1 Event about the decode pod, reason `KVPath` (Normal; Warning below the declared fabric's floor),
with the figures in annotations. `kubectl describe pod` shows it, and the operator, which watches Events of that
reason, puts the newest of the serving generation into the CR's `status.kvPath` and its DataPathVerified condition.

The pod's ServiceAccount (`<cr>-decode`, made by the operator) may only create Events in its namespace. Outside a
cluster (no token, no KUBERNETES_SERVICE_HOST, no HPD_POD_NAME) nothing is posted. A failed post is logged, never
raised: the report is a convenience, Ready does not depend on it.

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
    return Target(server, token, ca if os.path.exists(ca) else None, pod, ns, uid)


def event_body(t: Target, type_: str, message: str, annotations: Mapping[str, str], when: float) -> dict[str, Any]:
    """A core/v1 Event about the pod (pure)."""
    stamp = datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
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


def post(t: Target, body: Mapping[str, Any]) -> int:
    """POST the Event; the HTTP status (201 on success), 0 when the apiserver could not be reached."""
    with open(t.token_path, encoding="utf-8") as fh:
        token = fh.read().strip()
    ctx = ssl.create_default_context(cafile=t.ca_path) if t.ca_path else ssl.create_default_context()
    req = urllib.request.Request(
        f"{t.server}/api/v1/namespaces/{t.namespace}/events",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
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

    def report(self, message: str, *, rate: float, per_request: float, fabric: str, slow: bool) -> bool:
        """Post one report if due; True when an Event was created."""
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
            body = event_body(self.target, "Warning" if slow else "Normal", message, annotations, now)
            status = post(self.target, body)
            if status != 201:
                log_event("kv_path_event_failed", level="warning", status=status, server=self.target.server)
                return False
            self.last_rate, self.last_slow, self.last_at = rate, slow, now
        log_event("kv_path_event", pod=self.target.pod, type="Warning" if slow else "Normal")
        return True
