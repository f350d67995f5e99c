"""The GPU check's timing: device time with CUDA events apart from host preparation, variants alternated over rounds.

A single fit per setting in a fixed order measures the machine's drift as much as the setting (two fits of one
setting differed by 40% on an H200), so every timed part runs its variants in turn for several rounds in one
process and reports a ratio with its spread across rounds, or "within noise" where the rounds overlap.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

Step = Callable[[int], tuple[float, float]]
"""One timed step of a variant: ``step(seed) -> (host_ms, device_ms)``."""


class DeviceClock:
    """Milliseconds of device work between ``start()`` and ``stop()``: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda = cuda
        self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        self._wall = 0.0

    def start(self) -> None:
        if self._events:
            self._events[0].record()
        else:
            self._wall = time.perf_counter()

    def stop(self) -> float:
        if self._events:
            import torch

            self._events[1].record()
            torch.cuda.synchronize()
            return float(self._events[0].elapsed_time(self._events[1]))
        return (time.perf_counter() - self._wall) * 1000


def autocast(cuda: bool) -> Any:
    """The timed steps' precision: bf16 autocast on a GPU (as ``precision="bf16-mixed"``), none on the CPU (smoke, fp32)."""
    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)


def alternate(
    variants: dict[str, Step], rounds: int, steps: int, warmup: int, before_round: Callable[[str], None] | None = None,
    after_round: Callable[[str], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run each variant's ``steps`` timed steps (after ``warmup`` untimed ones) in turn, ``rounds`` times.

    ``before_round(name)`` / ``after_round(name)`` run around each variant's round (outside its timed steps; e.g. to
    reset and read peak memory). Per variant: the median device and host milliseconds over all rounds and the median of
    each round (:func:`compare` turns two variants' into a ratio with its spread).
    """
    times: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, step in variants.items():
            if before_round is not None:
                before_round(name)
            for seed in range(warmup):
                step(seed)
            times[name].append([step(warmup + seed) for seed in range(steps)])
            if after_round is not None:
                after_round(name)
    summary: dict[str, Any] = {}
    for name, per_round in times.items():
        flat = [t for r in per_round for t in r]
        summary[name] = {
            "device_ms_median": statistics.median(d for _, d in flat),
            "host_ms_median": statistics.median(h for h, _ in flat),
            "device_ms_round_medians": [statistics.median(d for _, d in r) for r in per_round],
        }
    return summary


def compare(summary: dict[str, Any], base: str, other: str) -> dict[str, Any]:
    """``other`` over ``base`` in device time: each round's ratio of medians, the median of those and their range, and
    whether the two variants' round medians overlap (``within_noise``: then the rounds cannot tell the variants apart)."""
    a, b = summary[base]["device_ms_round_medians"], summary[other]["device_ms_round_medians"]
    per_round = [y / x for x, y in zip(a, b)]
    return {
        "base": base,
        "other": other,
        "ratio": statistics.median(per_round),
        "per_round": per_round,
        "low": min(per_round),
        "high": max(per_round),
        "within_noise": max(a) >= min(b) and max(b) >= min(a),
    }
