"""`python -m hpd_runtime launch|warmup|readiness`.

- `launch [--] VLLM_SERVE_ARGS...`: the container entrypoint (see `launcher`).
- `warmup`: run the warmup once against an already running vLLM and exit 0/1 (debugging).
- `readiness`: serve /readyz, /livez, /metrics for an already running vLLM (debugging; `--warmup` runs the
  warmup first, otherwise ready = vLLM /health).
- `drain`: the engine container's preStop hook (hpd_runtime.drain): not Ready at once, then wait for the router to
  drop the pod and for vLLM's in-flight work (and, on prefill, the KV decode has not pulled yet) before SIGTERM.
- `probe`: the exec startup/readiness probe: GET the local runtime's /readyz, print its reason, exit 0 when
  ready, 1 otherwise. The kubelet puts a failing exec probe's output into the pod's `Unhealthy` Event
  ("Readiness probe failed: <reason>"), which the operator copies into the DecodeReady/PrefillReady condition.
All read the same HPD_* env as `launch`.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from hpd_runtime.config import ConfigError, load_config
from hpd_runtime.log import log_event


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hpd_runtime", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "launch",
        help="start vLLM with keyed caches, warmup and the readiness server",
        description="python -m hpd_runtime launch [--] MODEL [vllm serve options...]",
    )
    w = sub.add_parser("warmup", help="warm up a running vLLM once (exit 0 on success)")
    w.add_argument("--health-timeout", type=float, default=600.0, help="seconds to wait for /health (default 600)")
    pr = sub.add_parser("probe", help="exec probe: print the runtime's /readyz reason, exit 0 when ready")
    pr.add_argument("--timeout", type=float, default=4.0, help="seconds to wait for /readyz (default 4)")
    sub.add_parser("drain", help="preStop: stop new work, wait for in-flight requests (and held KV) to finish")
    r = sub.add_parser("readiness", help="serve /readyz /livez /metrics for a running vLLM")
    r.add_argument("--warmup", action="store_true", help="run the warmup first (ready only after it)")
    return p


def _launch_args(argv: Sequence[str]) -> list[str]:
    rest = list(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    return rest


PROBE_OUTPUT_LIMIT = 1000
"""Characters of the reason printed (the kubelet keeps 10 KiB of probe output; an Event message is cut at 1 KiB)."""


def probe(env: Mapping[str, str], timeout: float) -> int:
    """GET http://127.0.0.1:<runtime port>/readyz; print the reason; 0 = ready. Stdlib only, no config parsing
    beyond the port (it runs every few seconds)."""
    from hpd_runtime import contract
    from hpd_runtime.http_client import RequestError, base_url, request

    port = env.get(contract.ENV_RUNTIME_PORT, "").strip() or str(contract.RUNTIME_PORT)
    try:
        resp = request("GET", base_url("127.0.0.1", int(port)) + contract.PATH_READYZ, timeout=timeout)
    except (RequestError, ValueError) as e:
        print(f"runtime readiness server not answering: {e}"[:PROBE_OUTPUT_LIMIT])
        return 1
    text = resp.body if isinstance(resp.body, str) else str(resp.body)
    print(text.strip()[:PROBE_OUTPUT_LIMIT])
    return 0 if resp.status == 200 else 1


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_in and args_in[0] == "launch" and not (len(args_in) > 1 and args_in[1] in ("-h", "--help")):
            from hpd_runtime.launcher import launch

            vllm_args = _launch_args(args_in[1:])
            if not vllm_args:
                print("launch: no vllm serve arguments given (expected: launch -- MODEL [options])", file=sys.stderr)
                return 2
            return launch(vllm_args)
        ns = _parser().parse_args(args_in)
        if ns.command == "launch":  # only reached for --help
            return 0
        if ns.command == "probe":
            return probe(os.environ, ns.timeout)
        if ns.command == "drain":
            from hpd_runtime.drain import drain

            return drain(os.environ)
        cfg = load_config(os.environ)
        from hpd_runtime.readiness import ReadinessServer, RuntimeMetrics, RuntimeState
        from hpd_runtime.warmup import Warmup

        state = RuntimeState(RuntimeMetrics())
        if ns.command == "warmup":
            ok = Warmup(cfg, state).run(health_give_up=time.monotonic() + ns.health_timeout)
            return 0 if ok else 1
        server = ReadinessServer(state, cfg).start()
        if ns.warmup:
            threading.Thread(target=Warmup(cfg, state).run, daemon=True).start()
        else:
            state.mark_warm("standalone readiness without warmup")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            server.stop()
        return 0
    except ConfigError as e:
        log_event("config_error", level="error", error=str(e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
