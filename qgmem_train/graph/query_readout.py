"""Query-aware readout (after LGPT, arXiv 2501.17549): T learned pooling queries, each shifted by the question's embedding.

Each query attends over the graph's node states (one head, scaled dot product), so which facts a token carries
depends on the question (early query fusion). The question enters only through the attention weights: an empty
graph pools to zeros whatever the question, so the same module on empty graphs is a soft prompt of T tokens.
The question's embedding is the retrieval embedder's (``question_embedding`` of the graph batch, set by the data module).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch_geometric.data import Batch
from torch_geometric.utils import to_dense_batch


class QueryReadout(nn.Module):
    """``(B, T, gnn_hidden)`` attention pools of node states, queries = learned tokens + a projection of the question."""

    def __init__(self, gnn_hidden: int, feature_dim: int, tokens: int) -> None:
        super().__init__()
        self.out_dim = gnn_hidden
        self.tokens_per_vector = 1
        self.queries = nn.Parameter(torch.randn(tokens, gnn_hidden) / math.sqrt(gnn_hidden))
        self.question = nn.Linear(feature_dim, gnn_hidden)
        self.key = nn.Linear(gnn_hidden, gnn_hidden, bias=False)

    def forward(self, states: torch.Tensor, graph: Batch) -> tuple[torch.Tensor, None]:
        """T pooled vectors per graph; every graph has T, so no mask."""
        question = getattr(graph, "question_embedding", None)
        if question is None:
            raise ValueError("the query readout needs the question's embedding on the graph batch (graph_to_data(..., question=...))")
        queries = self.queries[None] + self.question(question.to(states.dtype))[:, None, :]
        nodes, present = to_dense_batch(states, graph.batch, batch_size=graph.num_graphs)
        scores = torch.einsum("bth,bnh->btn", queries, self.key(nodes)) / math.sqrt(states.shape[-1])
        scores = scores.masked_fill(~present[:, None, :], float("-inf")).masked_fill(~present.any(-1)[:, None, None], 0.0)
        weights = torch.softmax(scores, dim=-1) * present[:, None, :]  # a graph without nodes pools to zeros
        return torch.einsum("btn,bnh->bth", weights, nodes), None
