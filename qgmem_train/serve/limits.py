"""Bounds of ``serve``: request size, question length, session size, batch size, and each tenant's request rate
(an added session charged by its turns, so that one tenant's long adds cannot crowd out the others' searches)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one request (and one tenant per minute) may ask of the server."""

    max_body_bytes: int = 1 << 20
    """Largest request body; a larger one is refused with 413 before it is parsed."""
    max_question_chars: int = 2000
    """Longest question (search and ask)."""
    max_turns: int = 1000
    """Most turns in one added session."""
    rate_per_minute: float = 600.0
    """Requests a tenant may make per minute, on average."""
    burst: int = 60
    """Requests a tenant may make at once before the rate applies."""
    max_batch: int = 8
    """Most concurrent asks answered in one generate call."""
    turns_per_request: int = 10
    """An added session costs its tenant one request per this many turns (at least one, at most ``burst``)."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_question_chars", "max_turns", "burst", "max_batch", "turns_per_request"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.rate_per_minute <= 0:
            raise ValueError(f"rate_per_minute must be positive, got {self.rate_per_minute}")

    def add_cost(self, turns: int) -> float:
        """Requests an added session of ``turns`` turns costs its tenant."""
        return float(min(self.burst, max(1, math.ceil(turns / self.turns_per_request))))


class RateLimiter:
    """A token bucket per tenant: ``burst`` requests at once, refilled at ``rate_per_minute``."""

    def __init__(self, rate_per_minute: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_minute / 60.0
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, tenant: str, cost: float = 1.0) -> float:
        """Spend ``cost`` requests (at most ``burst``) of ``tenant``: 0 when allowed, else the seconds until they are."""
        cost = min(cost, float(self.burst))
        with self._lock:
            now = self._clock()
            tokens, then = self._buckets.get(tenant, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            if tokens >= cost:
                self._buckets[tenant] = (tokens - cost, now)
                return 0.0
            self._buckets[tenant] = (tokens, now)
            return (cost - tokens) / self.rate
