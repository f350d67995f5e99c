"""Learning-rate schedule sized from the run's own length: linear warm-up, then cosine decay to a floor.

Warm-up is a fraction of the optimizer steps Lightning will take (``trainer.estimated_stepping_batches``),
so the rate reaches its peak and decays whether a run has 20 steps or 20,000, on 1 GPU or 16.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def warmup_cosine(total_steps: float, warmup_fraction: float, min_ratio: float) -> Callable[[int], float]:
    """Multiplier of the peak rate at each optimizer step (for ``LambdaLR``).

    Steps ``0 .. W-1`` rise linearly to 1 (``W = max(1, round(warmup_fraction × total_steps))``), the
    rest follow a half cosine from 1 down to ``min_ratio`` at the last step. An unbounded run
    (``total_steps`` infinite: no ``max_steps`` nor ``max_epochs``) warms up over ``W = 1`` and stays at 1.
    """
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
    if not 0 <= min_ratio <= 1:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
    if not math.isfinite(total_steps):
        return lambda step: 1.0
    total = max(int(total_steps), 1)
    warmup = max(1, round(warmup_fraction * total))
    decay = max(total - warmup, 1)

    def multiplier(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup + 1) / decay, 1.0)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier
