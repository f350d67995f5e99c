"""Projector from the pooled graph vector into the LLM's input-embedding space (paper III-C2, III-D1).

The output width is the loaded LLM's hidden size, read from its config by the caller, never a constant.
With ``normalize`` on, each graph token is layer-normalised to unit RMS and multiplied by a learned
scale, which the module initialises to the mean norm of the LLM's input embeddings: a fresh graph
token then has the norm of a word embedding at any hidden size (a plain MLP's output norm grows with
the width and means nothing to the frozen LLM).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def projector_mlp(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    """``Linear → GELU → Linear`` through ``hidden_dim`` (paper Eq. 7), or one ``Linear`` when ``hidden_dim`` is 0."""
    if hidden_dim == 0:
        return nn.Sequential(nn.Linear(in_dim, out_dim))
    return nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out_dim))


class GraphTokenProjector(nn.Module):
    """Two-layer MLP (one linear layer with ``hidden_dim`` 0) from the pooled graph vector to ``tokens`` vectors of the LLM's hidden size."""

    def __init__(self, in_dim: int, hidden_dim: int, llm_hidden_size: int, tokens: int, normalize: bool = True) -> None:
        super().__init__()
        self.tokens = tokens
        self.llm_hidden_size = llm_hidden_size
        self.mlp = projector_mlp(in_dim, hidden_dim, llm_hidden_size * tokens)
        self.norm = nn.LayerNorm(llm_hidden_size, elementwise_affine=False) if normalize else None
        self.scale = nn.Parameter(torch.ones(())) if normalize else None

    def set_scale(self, norm: float) -> None:
        """Set the learned scale (the LLM's mean input-embedding norm at initialisation); no-op without ``normalize``."""
        if self.scale is not None:
            with torch.no_grad():
                self.scale.fill_(norm)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """``(num_graphs, tokens, llm_hidden_size)`` graph-token embeddings."""
        tokens = self.mlp(pooled).view(pooled.shape[0], self.tokens, self.llm_hidden_size)
        if self.norm is None or self.scale is None:
            return tokens
        return self.scale * self.norm(tokens) / math.sqrt(self.llm_hidden_size)
