"""Minimal stdlib HTTP client for vLLM's API (health, completions). No proxies: every target is a pod or loopback."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from typing import Any

from hpd_runtime import contract as c

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    body: Any
    """Parsed JSON, or the raw text when the body is not JSON."""


class RequestError(Exception):
    """No HTTP response at all (connection refused, timeout, reset)."""


def base_url(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):  # IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _decode(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def request(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 5.0
) -> Response:
    """One HTTP request; HTTP error statuses are returned, transport errors raise RequestError."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with _OPENER.open(req, timeout=max(timeout, 0.001)) as resp:
            return Response(resp.status, _decode(resp.read()))
    except urllib.error.HTTPError as e:
        try:
            payload = _decode(e.read())
        finally:
            e.close()
        return Response(e.code, payload)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        reason = getattr(e, "reason", e)
        raise RequestError(f"{method} {url}: {reason}") from e


def health_status(host: str, port: int, timeout: float = 2.0) -> int | None:
    """vLLM `/health` status code, or None when nothing answered."""
    try:
        return request("GET", base_url(host, port) + c.PATH_VLLM_HEALTH, timeout=timeout).status
    except RequestError:
        return None
