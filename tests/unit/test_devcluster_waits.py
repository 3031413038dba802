"""hpd_devcluster.testing: a wait that times out says what it last saw (the check's last result or exception, its
`show`, and every describer pushed with `describing`); one that succeeds returns the check's value."""

from __future__ import annotations

import pytest

from hpd_devcluster.testing import WaitTimeout, describing, wait_for


def test_the_value_is_returned_once_the_check_holds() -> None:
    calls = iter([None, [], {"ready": True}])
    assert wait_for(lambda: next(calls), 5, interval=0.01) == {"ready": True}


def test_a_timeout_names_what_and_the_last_result_and_show() -> None:
    with pytest.raises(WaitTimeout) as ei:
        wait_for(lambda: [], 0.05, interval=0.01, what="the pods", show=lambda: "3 Pending")
    text = str(ei.value)
    assert "waiting for the pods" in text and "last result: []" in text and "seen at the deadline: 3 Pending" in text


def test_the_last_exception_and_the_describers_are_in_the_message_and_a_failing_describer_says_so() -> None:
    def check() -> None:
        raise LookupError("not found: deployment x")

    def broken() -> str:
        raise RuntimeError("apiserver gone")

    with (
        describing(lambda: "--- namespace t-1 ---\nPod p: Pending"),
        describing(broken),
        pytest.raises(WaitTimeout) as ei,
    ):
        wait_for(check, 0.05, interval=0.01)
    text = str(ei.value)
    assert "LookupError: not found: deployment x" in text
    assert "Pod p: Pending" in text and "could not describe: RuntimeError: apiserver gone" in text
    with pytest.raises(WaitTimeout) as after:  # popped on leaving the with-blocks
        wait_for(lambda: False, 0.02, interval=0.01)
    assert "Pod p" not in str(after.value)
