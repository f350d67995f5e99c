"""Relation-aware graph encoder (paper III-C2): message passing that reads edge (predicate) features.

TransformerConv layers attend over neighbours with the predicate embedding in keys and values, so
"Alice —moved to→ Paris" and "Alice —visited→ Paris" give different messages; mean pooling gives
one vector per graph. An empty graph (no activated units) pools to zeros.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.data import Batch
from torch_geometric.nn import TransformerConv, global_mean_pool


class RelationalGraphEncoder(nn.Module):
    """``layers`` TransformerConv blocks (edge_dim = feature width), LayerNorm + GELU between, mean pool."""

    def __init__(self, feature_dim: int, hidden_dim: int, layers: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError("the graph encoder needs at least one layer")
        dims = [feature_dim] + [hidden_dim] * layers
        self.convs = nn.ModuleList(
            TransformerConv(dims[i], hidden_dim, heads=heads, concat=False, edge_dim=feature_dim, dropout=dropout)
            for i in range(layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_dim) for _ in range(layers - 1))
        self.out_dim = hidden_dim

    def forward(self, graph: Batch) -> torch.Tensor:
        """One ``hidden_dim`` vector per graph of the batch: ``(num_graphs, hidden_dim)``."""
        x, edge_index, edge_attr = graph.x, graph.edge_index, graph.edge_attr
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, edge_attr)
            if i < len(self.norms):
                x = nn.functional.gelu(self.norms[i](x))
        return global_mean_pool(x, graph.batch, size=graph.num_graphs)

