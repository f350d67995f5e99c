"""run_within: a call's value or exception within its budget; past it, the call is stopped, not left running."""

from __future__ import annotations

import threading

import pytest

from qgmem_train.time_budget import OutOfTime, run_within


def test_a_call_within_its_budget_gives_its_value_or_its_exception() -> None:
    assert run_within(lambda: 6 * 7, 30.0) == 42
    failure = ValueError("the call's own")

    def fails() -> None:
        raise failure

    with pytest.raises(ValueError) as raised:
        run_within(fails, 30.0)
    assert raised.value is failure


def _forever_swallowing_exceptions() -> None:
    while True:
        try:
            sum(range(1000))
        except Exception:  # code that catches everything it knows of must still be stopped
            pass


def test_a_call_past_its_budget_is_stopped_not_left_running() -> None:
    before = set(threading.enumerate())
    with pytest.raises(OutOfTime, match="still running after its 0.05 s budget"):
        run_within(_forever_swallowing_exceptions, 0.05)
    [worker] = [t for t in threading.enumerate() if t not in before and t.name == "time-budget"] or [None]
    if worker is not None:
        worker.join(60.0)
        assert not worker.is_alive()
