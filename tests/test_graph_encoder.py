"""Relation-aware encoder and projector: edge features matter, empty graphs pool to zeros, widths come from arguments."""

from __future__ import annotations

import torch
from torch_geometric.data import Batch

from qgmem_train.graph.encoder import RelationalGraphEncoder
from qgmem_train.graph.local_graph import LocalGraph, graph_to_data
from qgmem_train.graph.projector import GraphTokenProjector


def _graph(predicate: str) -> LocalGraph:
    return LocalGraph(node_labels=["Alice", "Paris"], edge_src=[0], edge_dst=[1], edge_labels=[predicate])


def test_predicates_change_the_encoding_and_empty_graphs_pool_to_zero(minilm) -> None:
    torch.manual_seed(0)
    encoder = RelationalGraphEncoder(minilm.dim, hidden_dim=32, layers=2, heads=2)
    graphs = [_graph("moved to"), _graph("visited"), LocalGraph()]
    batch = Batch.from_data_list([graph_to_data(g, minilm.encode, minilm.dim) for g in graphs])
    pooled = encoder(batch)
    assert pooled.shape == (3, 32)
    assert not torch.allclose(pooled[0], pooled[1]), "the predicate embedding must reach the messages"
    assert torch.equal(pooled[2], torch.zeros(32))


def test_projector_makes_t_tokens_of_the_llm_width() -> None:
    projector = GraphTokenProjector(in_dim=32, hidden_dim=16, llm_hidden_size=48, tokens=3)
    assert projector(torch.randn(5, 32)).shape == (5, 3, 48)
