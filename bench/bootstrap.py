"""Paired bootstrap over questions: how far a difference between two rankings or variants could be chance."""

from __future__ import annotations

from typing import Any

import numpy as np


def paired_bootstrap(first: dict[str, float], second: dict[str, float], resamples: int, seed: int) -> dict[str, Any]:
    """Mean per-question difference ``first - second`` with a percentile bootstrap 95% interval over questions."""
    ids = sorted(set(first) & set(second))
    diff = np.array([first[q] - second[q] for q in ids])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(ids), size=(resamples, len(ids)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"questions": len(ids), "mean_difference": float(diff.mean()), "ci95": [float(low), float(high)],
            "share_of_resamples_above_0": float((means > 0).mean()), "resamples": resamples, "seed": seed}  # fmt: skip


def seed_interval(differences: list[float]) -> dict[str, Any]:
    """Mean, sample std and Student-t 95% interval of one difference measured once per seed: the spread a new training
    run would show, which a bootstrap over the questions of seed-averaged scores does not see."""
    from scipy import stats

    values = np.asarray(differences, float)
    mean, std = float(values.mean()), float(values.std(ddof=1))
    half = float(stats.t.ppf(0.975, len(values) - 1)) * std / np.sqrt(len(values))
    return {"seeds": len(values), "mean": mean, "std": std, "ci95": [mean - half, mean + half]}
