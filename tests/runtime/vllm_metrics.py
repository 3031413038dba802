"""vLLM 0.20's `/metrics` for the stand-in (TEST CODE): the exact names, types, labels and buckets of
`vllm/v1/metrics/loggers.py` (PrometheusStatLogger) and the NIXL connector's `NixlPromMetrics`, registered with
prometheus_client the way vLLM registers them (so `Counter("vllm:prompt_tokens")` is exposed as
`vllm:prompt_tokens_total`, histograms as `_bucket/_sum/_count`). Sources: shared/reference/monitoring-facts.

The role comes from `--kv-transfer-config` (kv_producer = prefill, kv_consumer = decode), as in vLLM; the NIXL
series exist only when a KV connector is configured. `control()` injects the P/D failure signals.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BASE = ["model_name", "engine"]
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 5)
POST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 5)
BYTES_BUCKETS = tuple(float(2**p) for p in range(11, 34, 2))
DESC_BUCKETS = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def role_of(argv: list[str]) -> str | None:
    """prefill / decode from vLLM's --kv-transfer-config JSON (None: no connector, colocated)."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--kv-transfer-config" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--kv-transfer-config="):
            value = arg.split("=", 1)[1]
        if value:
            kv_role = json.loads(value).get("kv_role")
            return {"kv_producer": "prefill", "kv_consumer": "decode"}.get(kv_role, "both")
    return None


class VllmMetrics:
    def __init__(self, model: str, role: str | None) -> None:
        self.role = role
        self.labels = {"model_name": model, "engine": "0"}
        self.nixl_fail = False
        r = self.registry = CollectorRegistry()

        def g(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, [*BASE, *extra], registry=r)

        def c(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*BASE, *extra], registry=r)

        def h(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, BASE, buckets=buckets, registry=r)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = g(
            "vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.", ("reason",)
        )
        self.kv_usage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = c("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",))
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = c("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = h(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS
        )
        self.queue = h("vllm:request_queue_time_seconds", "Time spent in WAITING phase for request.", LATENCY_BUCKETS)
        self.prefill_time = h("vllm:request_prefill_time_seconds", "Time spent in PREFILL phase.", LATENCY_BUCKETS)
        self.decode_time = h("vllm:request_decode_time_seconds", "Time spent in DECODE phase.", LATENCY_BUCKETS)
        for reason in ("capacity", "deferred"):
            self.waiting_by_reason.labels(**self.labels, reason=reason).set(0)
        for source in SOURCES:
            self.prompt_by_source.labels(**self.labels, source=source)
        for fr in FINISH_REASONS:
            self.success.labels(**self.labels, finished_reason=fr)
        for m in (self.running, self.waiting, self.kv_usage):
            m.labels(**self.labels).set(0)
        for m2 in (self.preemptions, self.prompt_tokens, self.generation_tokens):
            m2.labels(**self.labels)
        if role is not None:  # NixlPromMetrics: registered only with a KV connector, children created at init
            self.xfer_time = h(
                "vllm:nixl_xfer_time_seconds",
                "Histogram of transfer duration for NIXL KV Cache transfers.",
                XFER_BUCKETS,
            )
            self.post_time = h(
                "vllm:nixl_post_time_seconds",
                "Histogram of transfer post time for NIXL KV Cache transfers.",
                POST_BUCKETS,
            )
            self.bytes = h(
                "vllm:nixl_bytes_transferred",
                "Histogram of bytes transferred per NIXL KV Cache transfers.",
                BYTES_BUCKETS,
            )
            self.descs = h(
                "vllm:nixl_num_descriptors",
                "Histogram of number of descriptors per NIXL KV Cache transfers.",
                DESC_BUCKETS,
            )
            self.failed = c("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.")
            self.failed_notifs = c(
                "vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications."
            )
            self.expired = c("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire.")
            for m3 in (
                self.xfer_time,
                self.post_time,
                self.bytes,
                self.descs,
                self.failed,
                self.failed_notifs,
                self.expired,
            ):
                m3.labels(**self.labels)

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))

    def control(self, body: dict[str, Any]) -> None:
        """Inject P/D failure signals: {"nixl_fail": bool, "deferred": n, "kv_expired": n, "failed_notifications": n}."""
        if "nixl_fail" in body:
            self.nixl_fail = bool(body["nixl_fail"])
        if "deferred" in body:
            self.waiting_by_reason.labels(**self.labels, reason="deferred").set(int(body["deferred"]))
        if body.get("kv_expired") and self.role is not None:
            self.expired.labels(**self.labels).inc(int(body["kv_expired"]))
        if body.get("failed_notifications") and self.role is not None:
            self.failed_notifs.labels(**self.labels).inc(int(body["failed_notifications"]))

    def record(self, prompt_tokens: int, output_tokens: int, kv_params: Any, seconds: float) -> bool:
        """One finished /v1/completions. Returns False when the (injected) KV load failed: the request errors."""
        lb = self.labels
        remote_kv = isinstance(kv_params, dict) and bool(kv_params.get("do_remote_prefill"))
        if remote_kv and self.role is not None:
            if self.nixl_fail:
                self.failed.labels(**lb).inc()
                self.success.labels(**lb, finished_reason="error").inc()
                return False
            self.xfer_time.labels(**lb).observe(0.004 + 0.001 * prompt_tokens / 64)
            self.post_time.labels(**lb).observe(0.0005)
            self.bytes.labels(**lb).observe(float(prompt_tokens * 2 * 4096))
            self.descs.labels(**lb).observe(float(max(prompt_tokens // 16, 1)))
        self.prompt_tokens.labels(**lb).inc(prompt_tokens)
        source = "external_kv_transfer" if remote_kv else "local_compute"
        self.prompt_by_source.labels(**lb, source=source).inc(prompt_tokens)
        self.generation_tokens.labels(**lb).inc(output_tokens)
        self.success.labels(**lb, finished_reason="length").inc()
        self.ttft.labels(**lb).observe(seconds / 2)
        for _ in range(max(output_tokens - 1, 0)):
            self.itl.labels(**lb).observe(seconds / max(output_tokens, 1))
        self.e2e.labels(**lb).observe(seconds)
        self.queue.labels(**lb).observe(0.001)
        self.prefill_time.labels(**lb).observe(seconds / 2)
        self.decode_time.labels(**lb).observe(seconds / 2)
        self.kv_usage.labels(**lb).set(min(0.01 * prompt_tokens / 16, 0.9))
        return True
