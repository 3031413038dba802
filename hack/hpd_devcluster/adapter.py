"""prometheus-adapter against the local control plane: external.metrics.k8s.io for the HPA controller.

The kube-controller-manager's HPA controller reads external metrics through the apiserver's aggregation layer, which
proxies `/apis/external.metrics.k8s.io/v1beta1` to the Service an APIService names. Here nothing may connect outside
127.0.0.0/8, and the apiserver refuses loopback addresses in Endpoints/EndpointSlices (so neither a ClusterIP with
endpoints nor `--enable-aggregator-routing` can point at a process on this machine). What works without touching the
cluster's Service CIDR: an `ExternalName` Service whose name is `localhost`. The aggregator resolves such a Service
to `https://localhost:<APIService port>` (its ClusterIP resolver handles ExternalName; the availability check skips
endpoints for non-ClusterIP Services), and the adapter listens on 127.0.0.1 at that port with a serving cert for
`<service>.<namespace>.svc` from the cluster CA (the APIService's caBundle), trusting the aggregator's front-proxy
client cert (the apiserver's --proxy-client-cert-file, cluster.py) for the caller's identity. On a real cluster the
adapter is a pod behind a ClusterIP Service; the path from the HPA controller on is the same.

    adapter = start(state, prometheus_url, rules_file)   # waits until the APIService is Available
    ...
    stop(state, adapter)                                  # stops it and removes the APIService (discovery stays clean)
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpd_devcluster import build, pki
from hpd_devcluster.cluster import ClusterError, ClusterState, api

NAMESPACE = "hpd-metrics"
SERVICE = "prometheus-adapter"
GROUP, VERSION = "external.metrics.k8s.io", "v1beta1"
APISERVICE = f"{VERSION}.{GROUP}"


@dataclass
class Adapter:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure(state: ClusterState, path: str, body: dict[str, object]) -> None:
    """Create, or replace what an earlier run left (the port changes between runs)."""
    name = body["metadata"]["name"]  # type: ignore[index]
    with contextlib.suppress(urllib.error.HTTPError):
        api(state, "DELETE", f"{path}/{name}")
    api(state, "POST", path, body)


def _register(state: ClusterState, port: int) -> None:
    with contextlib.suppress(urllib.error.HTTPError):  # 409: exists
        api(state, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": NAMESPACE}})  # fmt: skip
    _ensure(state, f"/api/v1/namespaces/{NAMESPACE}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"name": "https", "port": port}]},
    })  # fmt: skip
    ca = base64.b64encode((state.pki / "ca.crt").read_bytes()).decode()
    _ensure(state, "/apis/apiregistration.k8s.io/v1/apiservices", {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
        "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 100, "versionPriority": 100,
                 "caBundle": ca, "service": {"namespace": NAMESPACE, "name": SERVICE, "port": port}},
    })  # fmt: skip


def _available(state: ClusterState) -> bool:
    try:
        svc = api(state, "GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
        api(state, "GET", f"/apis/{GROUP}/{VERSION}")
    except (urllib.error.URLError, OSError):
        return False
    conds = (svc.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conds)


def start(
    state: ClusterState, prometheus_url: str, rules_file: Path, relist: str = "2s", timeout: float = 90.0
) -> Adapter:
    """Run the adapter on 127.0.0.1 against `prometheus_url` with `rules_file` (its --config) and register it."""
    binary = build.ensure_binaries().prometheus_adapter
    port = _free_port()
    pki.add_server(state.pki, "metrics-adapter", (f"{SERVICE}.{NAMESPACE}.svc", "localhost"))
    kc, pk = state.kubeconfig, state.pki
    log = state.logs / "prometheus-adapter.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary), f"--prometheus-url={prometheus_url}", f"--config={rules_file}",
        f"--metrics-relist-interval={relist}", f"--secure-port={port}", "--bind-address=127.0.0.1",
        f"--tls-cert-file={pk / 'metrics-adapter.crt'}", f"--tls-private-key-file={pk / 'metrics-adapter.key'}",
        f"--lister-kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        f"--requestheader-client-ca-file={pk / 'ca.crt'}", f"--requestheader-allowed-names={pki.FRONT_PROXY_CN}",
        "--v=2",
    ]  # fmt: skip
    with log.open("ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
    adapter = Adapter(proc, port, log)
    try:
        _register(state, port)
        deadline = time.monotonic() + timeout
        while not _available(state):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError("prometheus-adapter Available", log, f"exit status {proc.poll()}")
            time.sleep(0.5)
    except BaseException:
        stop(state, adapter)
        raise
    return adapter


def stop(state: ClusterState, adapter: Adapter) -> None:
    """Remove the APIService first (an unavailable aggregated API would fail every client's discovery), then stop."""
    with contextlib.suppress(urllib.error.URLError, OSError):
        api(state, "DELETE", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
    if adapter.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(adapter.proc.pid, signal.SIGTERM)
        try:
            adapter.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(adapter.proc.pid, signal.SIGKILL)
            adapter.proc.wait(timeout=10)


@contextlib.contextmanager
def running(state: ClusterState, prometheus_url: str, rules_file: Path, relist: str = "2s") -> Iterator[Adapter]:
    adapter = start(state, prometheus_url, rules_file, relist)
    try:
        yield adapter
    finally:
        stop(state, adapter)
