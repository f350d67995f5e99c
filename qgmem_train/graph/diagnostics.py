"""Whether graph tokens vary with the question: a token that is the same for every question cannot carry it.

Over a split's questions: the mean pairwise cosine of the questions' graph tokens (each question's real tokens,
averaged), and the ratio of between-question variance to the tokens' total variance about zero (their mean
squared norm). A soft prompt scores cosine 1 and ratio 0; tokens that differ per question push the cosine down
and the ratio up (at most 1: tokens whose mean over the questions is zero and that never vary within a question).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def graph_token_diagnostics(per_question: Sequence[torch.Tensor]) -> dict[str, float]:
    """``cosine`` and ``between_variance_ratio`` of each question's ``(count, H)`` graph tokens (questions without tokens skipped)."""
    tokens = [t.detach().float().cpu() for t in per_question if t.shape[0]]
    if len(tokens) < 2:
        return {}
    means = torch.stack([t.mean(0) for t in tokens])
    unit = torch.nn.functional.normalize(means, dim=-1)
    n = len(tokens)
    cosine = float(((unit @ unit.T).sum() - n) / (n * (n - 1)))
    counts = torch.tensor([t.shape[0] for t in tokens], dtype=torch.float32)
    everything = torch.cat(tokens)
    grand = everything.mean(0)
    between = float((counts * (means - grand).pow(2).sum(-1)).sum() / counts.sum())
    total = float(everything.pow(2).sum(-1).mean())
    return {"cosine": cosine, "between_variance_ratio": between / total if total > 0 else 0.0}
