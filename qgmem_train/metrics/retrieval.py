"""Evidence-retrieval metrics over ranked memory units (paper IV-B4), judged on source turns.

A unit is relevant when one of its source turns is a gold evidence turn. For the top k units:

- Recall@k: share of gold turns covered by the source turns of the top k units;
- Precision@k: share of the k slots holding a relevant unit (a short list still divides by k);
- Sufficiency@k: 1 when every gold turn is covered, else 0;
- nDCG@k: binary relevance per unit, DCG = Σ rel_i / log2(i + 1), normalised by the ideal DCG of
  min(k, R) relevant units, R being the relevant units of the whole namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np


def relevance(sources: Sequence[Sequence[str]], gold: set[str]) -> list[bool]:
    """Whether each ranked unit (given by its source turn ids) covers a gold turn."""
    return [bool(gold.intersection(s)) for s in sources]


def recall_at_k(sources: Sequence[Sequence[str]], gold: set[str], k: int) -> float:
    """Share of gold turns covered by the source turns of the top ``k`` units."""
    if not gold:
        return 0.0
    covered = set().union(*map(set, sources[:k])) if sources[:k] else set()
    return len(gold & covered) / len(gold)


def precision_at_k(sources: Sequence[Sequence[str]], gold: set[str], k: int) -> float:
    """Share of the ``k`` slots holding a unit that covers a gold turn."""
    return sum(relevance(sources[:k], gold)) / k


def sufficiency_at_k(sources: Sequence[Sequence[str]], gold: set[str], k: int) -> float:
    """1.0 when the top ``k`` units cover every gold turn, else 0.0."""
    return float(bool(gold) and recall_at_k(sources, gold, k) == 1.0)


def ndcg_at_k(sources: Sequence[Sequence[str]], gold: set[str], k: int, n_relevant: int) -> float:
    """Binary-relevance nDCG@k; ``n_relevant`` is how many units of the namespace are relevant at all."""
    ideal = sum(1.0 / np.log2(i + 2) for i in range(min(k, n_relevant)))
    if ideal == 0:
        return 0.0
    gains = relevance(sources[:k], gold)
    return float(sum(1.0 / np.log2(i + 2) for i, rel in enumerate(gains) if rel) / ideal)


def question_metrics(sources: Sequence[Sequence[str]], gold: set[str], k: int, n_relevant: int) -> dict[str, float]:
    """All four metrics at ``k`` for one question, keyed ``recall@k`` etc."""
    return {
        f"recall@{k}": recall_at_k(sources, gold, k),
        f"precision@{k}": precision_at_k(sources, gold, k),
        f"sufficiency@{k}": sufficiency_at_k(sources, gold, k),
        f"ndcg@{k}": ndcg_at_k(sources, gold, k, n_relevant),
    }


def ranking_metrics(rankings: Mapping[str, Sequence[str]], sources: Mapping[str, Sequence[str]], gold: set[str], k: int) -> dict[str, float]:
    """:func:`question_metrics` of each named ranking of unit ids, keyed ``<name>/<metric>``.

    ``sources`` maps every unit of the namespace to its source turns: the relevant units nDCG counts are all of them, not only those ranked.
    """
    n_relevant = sum(relevance(list(sources.values()), gold))
    return {f"{name}/{key}": value for name, ranking in rankings.items()
            for key, value in question_metrics([sources[u] for u in ranking], gold, k, n_relevant).items()}


def recall_curve(sources: Sequence[Sequence[str]], gold: set[str], ks: Iterable[int]) -> list[float]:
    """Recall@k for each k in ``ks``."""
    return [recall_at_k(sources, gold, k) for k in ks]


def aggregate(records: Sequence[Mapping], keys: Sequence[str], group: str = "category") -> dict[str, float]:
    """Means of ``keys`` over all records, and per value of ``group`` as ``key/cat<value>``; plus ``n_questions``."""
    out: dict[str, float] = {"n_questions": len(records)}
    for key in keys:
        out[key] = float(np.mean([r[key] for r in records])) if records else 0.0
    for value in sorted({r[group] for r in records}):
        subset = [r for r in records if r[group] == value]
        for key in keys:
            out[f"{key}/cat{value}"] = float(np.mean([r[key] for r in subset]))
        out[f"n_questions/cat{value}"] = len(subset)
    return out
