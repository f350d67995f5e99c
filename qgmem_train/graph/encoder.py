"""Relation-aware graph encoder (paper III-C2): message passing that reads edge (predicate) features.

TransformerConv layers attend over neighbours with the predicate embedding in keys and values, so
"Alice —moved to→ Paris" and "Alice —visited→ Paris" give different messages; mean pooling gives
one vector per graph. An empty graph (no activated units) pools to zeros.

Local-graph edges run subject → object and TransformerConv sends messages source → target, so a
subject-only node would never hear of its relations. With ``reverse_edges`` (the default) the encoder
adds, for every edge, the reversed edge object → subject carrying the inverse relation. The graphs
themselves stay one edge per unit (:mod:`qgmem_train.graph.local_graph`); the reversal happens here.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.data import Batch
from torch_geometric.nn import TransformerConv, global_mean_pool


class RelationalGraphEncoder(nn.Module):
    """``layers`` TransformerConv blocks reading edge features, LayerNorm + GELU between, mean pool (0 layers: the features).

    The inverse relation is the predicate embedding with a direction flag appended (0 forward,
    1 reversed), so ``edge_dim`` is the feature width plus one. Each layer's edge projection (a bias-free
    linear map) turns that flag column into its own learned inverse-direction vector in key/value space,
    initialised like the predicate columns: no extra module, no scale to choose for a separate
    inverse embedding, and a reversed edge never equals a forward one with the same predicate. With
    ``reverse_edges`` off, ``edge_dim`` is the feature width and the encoder is the one-way original.
    """

    def __init__(
        self, feature_dim: int, hidden_dim: int, layers: int, heads: int, dropout: float = 0.0, reverse_edges: bool = True
    ) -> None:
        """Build the message-passing stack.

        Args:
            feature_dim: width of node and edge (predicate) features.
            hidden_dim: width of every layer's output and of the pooled vector.
            layers: TransformerConv layers; 0 passes the node features through unchanged (frozen embedder features, pooled as
                they are: ``out_dim`` is then ``feature_dim``).
            heads: attention heads per layer (averaged, not concatenated).
            dropout: attention dropout.
            reverse_edges: also pass messages object → subject along each edge, flagged as the inverse relation.
        """
        super().__init__()
        if layers < 0:
            raise ValueError(f"the graph encoder needs 0 or more layers, not {layers}")
        self.reverse_edges = reverse_edges
        edge_dim = feature_dim + 1 if reverse_edges else feature_dim
        dims = [feature_dim] + [hidden_dim] * layers
        self.convs = nn.ModuleList(
            TransformerConv(dims[i], hidden_dim, heads=heads, concat=False, edge_dim=edge_dim, dropout=dropout)
            for i in range(layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_dim) for _ in range(layers - 1))
        self.out_dim = hidden_dim if layers else feature_dim

    def message_edges(self, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The edges messages travel along: the graph's own, plus reversed and flagged ones with ``reverse_edges``."""
        if not self.reverse_edges:
            return edge_index, edge_attr
        forward = torch.cat([edge_attr, edge_attr.new_zeros(edge_attr.shape[0], 1)], dim=1)
        inverse = torch.cat([edge_attr, edge_attr.new_ones(edge_attr.shape[0], 1)], dim=1)
        return torch.cat([edge_index, edge_index.flip(0)], dim=1), torch.cat([forward, inverse])

    def node_states(self, graph: Batch) -> torch.Tensor:
        """The last layer's ``(num_nodes, hidden_dim)`` node representations of a batch of graphs."""
        x = graph.x
        edge_index, edge_attr = self.message_edges(graph.edge_index, graph.edge_attr)
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, edge_attr)
            if i < len(self.norms):
                x = nn.functional.gelu(self.norms[i](x))
        return x

    def forward(self, graph: Batch) -> torch.Tensor:
        """One ``hidden_dim`` vector per graph of the batch: ``(num_graphs, hidden_dim)``."""
        return global_mean_pool(self.node_states(graph), graph.batch, size=graph.num_graphs)
