"""Reciprocal rank fusion (Cormack et al.): channels meet on rank positions, never on raw scores."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def reciprocal_rank_fusion(
    ranked: Mapping[str, Sequence[int]], *, kappa: int = 60, n: int = 100, weights: Mapping[str, float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Fuse ranked row lists: score(m) = Σ_lists w_list / (κ + rank(m)), ranks from 1; top ``n`` rows, best first.

    ``weights`` gives a list's weight w (1 when not named); a list of weight 0 is left out. Ties keep the
    order of first appearance across the lists in the given channel order, so the result is deterministic.
    """
    scores: dict[int, float] = {}
    for name, rows in ranked.items():
        weight = 1.0 if weights is None else weights.get(name, 1.0)
        if weight == 0:
            continue
        for rank, row in enumerate(rows, start=1):
            scores[int(row)] = scores.get(int(row), 0.0) + weight / (kappa + rank)
    order = sorted(scores, key=lambda row: -scores[row])[:n]
    return np.array(order, dtype=np.int64), np.array([scores[r] for r in order], dtype=np.float64)
