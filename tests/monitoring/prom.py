"""A real Prometheus (Debian's `prometheus` package, installed by hack/prometheus.sh) on 127.0.0.1 for tests."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

LOOPBACK = "127.0.0.1"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is missing: run hack/prometheus.sh (installs Debian's prometheus package)")
    return path


def promtool() -> str:
    return _binary("promtool")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def camel_to_snake(relabelings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A PodMonitor's relabelings as Prometheus relabel_configs (what the Prometheus Operator generates)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{keys.get(k, k): v for k, v in r.items()} for r in relabelings]


def pod_label_meta(label: str) -> str:
    """`__meta_kubernetes_pod_label_<label>` as Prometheus' pod discovery names it."""
    return "__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() else "_" for ch in label)


def pod_monitor_scrape_configs(monitor: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scrape jobs the Prometheus Operator generates for `monitor` (its generatePodMonitorConfig, v0.8x), with
    static loopback targets standing in for pod discovery. One job per podMetricsEndpoint, named
    `podMonitor/<ns>/<name>/<i>`, scraping the endpoint's `path` on the pod's port of that name; its target labels
    are set in the operator's order: `namespace`, `container`, `pod` from discovery, `job` = `<ns>/<name>`,
    `endpoint` = the port name, then the endpoint's own relabelings. Each pod: {"labels": {...}, "namespace",
    "pod", "container", "ports": {port name: loopback port}}."""
    md = monitor["metadata"]
    jobs = []
    for i, ep in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        targets = [
            {
                "targets": [f"{LOOPBACK}:{pod['ports'][ep['port']]}"],
                "labels": {
                    **{pod_label_meta(k): v for k, v in pod["labels"].items()},
                    "__meta_kubernetes_namespace": pod["namespace"],
                    "__meta_kubernetes_pod_name": pod["pod"],
                    "__meta_kubernetes_pod_container_name": pod["container"],
                },
            }
            for pod in pods
        ]
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{md['namespace']}/{md['name']}"},
            {"target_label": "endpoint", "replacement": ep["port"]},
            *camel_to_snake(ep.get("relabelings", [])),
        ]
        jobs.append(
            {
                "job_name": f"podMonitor/{md['namespace']}/{md['name']}/{i}",
                "metrics_path": ep.get("path", "/metrics"),
                "static_configs": targets,
                "relabel_configs": relabel,
            }
        )
    return jobs


class Prometheus:
    """`prometheus` with a generated config (static loopback targets), its own TSDB dir, stopped by `stop()`."""

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_files: list[Path] = ()) -> None:  # type: ignore[assignment]
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log = workdir / "prometheus.log"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": scrape_configs,
        }
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        with self.log.open("wb") as f:
            self.proc = subprocess.Popen(
                [
                    _binary("prometheus"),
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={workdir / 'tsdb'}",
                    f"--web.listen-address={LOOPBACK}:{self.port}",
                    "--web.enable-lifecycle",
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("prometheus exited:\n" + self.log.read_text(errors="replace")[-3000:])
            try:
                with _NO_PROXY.open(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        pytest.fail("prometheus not ready:\n" + self.log.read_text(errors="replace")[-3000:])

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET /api/v1/<path>; returns the decoded reply (errors too: status 'error', errorType, error)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with _NO_PROXY.open(url, timeout=30) as r:
                out: dict[str, Any] = json.loads(r.read())
        except urllib.error.HTTPError as e:
            out = json.loads(e.read())
        return out

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("query", query=expr)

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["data"]["activeTargets"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
