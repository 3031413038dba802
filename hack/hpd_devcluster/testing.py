"""Polling helpers for tests against the local control plane: deadlines, never fixed sleeps.

A wait that times out says what it last saw: the check's last result (or the exception it raised), what its `show`
callable describes then, and what every describer pushed with `describing` says (tests/cluster pushes one per test
that dumps the test's namespace: its CRs' conditions, workloads, pods and Events), so a failure explains itself."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_DESCRIBERS: list[Callable[[], object]] = []
"""What a timed-out wait also prints (innermost last), pushed and popped by `describing`."""

_MAX_REPR = 4000


class WaitTimeout(AssertionError):
    pass


@contextlib.contextmanager
def describing(describe: Callable[[], object]) -> Iterator[None]:
    """While inside, every wait that times out also prints `describe()` (a snapshot of what the test looks at)."""
    _DESCRIBERS.append(describe)
    try:
        yield
    finally:
        _DESCRIBERS.remove(describe)


def seen(describe: Callable[[], object]) -> str:
    """`describe()` as text for a failure message; a describer that fails says so instead of hiding the failure."""
    try:
        out = describe()
    except Exception as exc:  # the snapshot is an aid: its own failure must not replace the timeout
        return f"(could not describe: {type(exc).__name__}: {exc})"
    text = out if isinstance(out, str) else repr(out)
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR] + f" ... ({len(text) - _MAX_REPR} more characters)"


def timeout_message(what: str, timeout: float, checks: int, last: object, show: Callable[[], object] | None) -> str:
    last_text = f"{type(last).__name__}: {last}" if isinstance(last, BaseException) else seen(lambda: last)
    lines = [f"timed out after {timeout:.0f} s ({checks} checks) waiting for {what}; last result: {last_text}"]
    if show is not None:
        lines.append(f"seen at the deadline: {seen(show)}")
    lines += [seen(d) for d in _DESCRIBERS]
    return "\n".join(lines)


def wait_for(
    check: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str = "condition",
    show: Callable[[], object] | None = None,
) -> T:
    """Call `check` until it returns a truthy value (returned) or `timeout` passes (WaitTimeout naming `what`, with
    the last result, `show()` and the describers' snapshots: see the module's docstring).

    Exceptions raised by `check` count as "not yet"; the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    checks = 0
    while True:
        checks += 1
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as exc:  # any failure means "not yet"; reported below
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(timeout_message(what, timeout, checks, last, show))
        time.sleep(interval)


def kill_with_children(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `proc` and its direct children with their process groups: a launcher or container runner that starts
    its child in a session of its own (start_new_session) would otherwise leave that child running after the test."""
    for child in children(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)  # the child's session: its own children too
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)  # a child that leads no group of its own
    proc.kill()
    proc.wait(timeout=10)


def children(pid: int) -> list[int]:
    """The direct children of `pid` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out
