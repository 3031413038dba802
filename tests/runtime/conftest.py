"""Fixtures for runtime tests: free loopback ports, the vLLM stand-in as a subprocess, polling with deadlines."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

HERE = Path(__file__).resolve().parent
FAKE_VLLM = HERE / "fake_vllm.py"
REPO = HERE.parent.parent
LOOPBACK = "127.0.0.1"
T = TypeVar("T")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Poll until `predicate()` is truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def http(method: str, url: str, body: Any = None, timeout: float = 5.0) -> tuple[int, str]:
    """(status, text); status 0 when nothing answered."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with _NO_PROXY.open(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def get_json(url: str) -> Any:
    status, text = http("GET", url)
    assert status == 200, (url, status, text)
    return json.loads(text)


class Fake:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.port = proc, port
        self.url = f"http://{LOOPBACK}:{port}"

    def requests(self) -> list[dict[str, Any]]:
        return list(get_json(self.url + "/_requests"))

    def control(self, **kw: Any) -> None:
        status, text = http("POST", self.url + "/_control", kw)
        assert status == 200, text


@pytest.fixture
def start_fake() -> Iterator[Callable[..., Fake]]:
    """Start stand-in vLLM servers on free loopback ports; all are stopped at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, wait: bool = True) -> Fake:
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(FAKE_VLLM), "fake-model", "--port", str(port), *extra])
        procs.append(proc)
        fake = Fake(proc, port)
        if wait:
            wait_until(lambda: http("GET", fake.url + "/health", timeout=1)[0] == 200, what="fake vLLM /health")
        return fake

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
