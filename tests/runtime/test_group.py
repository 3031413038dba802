"""A worker of a replica that spans nodes (hpd_runtime.group): it waits for its leader's rendezvous, runs vLLM's
headless ranks, sends no warmup, and is Ready while they run. Loopback only; every wait has a deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hpd_runtime import contract as c
from hpd_runtime import group
from hpd_runtime.config import ConfigError, load_config

from .conftest import LOOPBACK, free_port, http, wait_until
from .test_launch import launch  # noqa: F401  (the fixture)

WORKER_ARGS = ["--nnodes", "2", "--node-rank", "1", "--master-port", "{port}", "--headless"]


def worker_args(port: int) -> list[str]:
    return ["--master-addr", LOOPBACK, *(a.format(port=port) for a in WORKER_ARGS)]


@pytest.fixture
def listener() -> Iterator[Any]:
    """A TCP listener on 127.0.0.1 that the test opens when it wants: the leader's rendezvous."""
    socks: list[socket.socket] = []

    def open_on(port: int) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((LOOPBACK, port))
        s.listen(8)
        socks.append(s)

    yield open_on
    for s in socks:
        s.close()


def test_leader_address_comes_from_the_expanded_argv() -> None:
    assert group.leader_address(["--master-addr", "x-decode-0.x-decode-0.ns", "--master-port", "29501"]) == (
        "x-decode-0.x-decode-0.ns",
        29501,
    )
    assert group.leader_address(["--master-addr=h"]) == ("h", 29501)
    assert group.leader_address(["--nnodes", "2"]) is None


def test_wait_for_leader_reports_why_until_the_rendezvous_answers() -> None:
    answers = iter(["gaierror: [Errno -2] Name or service not known", "ConnectionRefusedError: refused", None])
    reports: list[str] = []
    ok = group.wait_for_leader(
        "x-decode-0.x-decode-0.ns", 29501, threading.Event(), reports.append, connect=lambda h, p: next(answers), poll=0
    )
    assert ok and len(reports) == 2
    assert reports[0].startswith(
        "waiting for the group leader's rendezvous at x-decode-0.x-decode-0.ns:29501 (gaierror"
    )


def test_wait_for_leader_stops_when_told() -> None:
    stop = threading.Event()
    stop.set()
    assert group.wait_for_leader("h", 1, stop, lambda _: None, connect=lambda h, p: "refused") is False


def test_group_role_is_leader_worker_or_unset() -> None:
    assert load_config({}).group_role is None and not load_config({}).worker
    assert load_config({c.ENV_GROUP_ROLE: "worker"}).worker
    assert not load_config({c.ENV_GROUP_ROLE: "leader"}).worker
    with pytest.raises(ConfigError, match=c.ENV_GROUP_ROLE):
        load_config({c.ENV_GROUP_ROLE: "follower"})


def test_a_worker_waits_for_its_leader_then_runs_headless_and_is_ready_without_a_warmup(
    launch: Any,  # noqa: F811
    listener: Any,
) -> None:
    port = free_port()
    ln = launch(*worker_args(port), **{c.ENV_GROUP_ROLE: c.GROUP_WORKER})

    def waiting() -> bool:
        code, text = http("GET", ln.runtime + c.PATH_READYZ, timeout=5)
        return code == 503 and f"waiting for the group leader's rendezvous at {LOOPBACK}:{port}" in text

    wait_until(waiting, timeout=30, what="/readyz says the worker waits for its leader")
    assert http("GET", ln.runtime + c.PATH_LIVEZ)[0] == 503  # no vLLM process yet
    assert ln.events("waiting_for_leader") and not ln.events("leader_reachable")
    listener(port)  # the leader's rank 0 opens the rendezvous
    ready = wait_until(lambda: ln.status(c.PATH_READYZ) == 200, timeout=60, what="the worker Ready")
    assert ready
    text = http("GET", ln.runtime + c.PATH_READYZ)[1]
    assert "headless ranks running (node rank 1 of 2)" in text, text
    assert ln.events("leader_reachable")
    # no warmup request is ever sent (a worker serves no API), held over a few of the warmup's polls
    wait_until(lambda: http("GET", ln.vllm + "/health")[0] == 200, timeout=30, what="the stand-in vLLM up")
    end = time.monotonic() + 2
    while time.monotonic() < end:
        assert ln.fake_requests() == [] and not ln.events("warmup_finished") and not ln.events("warmup_failed")
        time.sleep(0.2)


def test_a_worker_stopped_while_it_waits_exits_at_once_with_the_signal(launch: Any) -> None:  # noqa: F811
    import signal

    ln = launch(*worker_args(free_port()), **{c.ENV_GROUP_ROLE: c.GROUP_WORKER})
    wait_until(lambda: ln.events("waiting_for_leader"), timeout=30, what="the worker waiting")
    ln.proc.send_signal(signal.SIGTERM)
    assert ln.wait_exit(timeout=30) == 128 + signal.SIGTERM
