"""Stand-in engine metrics for the autoscaling tests: one loopback exporter per engine pod, scraped by a real
Prometheus, values driven by the test.

kwok's pods run nothing, so each engine pod of the CR gets a scrape target on 127.0.0.1 (one HTTP server, a path per
pod: `/metrics/<pod>`), written to Prometheus' file_sd as the pods come and go (a terminating pod is dropped, as a
pod's series stop when it exits). Each target carries the labels a PodMonitor of the operator gives an engine pod
(`namespace`, `pod`, `role`, `hybridpddeployment`), and serves vLLM 0.20's names for the autoscaling signals
(hpd_operator.api.signals). The test sets a role's *load* (its total waiting requests, KV cache in use, running
requests): each of the role's pods exports its share, so the sum the HPA divides by its target is the load, whatever
the replica count (scaling up spreads the load; it does not multiply it).
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

from kubernetes import client

from hpd_operator.api.signals import CR_LABEL, ROLE_LABEL, SIGNALS
from hpd_runtime import contract

GAUGES = ("waitingRequests", "kvCacheUsage", "runningRequests")


class EngineMetrics:
    def __init__(self, workdir: Path) -> None:
        self.sd_file = workdir / "engines.json"
        self.sd_file.write_text("[]")
        self.lock = threading.Lock()
        self.load: dict[tuple[str, str, str], dict[str, float]] = {}
        """(namespace, cr, role) -> signal -> total."""
        self.pods: dict[str, tuple[str, str, str]] = {}
        """pod name -> its (namespace, cr, role)."""
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def scrape_config(self) -> dict[str, Any]:
        return {"job_name": "engines", "file_sd_configs": [{"files": [str(self.sd_file)], "refresh_interval": "1s"}]}

    def set_load(self, ns: str, cr: str, role: str, **totals: float) -> None:
        with self.lock:
            self.load.setdefault((ns, cr, role), {}).update(totals)

    def sync(self, api: client.ApiClient, ns: str, cr: str) -> dict[str, int]:
        """Targets = the CR's live engine pods (not terminating); returns role -> pod count."""
        pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{contract.LABEL_INSTANCE}={cr}").items
        live = {}
        for p in pods:
            role = (p.metadata.labels or {}).get(contract.LABEL_COMPONENT)
            if role in contract.ROLES and p.metadata.deletion_timestamp is None:
                live[p.metadata.name] = (ns, cr, role)
        with self.lock:
            self.pods = {k: v for k, v in self.pods.items() if v[:2] != (ns, cr)} | live
            targets = [
                {"targets": [f"127.0.0.1:{self.port}"], "labels": {
                    "__metrics_path__": f"/metrics/{name}", "namespace": k[0], CR_LABEL: k[1], ROLE_LABEL: k[2],
                    "pod": name}}
                for name, k in sorted(self.pods.items())
            ]  # fmt: skip
        tmp = self.sd_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(targets))
        tmp.replace(self.sd_file)
        counts: dict[str, int] = {}
        for _, _, role in live.values():
            counts[role] = counts.get(role, 0) + 1
        return counts

    def _exposition(self, pod: str) -> bytes | None:
        with self.lock:
            key = self.pods.get(pod)
            if key is None:
                return None
            n = sum(1 for v in self.pods.values() if v == key)
            load = dict(self.load.get(key, {}))
        lines = []
        for signal in GAUGES:
            series = SIGNALS[signal].series  # type: ignore[index]
            lines += [f"# TYPE {series} gauge", f'{series}{{model_name="m",engine="0"}} {load.get(signal, 0.0) / n}']
        return ("\n".join(lines) + "\n").encode()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        metrics = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = metrics._exposition(self.path.rsplit("/", 1)[-1])
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
