"""Stand-in for vLLM's OpenAI server in runtime tests (TEST CODE, never shipped). Stdlib only.

Accepts `vllm serve`-style arguments (`MODEL --port N ...`; unknown vLLM flags are ignored) so `launch` can start
it through HPD_VLLM_COMMAND exactly as it starts vLLM, plus its own knobs:

  --health-delay S        do not listen for S seconds (vLLM refuses connections until the engine is up)
  --completion-delay S    sleep S before answering each /v1/completions
  --fail MODE             completions: 500 on /v1/completions; bad-request: 400; no-kv-params: prefill answers
                          without kv_transfer_params
  --on-term ACTION        exit (default: exit with --term-exit-code) | kill (SIGKILL itself) | ignore
  --term-exit-code N      exit status after SIGTERM/SIGINT (default 0)
  --signal-file PATH      append the name of every SIGTERM/SIGINT received
  --pd-output MODE        what a decode request carrying prefill's kv_transfer_params returns: ok (the local
                          answer, logprobs shifted by 0.01), wrong-tokens (other ids, logprobs 3 nats lower), nan
                          (NaN logprobs), no-transfer (ok, but cached_tokens 0), nan-http-400 (what vLLM 0.20 answered
                          on the H200 when a P->D answer had NaN logprobs); also POST /_control {"pd_output"}
  --enable-prompt-tokens-details   report usage.prompt_tokens_details.cached_tokens, like vLLM
  --token-delay S         streaming: sleep S between generated tokens (a decode step)
  --generation G          the generation (docs/rollouts.md) this engine belongs to: prefill names it in the
                          kv_transfer_params it returns (remote_engine_id `fake-engine-G-PORT`); every answer says
                          `system_fingerprint: "prefill=P decode=G"` (P: the prefill's generation, `none` without a
                          transfer); a decode given KV from another generation answers as a layout mismatch would
                          (wrong-tokens: other ids, logprobs 3 nats lower), so its pair check refuses that pair

Prompts are token ids, or text in the bench word tokenizer's form (bench/gpu/word_tokenizer.py: `tN` is token N), as
`vllm bench serve --dataset-name random` sends them. `"stream": true` answers as vLLM does: server-sent events, one
`text_completion` chunk per token, a usage chunk when `stream_options.include_usage`, then `data: [DONE]`.

Endpoints: GET /health, POST /v1/completions (kv_transfer_params in and out, like vLLM 0.20 with NIXL),
GET /_requests (everything recorded: path, X-Request-Id, body), GET /_env (argv + env), POST /_control
({"health": 500} flips /health; {"fail": "completions"|null}; {"metrics": {...}} see vllm_metrics.control),
GET /metrics (vLLM 0.20's metric names and labels, from vllm_metrics.py). Listens on --host and, like vLLM on
every address of its pod, on HPD_POD_IP when that is set and differs.
Shutdown as vLLM 0.20 (--shutdown-timeout: 0 aborts in-flight requests on SIGTERM, N finishes them and refuses new
ones); --hold-kv (prefill keeps each KV until decode reads GET /_kv/<id>), --pull-kv-delay S (decode reads it after S).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from vllm_metrics import VllmMetrics, role_of  # vLLM 0.20 /metrics (a sibling module)


class FakeVLLM:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.health = 200
        self.fail: str | None = ns.fail
        self.metrics = VllmMetrics(ns.model, role_of(sys.argv))
        self.pd_output: str = ns.pd_output
        self.inflight = 0
        self.held: set[str] = set()
        """--hold-kv: the remote_request_id of each prefill whose KV decode has not pulled yet."""
        self.shutting_down = False

    def begin(self) -> bool:
        """A request arrives: False once SIGTERM started vLLM's shutdown (it serves no new request then)."""
        with self.lock:
            if self.shutting_down:
                return False
            self.inflight += 1
            self.metrics.running.labels(**self.metrics.labels).set(self.inflight)
            return True

    def end(self) -> None:
        with self.lock:
            self.inflight -= 1
            self.metrics.running.labels(**self.metrics.labels).set(self.inflight)

    def hold(self, rid: str) -> None:
        with self.lock:
            self.held.add(rid)
            self.metrics.kv_usage.labels(**self.metrics.labels).set(min(1.0, 0.01 * len(self.held)))

    def release(self, rid: str) -> bool:
        with self.lock:
            found = rid in self.held
            self.held.discard(rid)
            self.metrics.kv_usage.labels(**self.metrics.labels).set(min(1.0, 0.01 * len(self.held)))
            return found

    def pull_kv(self, kv: dict[str, Any]) -> bool:
        """--pull-kv-delay (decode): read the KV from the prefill that holds it, as NIXL does, after the delay."""
        time.sleep(self.ns.pull_kv_delay)
        url = f"http://{kv.get('remote_host')}:{kv.get('remote_port')}/_kv/{kv.get('remote_request_id')}"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def completion(self, body: dict[str, Any], request_id: str | None) -> tuple[int, dict[str, Any]]:
        if self.ns.completion_delay:
            time.sleep(self.ns.completion_delay)
        if self.fail == "completions":
            return 500, {"error": {"message": "fake engine failure", "code": 500}}
        if self.fail == "bad-request":
            return 400, {"error": {"message": "fake bad request", "code": 400}}
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = word_ids(prompt)
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt) or not prompt:
            return 400, {"error": {"message": "expected token ids or text", "code": 400}}
        n = int(body.get("max_tokens", 16))
        kv_in = body.get("kv_transfer_params")
        from_prefill = isinstance(kv_in, dict) and bool(kv_in.get("do_remote_prefill"))
        if from_prefill and self.pd_output == "nan-http-400":
            msg = "Out of range float values are not JSON compliant: nan"
            return 400, {"error": {"message": msg, "type": "BadRequestError", "param": None, "code": 400}}
        if from_prefill and self.ns.pull_kv_delay is not None and not self.pull_kv(kv_in):
            return 500, {"error": {"message": "KV load failed: the prefill holding it is gone", "code": 500}}
        source = prefill_generation(kv_in) if from_prefill else "none"
        mode = self.pd_output if from_prefill else "local"
        if from_prefill and self.ns.generation and source != self.ns.generation:
            mode = "wrong-tokens"  # KV written by another generation's engine: another layout, another model
        ids, lps = sampled(prompt, n, mode)
        resp: dict[str, Any] = {
            "id": f"cmpl-{request_id or uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length", "logprobs": None}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n},
            "kv_transfer_params": None,
        }
        if self.ns.generation:
            resp["system_fingerprint"] = f"prefill={source} decode={self.ns.generation}"
        if body.get("return_token_ids"):
            resp["choices"][0]["token_ids"] = ids
        if body.get("logprobs"):
            resp["choices"][0]["logprobs"] = {"tokens": [f"t{t}" for t in ids], "token_logprobs": lps}
        if self.ns.enable_prompt_tokens_details:
            cached = len(prompt) - 1 if from_prefill and self.pd_output != "no-transfer" else 0
            resp["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
        kv = body.get("kv_transfer_params")
        if isinstance(kv, dict) and kv.get("do_remote_decode") and self.fail != "no-kv-params":
            resp["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": [[1, 2, 3]],
                "remote_engine_id": f"fake-engine-{self.ns.generation}-{self.ns.port}"
                if self.ns.generation
                else f"fake-engine-{self.ns.port}",
                "remote_request_id": f"prefill-{request_id}",
                "remote_host": "127.0.0.1",
                "remote_port": 5600,
                "tp_size": 1,
            }
            if self.ns.hold_kv:  # decode reads it from here (GET /_kv/<id>) before it decodes
                resp["kv_transfer_params"].update(remote_host=self.ns.host, remote_port=self.ns.port)
                self.hold(f"prefill-{request_id}")
        return 200, resp


def prefill_generation(kv: Any) -> str:
    """The generation a prefill's kv_transfer_params come from (`fake-engine-G-PORT`), `unknown` otherwise."""
    engine = str((kv or {}).get("remote_engine_id") or "")
    parts = engine.split("-")
    return parts[2] if engine.startswith("fake-engine-") and len(parts) == 4 else "unknown"


def word_ids(text: str) -> list[int]:
    """The bench word tokenizer's encoding (bench/gpu/word_tokenizer.py): `tN` -> N, any other word -> 0 (`<unk>`)."""
    return [int(w[1:]) if w[:1] == "t" and w[1:].isdigit() else 0 for w in text.split()]


def stream_chunks(resp: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A completion answer as vLLM streams it: one chunk per token (the last carries finish_reason), then usage."""
    choice = resp["choices"][0]
    ids = choice.get("token_ids") or [0] * int(resp["usage"]["completion_tokens"])
    head = {k: resp[k] for k in ("id", "object", "created", "model", "system_fingerprint") if k in resp}
    out = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        c: dict[str, Any] = {"index": 0, "text": f" t{t}", "logprobs": None,
                             "finish_reason": "length" if last else None, "stop_reason": None}  # fmt: skip
        if "token_ids" in choice:
            c["token_ids"] = [t]
        out.append({**head, "choices": [c], "usage": None})
    if include_usage:
        out.append({**head, "choices": [], "usage": resp["usage"]})
    if resp.get("kv_transfer_params") is not None:
        out[-1]["kv_transfer_params"] = resp["kv_transfer_params"]
    return out


def sampled(prompt: list[int], n: int, mode: str) -> tuple[list[int], list[float]]:
    """Greedy token ids and their logprobs, a function of the prompt (so P->D and local can be compared)."""
    ids = [(sum(prompt) * 31 + 7 * i) % 997 + 3 for i in range(n)]
    lps = [-1.0 - 0.1 * i for i in range(n)]
    if mode in {"ok", "no-transfer"}:
        lps = [lp - 0.01 for lp in lps]
    elif mode == "wrong-tokens":
        ids, lps = [0] * n, [lp - 3.0 for lp in lps]
    elif mode == "nan":
        ids, lps = [0] * n, [float("nan")] * n
    return ids, lps


def make_handler(app: FakeVLLM) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"null")

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(app.health, {} if app.health == 200 else {"error": "unhealthy"})
            elif self.path == "/_requests":
                with app.lock:
                    self._send(200, list(app.requests))
            elif self.path == "/metrics":
                data = app.metrics.exposition()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif self.path.startswith("/_kv/"):
                found = app.release(self.path[len("/_kv/") :])
                self._send(200 if found else 404, {"released": found})
            elif self.path == "/_env":
                self._send(200, {"argv": sys.argv, "env": dict(os.environ), "pid": os.getpid()})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = self._body()
            if self.path == "/_control":
                if "health" in body:
                    app.health = int(body["health"])
                if "fail" in body:
                    app.fail = body["fail"]
                app.metrics.control(body.get("metrics") or {})
                if "pd_output" in body:
                    app.pd_output = body["pd_output"]
                self._send(200, {"health": app.health, "fail": app.fail, "pd_output": app.pd_output})
                return
            if self.path != "/v1/completions":
                self._send(404, {"error": "not found"})
                return
            if not app.begin():  # vLLM's server after SIGTERM: shutting down, no new request
                self._send(503, {"error": {"message": "server shutting down", "code": 503}})
                return
            try:
                self._completion(body)
            finally:
                app.end()

        def _completion(self, body: Any) -> None:
            rid = self.headers.get("X-Request-Id")
            with app.lock:
                app.requests.append({"path": self.path, "request_id": rid, "body": body, "t": time.monotonic()})
            t0 = time.monotonic()
            status, payload = app.completion(body, rid)
            if status == 200 and not app.metrics.record(
                int(payload["usage"]["prompt_tokens"]),
                int(body.get("max_tokens", 16)),
                body.get("kv_transfer_params"),
                time.monotonic() - t0,
            ):
                status, payload = 500, {"error": {"message": "KV load failed (injected NIXL failure)", "code": 500}}
            if status == 200 and body.get("stream"):
                self._stream(stream_chunks(payload, bool((body.get("stream_options") or {}).get("include_usage"))))
            else:
                self._send(status, payload)

        def _stream(self, chunks: list[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
            for i, ev in enumerate(events):
                if i and app.ns.token_delay and i < len(events) - 1:
                    time.sleep(app.ns.token_delay)
                self.wfile.write(f"{len(ev):x}\r\n".encode() + ev + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="fake-model")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--health-delay", type=float, default=0.0)
    p.add_argument("--completion-delay", type=float, default=0.0)
    p.add_argument("--fail", default=None, choices=["completions", "bad-request", "no-kv-params"])
    p.add_argument("--on-term", default="exit", choices=["exit", "kill", "ignore"])
    p.add_argument("--term-exit-code", type=int, default=0)
    p.add_argument("--signal-file", default=None)
    p.add_argument("--pd-output", default="ok", choices=["ok", "wrong-tokens", "nan", "no-transfer", "nan-http-400"])
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--token-delay", type=float, default=0.0)
    # vLLM 0.20's own flag (vllm/v1/engine/core.py _handle_shutdown): on SIGTERM, 0 aborts every in-flight request;
    # N > 0 serves no new request and finishes the in-flight ones for up to N seconds, then exits.
    p.add_argument("--shutdown-timeout", type=int, default=0)
    p.add_argument("--hold-kv", action="store_true", help="prefill: keep each request's KV until decode pulls it")
    p.add_argument("--pull-kv-delay", type=float, default=None, help="decode: pull the KV from prefill after this")
    p.add_argument("--generation", default=None)
    ns, _unknown = p.parse_known_args(argv)
    app_ref: list[FakeVLLM] = []

    def shutdown(app: FakeVLLM) -> None:
        deadline = time.monotonic() + ns.shutdown_timeout
        while time.monotonic() < deadline:
            with app.lock:
                if app.inflight == 0:
                    break
            time.sleep(0.05)
        os._exit(ns.term_exit_code)

    def on_signal(signum: int, _frame: object) -> None:
        if ns.signal_file:
            with open(ns.signal_file, "a") as f:
                f.write(signal.Signals(signum).name + "\n")
        if ns.on_term == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif ns.on_term == "exit" and ns.shutdown_timeout > 0 and app_ref:
            app_ref[0].shutting_down = True
            threading.Thread(target=shutdown, args=(app_ref[0],), daemon=True).start()
        elif ns.on_term == "exit":
            os._exit(ns.term_exit_code)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if ns.health_delay:
        time.sleep(ns.health_delay)
    app = FakeVLLM(ns)
    app_ref.append(app)
    http.server.ThreadingHTTPServer.request_queue_size = 64  # the warmup's batch step opens 16 connections at once
    # vLLM binds every address of its pod; a pod address other than --host (HPD_POD_IP, e.g. the GPU bench's second
    # decode pod on 127.0.0.2) is served too
    hosts = [ns.host, *([pod_ip] if (pod_ip := os.environ.get("HPD_POD_IP", "")) and pod_ip != ns.host else [])]
    servers = []
    for host in hosts:
        httpd = http.server.ThreadingHTTPServer((host, ns.port), make_handler(app))
        httpd.daemon_threads = True
        servers.append(httpd)
    for httpd in servers[1:]:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(f"fake vLLM listening on {', '.join(hosts)} port {ns.port}", flush=True)
    servers[0].serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
