"""The paper's readout (III-C2): the mean of a graph's node states, one vector that the projector maps to T tokens."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.data import Batch
from torch_geometric.nn import global_mean_pool


class MeanReadout(nn.Module):
    """Mean pool per graph (an empty graph pools to zeros): ``(B, 1, gnn_hidden)``, projected to ``tokens`` tokens."""

    def __init__(self, gnn_hidden: int, tokens: int) -> None:
        super().__init__()
        self.out_dim = gnn_hidden
        self.tokens_per_vector = tokens

    def forward(self, states: torch.Tensor, graph: Batch) -> tuple[torch.Tensor, None]:
        """One pooled vector per graph; every graph has the same token count, so no mask."""
        return global_mean_pool(states, graph.batch, size=graph.num_graphs)[:, None, :], None
