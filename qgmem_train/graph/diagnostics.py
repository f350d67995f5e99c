"""Whether graph tokens vary with the question: a token that is the same for every question cannot carry it.

Over a split's questions: the mean pairwise cosine of the questions' graph tokens (each question's real tokens,
averaged) after subtracting their mean over the questions (``cosine``, centred), the same cosine uncentred
(``raw_cosine``), and the ratio of between-question variance to the tokens' total variance about zero (their mean
squared norm). Uncentred, a component every question shares dominates: tokens that differ score 0.99 beside a large
shared part (step 2's linear arm: 0.9946). Centred, only what varies between questions counts: tokens that differ in
unrelated directions score near ``-1/(n-1)``, tokens that vary along one direction for most questions score near 1,
and a soft prompt (no variation at all) scores 1 by convention, with ratio 0. The ratio says how large the varying
part is (at most 1: tokens whose mean over the questions is zero and that never vary within a question).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def graph_token_diagnostics(per_question: Sequence[torch.Tensor]) -> dict[str, float]:
    """``cosine`` (centred), ``raw_cosine`` and ``between_variance_ratio`` of each question's ``(count, H)`` graph tokens
    (questions without tokens skipped)."""
    tokens = [t.detach().float().cpu() for t in per_question if t.shape[0]]
    if len(tokens) < 2:
        return {}
    means = torch.stack([t.mean(0) for t in tokens])
    centred = means - means.mean(0)
    varies = bool(centred.norm(dim=-1).max() > 1e-6 * means.norm(dim=-1).mean())
    counts = torch.tensor([t.shape[0] for t in tokens], dtype=torch.float32)
    everything = torch.cat(tokens)
    grand = everything.mean(0)
    between = float((counts * (means - grand).pow(2).sum(-1)).sum() / counts.sum())
    total = float(everything.pow(2).sum(-1).mean())
    return {
        "cosine": mean_pairwise_cosine(centred) if varies else 1.0,
        "raw_cosine": mean_pairwise_cosine(means),
        "between_variance_ratio": between / total if total > 0 else 0.0,
    }


def mean_pairwise_cosine(vectors: torch.Tensor) -> float:
    """Mean cosine over the distinct pairs of the rows of ``(n, H)`` ``vectors`` (a zero row counts 0 against any other)."""
    unit = torch.nn.functional.normalize(vectors, dim=-1)
    n = vectors.shape[0]
    return float(((unit @ unit.T).sum() - (unit.norm(dim=-1) ** 2).sum()) / (n * (n - 1)))
