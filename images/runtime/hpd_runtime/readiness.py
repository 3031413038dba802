"""Readiness server: `/readyz`, `/livez`, `/metrics` on the runtime port (stdlib http.server in a thread).

- `/readyz` is 200 only when the warmup finished (or is disabled) AND a live `GET /health` on vLLM answers 200
  within a short timeout; otherwise 503 with the reason as text.
- `/livez` is 200 while the vLLM child process is alive (standalone: while vLLM answers at all).
- `/identity` is `{"bootId": ..., "role": ..., "ready": ...}`: a new boot id = a new vLLM process (decode polls its prefill peers).
- `/metrics` serves this process's own prometheus-client registry (`hpd_runtime_*`).
- `/vllm/metrics` is vLLM's own `/metrics`, read from its loopback API at each GET (at most VLLM_METRICS_MAX_BYTES,
  within VLLM_METRICS_TIMEOUT_SECONDS; 502 when vLLM does not answer in time or answers more). Nothing else is
  forwarded: no other path, no query string, no request header, no method but GET (http.server answers 501 to the
  others). This is how Prometheus reads vLLM's metrics without being let through to vLLM's API port, where the
  same server also serves completions to anyone who reaches it (the engines' NetworkPolicy admits Prometheus on
  this port only).
- `POST /drain` (the preStop, `hpd_runtime drain`) turns `/readyz` 503 for good. It is accepted only from a loopback
  address, i.e. from inside the pod: the port is open to Prometheus' peer, a label any tenant can wear, and a drain
  takes a pod out of service. Any other POST is answered 501, as http.server answers every other method.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hpd_runtime import contract as c
from hpd_runtime.config import RuntimeConfig
from hpd_runtime.http_client import base_url, health_status
from hpd_runtime.log import log_event

HEALTH_TIMEOUT_SECONDS = 2.0
VLLM_METRICS_TIMEOUT_SECONDS = 5.0
"""Per read of vLLM's /metrics (connect and each socket read); below the PodMonitor's default 10 s scrape timeout."""
VLLM_METRICS_MAX_BYTES = 16 * 1024 * 1024
"""vLLM 0.20's /metrics is ~100-300 KiB (histograms per model and engine); a body over 16 MiB is refused, not relayed."""
_VLLM_CONTENT_TYPES = ("text/plain", "application/openmetrics-text")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class UpstreamError(Exception):
    """vLLM's /metrics could not be relayed (no answer, an error status, or too large)."""


def fetch_vllm_metrics(
    cfg: RuntimeConfig,
    *,
    timeout: float = VLLM_METRICS_TIMEOUT_SECONDS,
    max_bytes: int = VLLM_METRICS_MAX_BYTES,
) -> tuple[bytes, str]:
    """(body, content type) of vLLM's own /metrics on its loopback address; UpstreamError when it cannot be relayed."""
    url = base_url(cfg.vllm_host, cfg.vllm_port) + c.PATH_METRICS
    try:
        with _NO_PROXY.open(urllib.request.Request(url, method="GET"), timeout=timeout) as resp:
            body = resp.read(max_bytes + 1)
            ctype = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        e.close()
        raise UpstreamError(f"vLLM {c.PATH_METRICS} returned {e.code}") from e
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise UpstreamError(f"vLLM {c.PATH_METRICS}: {getattr(e, 'reason', e)}") from e
    if len(body) > max_bytes:
        raise UpstreamError(f"vLLM {c.PATH_METRICS} is larger than {max_bytes} bytes")
    if not ctype.startswith(_VLLM_CONTENT_TYPES) or len(ctype) > 200:
        ctype = CONTENT_TYPE_LATEST
    return body, ctype


