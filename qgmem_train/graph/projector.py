"""Projector from the pooled graph vector into the LLM's input-embedding space (paper III-C2, III-D1).

The output width is the loaded LLM's hidden size, read from its config by the caller, never a constant.
"""

from __future__ import annotations

import torch
from torch import nn


class GraphTokenProjector(nn.Module):
    """Two-layer MLP from the pooled graph vector to ``tokens`` vectors of the LLM's hidden size."""

    def __init__(self, in_dim: int, hidden_dim: int, llm_hidden_size: int, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.llm_hidden_size = llm_hidden_size
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, llm_hidden_size * tokens))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """``(num_graphs, tokens, llm_hidden_size)`` graph-token embeddings."""
        return self.mlp(pooled).view(pooled.shape[0], self.tokens, self.llm_hidden_size)
