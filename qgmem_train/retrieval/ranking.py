"""Top-n selection shared by the retrieval channels."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

TieBreak = Callable[[np.ndarray], np.ndarray]
"""Secondary key for rows with equal scores: rows in, one value per row out (higher first)."""


def top_n(scores: np.ndarray, n: int, tiebreak: TieBreak | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the ``n`` highest scores, best first, and their scores.

    Equal scores are ordered by ``tiebreak`` when given, else by row; every row tied at the cut is
    considered, so the result does not depend on how the partition splits ties.
    """
    n = min(n, scores.shape[0])
    if n <= 0:
        return np.zeros(0, np.int64), scores[:0]
    cut = np.partition(scores, scores.shape[0] - n)[scores.shape[0] - n]
    rows = np.flatnonzero(scores >= cut)
    secondary = -rows if tiebreak is None else tiebreak(rows)
    rows = rows[np.lexsort((-secondary, -scores[rows]))][:n]
    return rows.astype(np.int64), scores[rows]


def top_positive(scores: np.ndarray, n: int, tiebreak: TieBreak | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Like :func:`top_n`, keeping only rows whose score is above zero (a channel's actual matches)."""
    positive = np.flatnonzero(scores > 0)
    inner = None if tiebreak is None else (lambda rows: tiebreak(positive[rows]))
    rows, values = top_n(scores[positive], n, inner)
    return positive[rows], values