class RuntimeMetrics:
    """The runtime's metrics, in their own registry (never the global one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._warmup(self.registry)
        self._pair(self.registry)
        self._kv_path(self.registry)

    def _warmup(self, r: CollectorRegistry) -> None:
        self.warmup_duration = Gauge(
            "hpd_runtime_warmup_duration_seconds",
            "Seconds from vLLM /health 200 to the end of the warmup (set when it finished or failed).",
            registry=r,
        )
        self.warmup_requests = Counter(
            "hpd_runtime_warmup_requests",
            "Warmup requests sent, by kind and outcome (ok, error).",
            ["kind", "outcome"],
            registry=r,
        )
        self.warmup_request_seconds = Histogram(
            "hpd_runtime_warmup_request_duration_seconds",
            "Duration of each warmup request by kind (the first ones include lazy compiles and autotune).",
            ["kind"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.warmup_completed = Gauge(
            "hpd_runtime_warmup_completed", "1 when the warmup finished successfully (or is disabled).", registry=r
        )
        self.warmup_failed = Gauge(
            "hpd_runtime_warmup_failed", "1 when the warmup failed or timed out (the pod stays not ready).", registry=r
        )
        self.ready = Gauge("hpd_runtime_ready", "1 when the last readiness evaluation was ready.", registry=r)
        self.start_to_ready = Gauge(
            "hpd_runtime_start_to_ready_seconds",
            "Seconds from runtime start to the first ready evaluation (load + warmup).",
            registry=r,
        )

    def _pair(self, r: CollectorRegistry) -> None:
        self.pair_checks = Counter(
            "hpd_runtime_pair_checks",
            "Decode pair checks (P->D output vs local) by result: ok, differs.",
            ["result"],
            registry=r,
        )
        self.pair_ok = Gauge(
            "hpd_runtime_pair_ok", "Decode: 1 while the last pair check with every prefill peer passed.", registry=r
        )
        self.pair_max_logprob_delta = Gauge(
            "hpd_runtime_pair_max_logprob_delta",
            "Decode: largest |top-1 logprob| difference P->D vs local in the last pair check (nats).",
            registry=r,
        )
        self.vllm_healthy = Gauge(
            "hpd_runtime_vllm_healthy", "1 when the last live check of vLLM /health returned 200.", registry=r
        )

    def _kv_path(self, r: CollectorRegistry) -> None:
        self.kv_bytes_per_second = Gauge(
            "hpd_runtime_kv_transfer_bytes_per_second",
            "Decode: the KV transfer rate measured in the last pair check or canary (bytes / NIXL transfer seconds).",
            ["fabric"],
            registry=r,
        )
        self.kv_bytes_per_request = Gauge(
            "hpd_runtime_kv_transfer_bytes_per_request",
            "Decode: KV bytes per transferred request in the last pair check or canary.",
            ["fabric"],
            registry=r,
        )
        self.kv_below_floor = Gauge(
            "hpd_runtime_kv_transfer_below_floor",
            "Decode: 1 when the last measured KV rate was below the floor of the declared fabric.",
            ["fabric"],
            registry=r,
        )
        self.kv_transport = Gauge(
            "hpd_runtime_kv_transport",
            "Decode: 1 for the transport UCX chose for its KV reads (its protocol table in vLLM's output): cuda_ipc, "
            "rdma, tcp emulation (P and D in separate PID namespaces on one node), or UCX's own words.",
            ["transport"],
            registry=r,
        )
        self.canary_checks = Counter(
            "hpd_runtime_canary_checks",
            "Decode: canary P->D round trips after Ready, by result (ok, differs, error).",
            ["result"],
            registry=r,
        )
        self.canary_last_success = Gauge(
            "hpd_runtime_canary_last_success_timestamp_seconds",
            "Decode: Unix time of the last canary that passed, per prefill peer.",
            ["prefill"],
            registry=r,
        )


class RuntimeState:
    """What the warmup thread and the HTTP handlers share. Thread-safe."""

    def __init__(self, metrics: RuntimeMetrics, child_alive: Callable[[], bool] | None = None) -> None:
        self.metrics = metrics
        self.started = time.monotonic()
        self._child_alive = child_alive
        self._lock = threading.Lock()
        self.phase = "starting"
        self.reason = "vLLM not healthy yet"
        self.warm = threading.Event()
        self.ready_at: float | None = None
        self.boot_id = uuid.uuid4().hex
        """Identifies this runtime process (= this vLLM process: `launch` exits with vLLM); decode peers poll it."""
        self._pair_fault: str | None = None
        self._kv_report: str | None = None
        self._kv_transport: str | None = None
        self.draining = threading.Event()
        """Set by POST /drain (the preStop): not Ready from then on, whatever else holds."""

    def set_pair_fault(self, reason: str | None) -> None:
        """Decode: why P->D is not trusted now (None = the pair checks pass)."""
        with self._lock:
            self._pair_fault = reason
        self.metrics.pair_ok.set(0 if reason else 1)

    def pair_fault(self) -> str | None:
        with self._lock:
            return self._pair_fault

    def set_kv_report(self, report: str) -> None:
        """Decode: what the last pair check or canary measured of the KV path (shown by /readyz when ready)."""
        with self._lock:
            self._kv_report = report

    def kv_report(self) -> str | None:
        with self._lock:
            return self._kv_report

    def set_kv_transport(self, transport: str | None) -> None:
        """Decode: the transport UCX chose for the KV reads, from its protocol table in vLLM's output
        (`ucx_transport`; the launcher reads it when UCX_PROTO_INFO is on), e.g. `cuda_ipc` or `tcp emulation`."""
        with self._lock:
            before, self._kv_transport = self._kv_transport, transport
        if before is not None and before != transport:
            self.metrics.kv_transport.remove(before)
        if transport is not None:
            self.metrics.kv_transport.labels(transport).set(1)

    def kv_transport(self) -> str | None:
        with self._lock:
            return self._kv_transport

    def set_phase(self, phase: str, reason: str) -> None:
        with self._lock:
            self.phase, self.reason = phase, reason

    def mark_warm(self, reason: str = "warmup finished") -> None:
        with self._lock:
            self.phase, self.reason = "warm", reason
        self.metrics.warmup_completed.set(1)
        self.metrics.warmup_failed.set(0)
        self.warm.set()

    def mark_failed(self, reason: str) -> None:
        with self._lock:
            self.phase, self.reason = "failed", reason
        self.metrics.warmup_failed.set(1)

    def snapshot(self) -> tuple[str, str]:
        with self._lock:
            return self.phase, self.reason

    def child_alive(self) -> bool | None:
        """True/False for a supervised child; None when standalone (no child)."""
        return None if self._child_alive is None else self._child_alive()

    def note_ready(self, ready: bool) -> None:
        self.metrics.ready.set(1 if ready else 0)
        if ready and self.ready_at is None:
            with self._lock:
                if self.ready_at is None:
                    self.ready_at = time.monotonic()
                    took = self.ready_at - self.started
                    self.metrics.start_to_ready.set(took)
                    log_event("ready", start_to_ready_seconds=round(took, 3))


def evaluate_readiness(state: RuntimeState, cfg: RuntimeConfig) -> tuple[bool, str]:
    """(ready, reason). Checks vLLM /health live every time, so a dead engine turns the pod not ready. A group's
    worker serves no API: ready while its headless ranks run (hpd_runtime.group)."""
    if cfg.worker:
        return _worker_readiness(state)
    if state.child_alive() is False:
        # vLLM exited: not Ready at once, without waiting for a connection to a port nothing listens on any more
        state.metrics.vllm_healthy.set(0)
        state.note_ready(False)
        return False, "vLLM process exited"
    status = health_status(cfg.vllm_host, cfg.vllm_port, timeout=HEALTH_TIMEOUT_SECONDS)
    state.metrics.vllm_healthy.set(1 if status == 200 else 0)
    if state.draining.is_set():
        ready, why = False, "draining: the pod is leaving (preStop), finishing in-flight requests"
    elif not state.warm.is_set():
        phase, reason = state.snapshot()
        ready, why = False, f"warmup {phase}: {reason}"
    elif (fault := state.pair_fault()) is not None:
        ready, why = False, fault
    elif status != 200:
        ready, why = False, f"vLLM {c.PATH_VLLM_HEALTH} returned {status if status is not None else 'no answer'}"
    else:
        kv = state.kv_report()
        ready, why = True, "ok" if kv is None else f"ok; {kv}"
    state.note_ready(ready)
    return ready, why


def _worker_readiness(state: RuntimeState) -> tuple[bool, str]:
    phase, reason = state.snapshot()
    if not state.warm.is_set():
        ready, why = False, f"{phase}: {reason}"
    elif state.child_alive() is False:
        ready, why = False, "vLLM's headless ranks exited"
    else:
        ready, why = True, f"ok; {reason}"
    state.note_ready(ready)
    return ready, why


def evaluate_liveness(state: RuntimeState, cfg: RuntimeConfig) -> tuple[bool, str]:
    alive = state.child_alive()
    if alive is None:  # standalone: liveness = vLLM answers at all
        status = health_status(cfg.vllm_host, cfg.vllm_port, timeout=HEALTH_TIMEOUT_SECONDS)
        return status is not None, f"vLLM {c.PATH_VLLM_HEALTH} answered {status}"
    return alive, "vLLM process alive" if alive else "vLLM process exited"


def from_inside_the_pod(client: str) -> bool:
    """Whether a request comes from a loopback address (the pod's own network namespace: its preStop), IPv4-mapped
    IPv6 included. Another pod, Prometheus or a node connects from a pod or node address, never from loopback."""
    try:
        addr = ipaddress.ip_address(client.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def mark_draining(state: RuntimeState, client: str) -> tuple[int, bytes]:
    """POST /drain: from inside the pod, not Ready from now on (200); from anywhere else, refused (403)."""
    if not from_inside_the_pod(client):
        return 403, b"drain is accepted from inside the pod only (its preStop)\n"
    if not state.draining.is_set():
        state.draining.set()
        log_event("draining")
    return 200, b"draining\n"


def _handler(state: RuntimeState, cfg: RuntimeConfig) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "hpd-runtime"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == c.PATH_READYZ:
                ok, why = evaluate_readiness(state, cfg)
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
            elif path == c.PATH_LIVEZ:
                ok, why = evaluate_liveness(state, cfg)
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
            elif path == c.PATH_IDENTITY:
                ready = state.warm.is_set() and state.pair_fault() is None
                body = json.dumps({"bootId": state.boot_id, "role": cfg.role, "ready": ready}).encode()
                self._send(200, body, "application/json")
            elif path == c.PATH_METRICS:
                evaluate_readiness(state, cfg)  # refresh the ready / vLLM health gauges for this scrape
                self._send(200, generate_latest(state.metrics.registry), CONTENT_TYPE_LATEST)
            elif path == c.PATH_VLLM_METRICS:
                try:
                    body, ctype = fetch_vllm_metrics(cfg)
                except UpstreamError as e:
                    self._send(502, (str(e) + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._send(200, body, ctype)
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != c.PATH_DRAIN:
                self.send_error(501, f"Unsupported method ({self.command!r})")
                return
            status, body = mark_draining(state, str(self.client_address[0]))
            self._send(status, body, "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown vLLM's log

    return Handler


class ReadinessServer:
    """The HTTP server on its own daemon thread. Binds in the constructor so a port clash fails early."""

    def __init__(self, state: RuntimeState, cfg: RuntimeConfig) -> None:
        self.httpd = http.server.ThreadingHTTPServer((cfg.runtime_host, cfg.runtime_port), _handler(state, cfg))
        self.httpd.daemon_threads = True
        self.port: int = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="hpd-readiness", daemon=True)

    def start(self) -> ReadinessServer:
        self._thread.start()
        log_event("readiness_server_started", host=self.httpd.server_address[0], port=self.port)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
