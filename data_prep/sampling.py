"""Deterministic, weighted sampling of test cases over categories (paper: 5:3:4 over 1,200 cases)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CaseRef:
    """Where one test case lives: its category, its file below the source root, and its position in that file."""

    category: str
    path: str
    index: int = 0

    @property
    def case_id(self) -> str:
        """Stable id used for resume, shards and splits (the path already names the category folder)."""
        return f"{self.path}#{self.index}"


def quotas(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Split ``total`` over categories by weight with the largest-remainder rule (sums to ``total``)."""
    if total < 0 or not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"need positive weights and a non-negative total, got {dict(weights)} and {total}")
    norm = sum(weights.values())
    exact = {c: total * w / norm for c, w in weights.items()}
    out = {c: int(v) for c, v in exact.items()}
    by_remainder = sorted(weights, key=lambda c: (-(exact[c] - out[c]), c))
    for category in by_remainder[: total - sum(out.values())]:
        out[category] += 1
    return out


def sample_cases(
    available: Mapping[str, Sequence[CaseRef]], weights: Mapping[str, float], total: int, seed: int
) -> tuple[list[CaseRef], dict[str, dict[str, int]]]:
    """Draw ``total`` cases by weight; the same inputs and seed always give the same list.

    Returns the drawn cases (category order, then draw order) and per-category counts
    ``{category: {"quota", "available", "drawn"}}`` for the manifest; a short category gives all it has.
    """
    missing = [c for c in weights if c not in available]
    if missing:
        raise KeyError(f"categories not found in the source: {missing} (found: {sorted(available)})")
    drawn: list[CaseRef] = []
    counts: dict[str, dict[str, int]] = {}
    for category, quota in quotas(weights, total).items():
        pool = sorted(available[category], key=lambda ref: ref.case_id)
        random.Random(f"{seed}:{category}").shuffle(pool)
        take = pool[:quota]
        drawn.extend(take)
        counts[category] = {"quota": quota, "available": len(pool), "drawn": len(take)}
    return drawn, counts


def shard_of(cases: Sequence[CaseRef], shard: int, num_shards: int) -> list[CaseRef]:
    """The deterministic slice of ``cases`` that shard ``shard`` of ``num_shards`` processes."""
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} is not in 0..{num_shards - 1}")
    return [case for i, case in enumerate(cases) if i % num_shards == shard]
