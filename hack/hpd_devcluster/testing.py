"""Polling helpers for tests against the local control plane: deadlines, never fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_for(check: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.2, what: str = "condition") -> T:
    """Call `check` until it returns a truthy value (returned) or `timeout` passes (AssertionError naming `what`).

    Exceptions raised by `check` count as "not yet"; the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as exc:  # any failure means "not yet"; reported below
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what}; last result: {last!r}")
        time.sleep(interval)
