"""The GPU check's timing: device time with CUDA events apart from host preparation, variants alternated over rounds.

A single fit per setting in a fixed order measures the machine's drift as much as the setting (two fits of one
setting differed by 40% on an H200), so every timed part runs its variants in turn for at least :data:`MIN_ROUNDS`
rounds in one process, the order reversed every other round (what runs first in a round is not always the same
variant), and takes its verdict from the rounds' paired ratios: a difference only where their mean is at least
:data:`MIN_EFFECT` from 1 and its 90% interval excludes 1 (:func:`compare`). ``bench/gpu_verdict_simulation.py``
measures the rule's error rates on simulated rounds with drift and an order effect.
"""

from __future__ import annotations

import math
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
    """Run each variant's ``steps`` timed steps (after ``warmup`` untimed ones) in turn, ``rounds`` times, in the given
    order in even rounds and the reverse order in odd ones.

    ``before_round(name)`` / ``after_round(name)`` run around each variant's round (outside its timed steps; e.g. to
    reset and read peak memory). Per variant: the median device and host milliseconds over all rounds and the median of
    each round (:func:`compare` turns two variants' into a ratio with its spread).
    """
    times: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in variants}
    for round_index in range(rounds):
        order = list(variants.items()) if round_index % 2 == 0 else list(variants.items())[::-1]
        for name, step in order:
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


MIN_ROUNDS = 5
"""Fewest rounds a verdict is given from: with 3, identical variants were called different in 10.7% of simulations."""
MIN_EFFECT = 0.05
"""Smallest device-time change called a difference (5%): a smaller one is not worth a claim on this evidence."""
T_95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753)
"""Student's t 95% quantiles (a two-sided 90% interval) for 1 to 15 degrees of freedom (the last is used beyond: a little wider)."""


def compare(summary: dict[str, Any], base: str, other: str, min_rounds: int = MIN_ROUNDS) -> dict[str, Any]:
    """``other`` over ``base`` in device time, from each round's paired ratio of medians: their geometric mean with its 90%
    interval, their median and range, and the verdict: ``difference`` when the mean is at least :data:`MIN_EFFECT` from 1
    and its interval excludes 1, ``no difference`` otherwise, ``too few rounds`` under ``min_rounds``."""
    a, b = summary[base]["device_ms_round_medians"], summary[other]["device_ms_round_medians"]
    per_round = [y / x for x, y in zip(a, b)]
    logs = [math.log(r) for r in per_round]
    mean = statistics.fmean(logs)
    half = T_95[min(len(logs) - 2, len(T_95) - 1)] * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    if len(per_round) < min_rounds:
        verdict = "too few rounds"
    elif abs(math.expm1(mean)) >= MIN_EFFECT and abs(mean) > half:
        verdict = "difference"
    else:
        verdict = "no difference"
    return {
        "base": base,
        "other": other,
        "ratio": math.exp(mean),
        "interval": [math.exp(mean - half), math.exp(mean + half)],
        "median_ratio": statistics.median(per_round),
        "per_round": per_round,
        "low": min(per_round),
        "high": max(per_round),
        "verdict": verdict,
        "min_effect": MIN_EFFECT,
        "min_rounds": min_rounds,
    }
