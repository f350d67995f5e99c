"""Asynchronous adds of ``serve``: an add accepted with 202 runs on its namespace's write queue, and its state (queued,
running, done with the build's counts, or failed with the status and line a synchronous add would have answered) is
read back at its status URL."""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from typing import Any

KEPT_ADDS = 10_000
"""Add states kept in the server's memory, the oldest finished ones dropped first (a status lives as long as the process)."""


class AddStatuses:
    """The state of each asynchronous add, by namespace and an unguessable id."""

    def __init__(self, kept: int = KEPT_ADDS) -> None:
        self.kept = kept
        self._lock = threading.Lock()
        self._adds: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()

    def queued(self, namespace: str, session_id: str | None) -> str:
        """Record a new add of ``namespace`` as queued; return its id."""
        add_id = secrets.token_urlsafe(16)
        with self._lock:
            self._adds[namespace, add_id] = {"add_id": add_id, "namespace": namespace, "session_id": session_id, "state": "queued",
                                             "result": None, "status": None, "error": None}  # fmt: skip
            while len(self._adds) > self.kept:
                finished = next((key for key, add in self._adds.items() if add["state"] in ("done", "failed")), None)
                self._adds.pop(finished if finished is not None else next(iter(self._adds)))
        return add_id

    def update(self, namespace: str, add_id: str, **fields: Any) -> None:
        """Set fields of the add's state (``state`` and ``result``, or ``status`` and ``error``)."""
        with self._lock:
            if (namespace, add_id) in self._adds:
                self._adds[namespace, add_id].update(fields)

    def get(self, namespace: str, add_id: str) -> dict[str, Any] | None:
        """The add's state, or None when ``namespace`` has no add of that id (or it was dropped)."""
        with self._lock:
            add = self._adds.get((namespace, add_id))
            return dict(add) if add is not None else None
