"""What the studies share: paired bootstrap intervals over questions (how far a difference between two rankings or
variants could be chance), the t interval over seeds, and the commit a report was made at. The machine it ran on is
:mod:`bench.machine`, shared with the benchmarks."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
"""The repository, whose commit a report records."""


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


def git_state() -> dict[str, Any]:
    """The commit this runs from and how many tracked files differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty_files": 0}
    return {"commit": commit, "dirty_files": len(status.splitlines())}
