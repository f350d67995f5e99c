"""A call within a time budget: a thread runs it, and one still running past its budget is stopped, not left to run.

A model's files can hold code that runs in Python for minutes (a chat template is a Jinja program). The call runs in
a daemon thread; the caller waits at most the budget, then raises an asynchronous exception in that thread, which the
interpreter delivers at the thread's next bytecode, wherever the loop is (template, filter or library code). This
works from any calling thread (a signal alarm only in the main one) and costs a thread start per call (a process, the
one way to cut short a single C operation too, such as a huge integer power that holds the GIL, costs a fork). Such
an operation holds the GIL, so the caller too waits for it to return; the call is stopped then.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class OutOfTime(Exception):
    """The call ran past its budget; it has been stopped."""


class _Stop(BaseException):
    """Raised inside the worker to stop it: a BaseException, so that the call's own ``except Exception`` cannot catch it."""


def _checkpoint() -> None:
    """An empty Python call: entering it, the interpreter delivers any pending asynchronous exception."""


class _Worker(threading.Thread, Generic[T]):
    """Runs ``call`` once; ``finished`` is set under ``lock``, so the caller stops it only while it is inside ``run``'s ``try``."""

    def __init__(self, call: Callable[[], T]) -> None:
        super().__init__(name="time-budget", daemon=True)
        self.call = call
        self.lock = threading.Lock()
        self.finished = False
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            try:
                self.value = self.call()
            except _Stop:
                raise
            except BaseException as exc:  # the call's own failure, whatever it is, is the caller's to see
                self.error = exc
            with self.lock:
                self.finished = True
            _checkpoint()  # a stop sent before ``finished`` was set arrives here at the latest, still inside the try
        except _Stop:
            pass


def run_within(call: Callable[[], T], budget_s: float) -> T:
    """``call()``'s value (or its exception) if it returns within ``budget_s`` seconds; else it is stopped and :class:`OutOfTime` raised."""
    worker: _Worker[T] = _Worker(call)
    worker.start()
    worker.join(budget_s)
    with worker.lock:
        if not worker.finished:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(_Stop))
            raise OutOfTime(f"still running after its {budget_s:g} s budget")
    if worker.error is not None:
        raise worker.error
    return worker.value  # type: ignore[return-value]  (set: the call returned)
