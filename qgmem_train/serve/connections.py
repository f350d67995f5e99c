"""Connections of ``serve``: deadlines for a request's head and body, and a cap on open connections below the file limit.

uvicorn closes an idle keep-alive connection, but waits for ever on a client that connects and sends nothing, or
drips its headers or body a byte at a time: enough of them take every file descriptor and every other client then
times out. :func:`guarded_protocol` is uvicorn's HTTP/1.1 protocol with a deadline for each request's head (from the
connection, or the end of the previous response) and for its body (from the head), and a cap on open connections:
at the cap the connection waiting longest for a request head is closed to make room (one that is being answered
never is). Each closed connection is one warning line, at most one line per :data:`LOG_EVERY_S` seconds with a count.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("qgmem_train.serve")
LOG_EVERY_S = 10.0
RESERVED_FILES = 256
"""File descriptors kept for the store, the models and the log when the connection cap is derived from the file limit."""


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many connections may be open at once."""

    header_timeout_s: float = 10.0
    """Seconds from the connection (or the previous response) to a complete request head."""
    body_timeout_s: float = 30.0
    """Seconds from the request head to the end of its body."""
    max_connections: int | None = None
    """Most open connections; ``None``: the open-file limit less :data:`RESERVED_FILES` (at most 4096)."""

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        limit = open_file_limit()
        if self.max_connections is not None and not 1 <= self.max_connections < limit:
            raise ValueError(f"max_connections must be at least 1 and below the open-file limit {limit}, got {self.max_connections}")

    @property
    def connections(self) -> int:
        """The connection cap in force."""
        return self.max_connections or max(16, min(4096, open_file_limit() - RESERVED_FILES))


def open_file_limit() -> int:
    """This process's soft limit on open files."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Throttled:
    """A warning repeated at most once every ``every`` seconds, with how many times it happened since the last line."""

    def __init__(self, every: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self.last, self.count = float("-inf"), 0

    def note(self, message: str) -> None:
        self.count += 1
        now = self.clock()
        if now - self.last >= self.every:
            log.warning("%s (%d such connection(s) since the last line)", message, self.count)
            self.last, self.count = now, 0


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class enforcing ``limits`` (pass it as ``uvicorn.run(..., http=...)``)."""
    closed = Throttled()
    cap = limits.connections
    deadlines = {"head": limits.header_timeout_s, "body": limits.body_timeout_s}

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.phase: str | None = None
            self.waiting_since = 0.0
            self.deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > cap and not self._make_room():
                closed.note(f"refused a connection: {cap} open, each being answered")
                self.transport.abort()
                return
            self._follow_request()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._follow_request()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow_request()

        def connection_lost(self, exc: Exception | None) -> None:
            self._set_phase(None)
            super().connection_lost(exc)

        def _make_room(self) -> bool:
            """Close the connection waiting longest for a request head; False when every other one is being answered."""
            idle = [c for c in self.connections if isinstance(c, GuardedH11Protocol) and c is not self and c.phase == "head"]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c.waiting_since)
            closed.note(f"closed the connection waiting longest for a request: {cap} connections open")
            oldest.transport.abort()
            return True

        def _follow_request(self) -> None:
            """Arm the deadline of what the client owes now: a request head, the rest of a body, or nothing."""
            if self.transport.is_closing():
                return
            state = self.conn.their_state
            self._set_phase("head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None)

        def _set_phase(self, phase: str | None) -> None:
            if phase == self.phase:
                return
            if self.deadline is not None:
                self.deadline.cancel()
            self.phase, self.deadline = phase, None
            if phase is not None:
                self.waiting_since = self.loop.time()
                self.deadline = self.loop.call_later(deadlines[phase], self._expire, phase)

        def _expire(self, phase: str) -> None:
            if self.transport.is_closing():
                return
            closed.note(f"closed a connection whose request {phase} did not arrive within {deadlines[phase]:g} s")
            self.transport.close()

    return GuardedH11Protocol
