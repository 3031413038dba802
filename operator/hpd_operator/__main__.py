"""`python -m hpd_operator <command>`: `render` (what would be applied) and `run` (the kopf operator)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hpd_operator import render

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from hpd_operator.settings import OperatorConfig

METRICS_PORT_FILE_HELP = (
    "serve the metrics on a port the OS picks (instead of --metrics-port) and write its number to FILE once bound: "
    "several operators on one host without a port race (tests)"
)


def add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hpd_operator import settings as s
    from hpd_operator.api import constants as c

    p = sub.add_parser("run", help="run the operator (cluster-wide, or only in --namespace NS ...)")
    p.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable); default: all"
    )
    p.add_argument("--metrics-port", type=int, default=s.METRICS_PORT_DEFAULT, help="Prometheus port; 0 = off")
    p.add_argument("--metrics-port-file", type=Path, default=None, metavar="FILE", help=METRICS_PORT_FILE_HELP)
    p.add_argument("--liveness-port", type=int, default=s.LIVENESS_PORT_DEFAULT, help="kopf /healthz port; 0 = off")
    _add_timer_flags(p)
    p.add_argument(
        "--workers", type=_positive, default=s.WORKERS_DEFAULT, help="reconcile worker threads (CRs converged at once)"
    )
    p.add_argument(
        "--vllm-image",
        default=c.VLLM_IMAGE_TEMPLATE,
        help="vLLM image of CRs that leave spec.image out; {version} becomes their spec.vllmVersion",
    )
    p.add_argument(
        "--vllm-image-digest",
        action="append",
        default=[],
        type=_digest,
        metavar="VERSION=sha256:...",
        help="pin the default vLLM image of VERSION ({version} in --vllm-image) to this digest (repeatable)",
    )
    p.add_argument(
        "--router-image", default=c.DEFAULT_ROUTER_IMAGE, help="router image of CRs that leave spec.router.image out"
    )
    p.add_argument(
        "--pod-monitor-label",
        action="append",
        default=[],
        type=_label,
        metavar="KEY=VALUE",
        help="label on every CR's PodMonitors, under the CR's spec.monitoring.labels (repeatable)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run)


def _add_timer_flags(p: argparse.ArgumentParser) -> None:
    """The operator's timers: the safety resync, the re-checks and the retry backoff's cap."""
    from hpd_operator import settings as s

    p.add_argument(
        "--resync-seconds",
        type=float,
        default=s.RESYNC_SECONDS_DEFAULT,
        help="safety resync: every CR is re-queued this often (changes are handled at once, from watches)",
    )
    p.add_argument(
        "--recheck-seconds",
        type=float,
        default=s.RECHECK_SECONDS_DEFAULT,
        help="re-queue a CR whose child name is held by an object the operator does not manage this often",
    )
    p.add_argument(
        "--not-scheduled-seconds",
        type=float,
        default=s.NOT_SCHEDULED_SECONDS_DEFAULT,
        help="a pod no scheduler has looked at for this long makes its role Degraded (NotScheduled)",
    )
    p.add_argument(
        "--max-backoff-seconds",
        type=_positive_seconds,
        default=s.MAX_BACKOFF_SECONDS_DEFAULT,
        help="cap of a CR's retry backoff (0.5 s doubling): one that does not converge is retried at least this often",
    )


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _positive_seconds(text: str) -> float:
    x = float(text)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return x


def _digest(text: str) -> tuple[str, str]:
    version, sep, digest = text.partition("=")
    if not sep or not version or re.fullmatch(r"sha256:[0-9a-f]{64}", digest) is None:
        raise argparse.ArgumentTypeError(f"expected VERSION=sha256:<64 hex digits>, got {text!r}")
    return version, digest


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def serve_metrics(port: int, port_file: Path | None) -> WSGIServer | None:
    """Start the Prometheus endpoint: on `port` (0 = off), or with `port_file` on a port the OS picks while binding
    (no free-then-bind race between several operators), whose number is then written to `port_file` (atomically:
    a reader sees no file or the whole number). Returns the server (None: off)."""
    from prometheus_client import start_http_server

    if port_file is None and not port:
        return None
    server, _ = start_http_server(0 if port_file is not None else port)
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(f"{server.server_port}\n")
        os.replace(tmp, port_file)
    return server


def config(ns: argparse.Namespace) -> OperatorConfig:
    """The operator's settings from `run`'s parsed arguments."""
    from hpd_operator import settings as s

    return s.OperatorConfig(
        namespaces=tuple(ns.namespace),
        metrics_port=ns.metrics_port,
        liveness_port=ns.liveness_port,
        resync_seconds=ns.resync_seconds,
        workers=ns.workers,
        recheck_seconds=ns.recheck_seconds,
        not_scheduled_seconds=ns.not_scheduled_seconds,
        max_backoff_seconds=ns.max_backoff_seconds,
        vllm_image=ns.vllm_image,
        vllm_image_digests=tuple(ns.vllm_image_digest),
        router_image=ns.router_image,
        pod_monitor_labels=tuple(ns.pod_monitor_label),
    )


def run(ns: argparse.Namespace) -> int:
    import kopf

    from hpd_operator import handlers

    cfg = config(ns)

    kopf.configure(verbose=ns.verbose)
    ctl = handlers.setup(cfg)  # the client, the one Controller, and every handler on it
    serve_metrics(ns.metrics_port, ns.metrics_port_file)
    kopf.run(
        standalone=True,
        clusterwide=not ns.namespace,
        namespaces=ns.namespace,
        liveness_endpoint=f"http://0.0.0.0:{ns.liveness_port}/healthz" if ns.liveness_port else None,
    )
    from hpd_operator import leaderworkerset

    # stopped itself to watch a kind installed after its start (LeaderWorkerSet): its Deployment restarts it
    return leaderworkerset.EXIT_RESTART if ctl.lws.restart_requested else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpd-operator", description="hybrid-pd-operator")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    render.add_parser(sub)
    add_run_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    code: int = ns.func(ns)
    return code


if __name__ == "__main__":
    sys.exit(main())
