"""`run --max-backoff-seconds`: the cap of a CR's retry backoff (0.5 s doubling), 60 s unless set. The cluster tests
lower it (tests/cluster/test_write_loop.py) to watch several capped retry periods in seconds instead of minutes."""

from __future__ import annotations

import pytest
from kubernetes import client

from hpd_operator.__main__ import build_parser, config
from hpd_operator.controller import Capabilities, Controller


def delays(max_backoff: str | None, n: int) -> list[float]:
    """The first `n` retry delays of one CR key in the queue of the operator `run` would start with this flag."""
    args = ["run"] if max_backoff is None else ["run", "--max-backoff-seconds", max_backoff]
    ctl = Controller(
        client.ApiClient(), Capabilities(podmonitors=False, nodes=False), config(build_parser().parse_args(args))
    )
    try:
        return [ctl.queue.add_rate_limited(("ns", "cr")) for _ in range(n)]
    finally:
        ctl.queue.shutdown()


def test_the_default_cap_is_unchanged_for_users() -> None:
    assert build_parser().parse_args(["run"]).max_backoff_seconds == 60.0
    assert delays(None, 9) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


def test_a_lower_cap_caps_the_operators_retry_backoff() -> None:
    assert delays("2", 5) == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert delays("0.75", 3) == [0.5, 0.75, 0.75]


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "soon"])
def test_a_cap_that_is_no_positive_number_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--max-backoff-seconds", bad])
    assert "--max-backoff-seconds" in capsys.readouterr().err


def test_the_flag_is_documented_in_runs_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    assert "--max-backoff-seconds" in capsys.readouterr().out
