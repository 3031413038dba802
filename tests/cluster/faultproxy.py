"""A loopback reverse proxy in front of the local kube-apiserver that answers chosen requests with a chosen error.

Test-only. The operator under test talks plain HTTP to 127.0.0.1:<port>; the proxy forwards every request (watch
streams included, chunk by chunk) to the apiserver over TLS with the kubeconfig's client certificate, except the
requests a `Fault` matches, which it answers itself with a Kubernetes `Status` body, `count` times, then passes on.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


@dataclass
class Fault:
    """Answer `code` to the next `count` requests of `method` whose path matches `path` and whose Content-Type
    contains `content_type`."""

    code: int
    count: int
    method: str = "PATCH"
    path: str = r"/namespaces/"
    content_type: str = "application/apply-patch"
    message: str = "injected by the test's fault proxy"
    served: int = 0
    seen: list[str] = field(default_factory=list)

    def matches(self, request: web.Request) -> bool:
        return (
            self.served < self.count
            and request.method == self.method
            and re.search(self.path, request.path) is not None
            and self.content_type in request.headers.get("Content-Type", "")
        )

    def answer(self, request: web.Request) -> web.Response:
        self.served += 1
        self.seen.append(f"{request.method} {request.path}")
        reason = {403: "Forbidden", 409: "Conflict", 429: "TooManyRequests", 500: "InternalError"}.get(self.code, "")
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"{self.message} ({self.code})",
            "reason": reason,
            "code": self.code,
        }
        return web.json_response(status, status=self.code)


class FaultProxy:
    def __init__(self, kubeconfig: Path) -> None:
        cfg = yaml.safe_load(kubeconfig.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.upstream = str(cluster["server"]).rstrip("/")
        self.faults: list[Fault] = []
        self._dir = tempfile.TemporaryDirectory(prefix="faultproxy-")
        self._ssl = ssl.create_default_context(cafile=self._file(cluster, "certificate-authority"))
        self._ssl.load_cert_chain(self._file(user, "client-certificate"), self._file(user, "client-key"))
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._serve, name="faultproxy", daemon=True)

    def _file(self, section: dict[str, Any], key: str) -> str:
        if key in section:
            return str(section[key])
        path = Path(self._dir.name) / key
        path.write_bytes(base64.b64decode(section[f"{key}-data"]))
        return str(path)

    # --- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fault proxy did not start")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._dir.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that points at this proxy (plain HTTP on loopback, no credentials: the proxy has them)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            self._session = session
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)  # end open watch streams at once
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    # --- one request ---------------------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        for fault in self.faults:
            if fault.matches(request):
                return fault.answer(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        url = self.upstream + request.path_qs
        async with self._session.request(  # a body without Content-Type stays so (the apiserver reads it as JSON)
            request.method, url, headers=headers, data=body or None, ssl=self._ssl, skip_auto_headers={"Content-Type"}
        ) as upstream:
            out = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out


@contextmanager
def fault_proxy(kubeconfig: Path) -> Iterator[FaultProxy]:
    proxy = FaultProxy(kubeconfig).start()
    try:
        yield proxy
    finally:
        proxy.stop()
