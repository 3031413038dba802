"""The runtime relays vLLM's /metrics on its own port (`/vllm/metrics`), bounded in size and time, and relays
nothing else: this is what lets the engines' NetworkPolicy keep Prometheus off vLLM's API port (issue #32 item 2).

A tiny in-process upstream stands in for vLLM's loopback API here; tests/runtime/test_launch.py drives the same path
end to end through `hpd_runtime launch` and the vLLM stand-in."""

from __future__ import annotations

import http.server as http_server
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from hpd_runtime import contract as c
from hpd_runtime.config import RuntimeConfig, load_config
from hpd_runtime.readiness import (
    ReadinessServer,
    RuntimeMetrics,
    RuntimeState,
    UpstreamError,
    fetch_vllm_metrics,
)

from .conftest import LOOPBACK, http

BODY = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 3.0\n'


@dataclass
class Upstream:
    """What the stand-in answers and what it was asked."""

    body: bytes = BODY
    status: int = 200
    delay: float = 0.0
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    seen: list[tuple[str, str]] = field(default_factory=list)
    port: int = 0


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()

    class Handler(http_server.BaseHTTPRequestHandler):
        def _any(self) -> None:
            up.seen.append((self.command, self.path))
            time.sleep(up.delay)
            self.send_response(up.status)
            self.send_header("Content-Type", up.content_type)
            self.send_header("Content-Length", str(len(up.body)))
            self.end_headers()
            self.wfile.write(up.body)

        do_GET = do_POST = _any

        def log_message(self, format: str, *args: object) -> None:
            pass

    srv = http_server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
    srv.daemon_threads = True
    up.port = srv.server_address[1]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield up
    srv.shutdown()
    srv.server_close()


def config(vllm_port: int) -> RuntimeConfig:
    env = {
        c.ENV_ROLE: "prefill",
        c.ENV_MODEL: "m",
        c.ENV_VLLM_VERSION: "0.20.0",
        c.ENV_VLLM_HOST: LOOPBACK,
        c.ENV_VLLM_PORT: str(vllm_port),
        c.ENV_RUNTIME_HOST: LOOPBACK,
        c.ENV_RUNTIME_PORT: "0",
    }
    return load_config(env, ["m"])


@pytest.fixture
def runtime(upstream: Upstream) -> Iterator[str]:
    cfg = config(upstream.port)
    server = ReadinessServer(RuntimeState(RuntimeMetrics()), cfg).start()
    yield f"http://{LOOPBACK}:{server.port}"
    server.stop()


def test_vllm_metrics_are_relayed_as_vllm_served_them(upstream: Upstream, runtime: str) -> None:
    status, text = http("GET", runtime + c.PATH_VLLM_METRICS)
    assert status == 200 and text.encode() == BODY
    assert upstream.seen == [("GET", c.PATH_METRICS)]


def test_only_get_of_the_one_path_reaches_vllm(upstream: Upstream, runtime: str) -> None:
    """No other path, method or query string goes through: completions cannot be reached via the runtime."""
    assert http("GET", runtime + c.PATH_VLLM_METRICS + "?target=/v1/completions")[0] == 200
    for method, path in (
        ("POST", c.PATH_VLLM_METRICS),
        ("POST", "/v1/completions"),
        ("PUT", c.PATH_VLLM_METRICS),
        ("DELETE", c.PATH_VLLM_METRICS),
    ):
        assert http(method, runtime + path, body={"prompt": "x"})[0] == 501, (method, path)
    for path in ("/v1/completions", "/v1/models", "/vllm/v1/completions", "/vllm/metrics/../v1/models", "/vllm/"):
        assert http("GET", runtime + path)[0] == 404, path
    assert upstream.seen == [("GET", c.PATH_METRICS)], "only the one GET /metrics reached vLLM, without the query"


def test_an_oversized_answer_is_refused_not_relayed(upstream: Upstream, runtime: str) -> None:
    cfg = config(upstream.port)
    upstream.body = b"x" * 2048
    with pytest.raises(UpstreamError, match="larger than 1024 bytes"):
        fetch_vllm_metrics(cfg, max_bytes=1024)
    assert fetch_vllm_metrics(cfg, max_bytes=2048)[0] == upstream.body


def test_a_slow_vllm_is_cut_off_at_the_timeout(upstream: Upstream) -> None:
    upstream.delay = 2.0
    t0 = time.monotonic()
    with pytest.raises(UpstreamError):
        fetch_vllm_metrics(config(upstream.port), timeout=0.3)
    assert time.monotonic() - t0 < 1.5


def test_vllm_errors_and_silence_become_502(upstream: Upstream, runtime: str) -> None:
    upstream.status = 500
    status, text = http("GET", runtime + c.PATH_VLLM_METRICS)
    assert status == 502 and "returned 500" in text
    gone = ReadinessServer(RuntimeState(RuntimeMetrics()), config(1)).start()  # nothing listens on port 1
    try:
        status, text = http("GET", f"http://{LOOPBACK}:{gone.port}{c.PATH_VLLM_METRICS}")
        assert status == 502 and c.PATH_METRICS in text
    finally:
        gone.stop()


def test_an_unexpected_content_type_is_not_passed_on(upstream: Upstream, runtime: str) -> None:
    upstream.content_type = "text/html"
    assert fetch_vllm_metrics(config(upstream.port))[1].startswith("text/plain")
