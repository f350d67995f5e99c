"""Per-edge readout: one graph token per edge, in the order of the text path's ``[F#]`` facts, at most T per graph.

An edge's vector is its subject's and object's node states with its predicate feature, so each fact reaches the frozen
LLM as its own token and the LLM's attention picks what the question needs. Graphs have different edge counts:
the batch is padded to the longest (at most T) and masked; an empty graph has no tokens.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.data import Batch


class EdgeReadout(nn.Module):
    """``(B, min(T, most edges), 2 * gnn_hidden + feature_dim)`` edge vectors and their mask, the first T edges of each graph."""

    def __init__(self, gnn_hidden: int, feature_dim: int, tokens: int) -> None:
        super().__init__()
        self.out_dim = 2 * gnn_hidden + feature_dim
        self.tokens_per_vector = 1
        self.cap = tokens

    def forward(self, states: torch.Tensor, graph: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Edge vectors in edge order (Batch keeps each graph's edges contiguous and in order) and the ``(B, T_max)`` mask."""
        src, dst = graph.edge_index
        size = graph.num_graphs
        owner = graph.batch[src] if src.numel() else src
        counts = torch.bincount(owner, minlength=size)
        rank = torch.arange(src.numel(), device=src.device) - (counts.cumsum(0) - counts)[owner]
        keep = rank < self.cap
        width = int(min(self.cap, int(counts.max()) if size else 0))
        vectors = states.new_zeros(size, width, self.out_dim)
        mask = torch.zeros(size, width, dtype=torch.long, device=states.device)
        features = torch.cat([states[src[keep]], states[dst[keep]], graph.edge_attr[keep].to(states.dtype)], dim=1)
        vectors = vectors.index_put((owner[keep], rank[keep]), features)
        mask[owner[keep], rank[keep]] = 1
        return vectors, mask
