"""Graph readouts (``model.readout.kind``): from the encoder's node states to the vectors the projector maps to graph tokens.

Each readout returns ``(vectors, mask)``: ``vectors`` is ``(B, n, in_dim)`` and the projector turns each vector
into ``tokens_per_vector`` LLM embeddings; ``mask`` is ``(B, n)`` (1 = a real vector) when the count varies per
graph, else ``None``. The designs: ``mean`` (the paper's: mean pool, one vector, T tokens), ``edges`` (one token
per edge in the text path's fact order, at most T) and ``query`` (T question-conditioned attention pools).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

READOUTS = ("mean", "edges", "query")
"""Names of the readouts; ``mean`` is the paper's."""


class GraphTokens(NamedTuple):
    """A batch's graph tokens ``(B, T_max, H)`` and, when the count varies per example, their ``(B, T_max)`` mask."""

    embeds: torch.Tensor
    mask: torch.Tensor | None

    def counts(self) -> list[int]:
        """Real graph tokens per example."""
        if self.mask is None:
            return [self.embeds.shape[1]] * self.embeds.shape[0]
        return [int(n) for n in self.mask.sum(dim=1).tolist()]

    def per_example(self) -> list[torch.Tensor]:
        """Each example's real tokens, ``(count, H)``."""
        return [row[: n] if self.mask is None else row[self.mask[i].bool()] for i, (row, n) in enumerate(zip(self.embeds, self.counts()))]

    def rolled(self) -> "GraphTokens":
        """The tokens shifted one example along the batch: each example gets the previous one's graph (the first, the last's)."""
        return GraphTokens(self.embeds.roll(1, 0), None if self.mask is None else self.mask.roll(1, 0))


def build_readout(kind: str, gnn_hidden: int, feature_dim: int, tokens: int) -> nn.Module:
    """The readout ``kind`` for an encoder of width ``gnn_hidden``, node/edge features of ``feature_dim`` and T = ``tokens``."""
    from qgmem_train.graph.edge_readout import EdgeReadout
    from qgmem_train.graph.mean_readout import MeanReadout
    from qgmem_train.graph.query_readout import QueryReadout

    if kind == "mean":
        return MeanReadout(gnn_hidden, tokens)
    if kind == "edges":
        return EdgeReadout(gnn_hidden, feature_dim, tokens)
    if kind == "query":
        return QueryReadout(gnn_hidden, feature_dim, tokens)
    raise ValueError(f"unknown graph readout {kind!r} (one of {', '.join(READOUTS)})")
