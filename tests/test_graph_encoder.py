"""Relation-aware encoder and projector: edge features matter, relations reach both ends, empty graphs pool to zeros."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from qgmem_train.graph.encoder import RelationalGraphEncoder
from qgmem_train.graph.local_graph import LocalGraph, graph_to_data
from qgmem_train.graph.projector import GraphTokenProjector

DIM = 8


def _graph(predicate: str) -> LocalGraph:
    return LocalGraph(node_labels=["Alice", "Paris"], edge_src=[0], edge_dst=[1], edge_labels=[predicate])


def _encoder(reverse_edges: bool) -> RelationalGraphEncoder:
    torch.manual_seed(0)
    return RelationalGraphEncoder(DIM, hidden_dim=16, layers=2, heads=2, reverse_edges=reverse_edges).eval()


def _batch(x: torch.Tensor, edges: list[tuple[int, int]], edge_attr: torch.Tensor) -> Batch:
    edge_index = torch.tensor(edges, dtype=torch.long).reshape(-1, 2).t()
    return Batch.from_data_list([Data(x=x, edge_index=edge_index, edge_attr=edge_attr, num_nodes=x.shape[0])])


def _changed(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not torch.allclose(a, b, atol=1e-6)


def test_predicates_change_the_encoding_and_empty_graphs_pool_to_zero(minilm) -> None:
    torch.manual_seed(0)
    encoder = RelationalGraphEncoder(minilm.dim, hidden_dim=32, layers=2, heads=2)
    graphs = [_graph("moved to"), _graph("visited"), LocalGraph()]
    batch = Batch.from_data_list([graph_to_data(g, minilm.encode, minilm.dim) for g in graphs])
    pooled = encoder(batch)
    assert pooled.shape == (3, 32)
    assert not torch.allclose(pooled[0], pooled[1]), "the predicate embedding must reach the messages"
    assert torch.equal(pooled[2], torch.zeros(32))


@pytest.mark.parametrize("reverse_edges", [True, False])
def test_changing_one_edge_feature_changes_the_pooled_output(reverse_edges: bool) -> None:
    encoder = _encoder(reverse_edges)
    generator = torch.Generator().manual_seed(1)
    x, edge_attr = torch.randn(3, DIM, generator=generator), torch.randn(2, DIM, generator=generator)
    edges = [(0, 1), (2, 1)]
    other = edge_attr.clone()
    other[1] = torch.randn(DIM, generator=generator)
    with torch.no_grad():
        before, after = encoder(_batch(x, edges, edge_attr)), encoder(_batch(x, edges, other))
    assert _changed(before, after), "the second edge's predicate must reach the pooled vector"


@pytest.mark.parametrize("reverse_edges", [True, False])
def test_subject_node_hears_its_object_and_predicate_only_with_reverse_edges(reverse_edges: bool) -> None:
    """Node 0 is subject-only (edge 0 → 1): forward messages never reach it; the reversed edge does."""
    encoder = _encoder(reverse_edges)
    generator = torch.Generator().manual_seed(2)
    x, edge_attr = torch.randn(2, DIM, generator=generator), torch.randn(1, DIM, generator=generator)
    new_object, new_predicate = x.clone(), torch.randn(1, DIM, generator=generator)
    new_object[1] = torch.randn(DIM, generator=generator)
    with torch.no_grad():
        subject = encoder.node_states(_batch(x, [(0, 1)], edge_attr))[0]
        object_changed = encoder.node_states(_batch(new_object, [(0, 1)], edge_attr))[0]
        predicate_changed = encoder.node_states(_batch(x, [(0, 1)], new_predicate))[0]
    assert _changed(subject, object_changed) is reverse_edges
    assert _changed(subject, predicate_changed) is reverse_edges


def test_reverse_edges_keep_empty_graphs_at_zero_and_tell_directions_apart() -> None:
    """A reversed edge is not the same message as a forward one: swapping subject and object changes the graph."""
    encoder = _encoder(True)
    generator = torch.Generator().manual_seed(3)
    x, edge_attr = torch.randn(2, DIM, generator=generator), torch.randn(1, DIM, generator=generator)
    empty = Data(x=torch.zeros(0, DIM), edge_index=torch.zeros(2, 0, dtype=torch.long), edge_attr=torch.zeros(0, DIM), num_nodes=0)
    forward = Data(x=x, edge_index=torch.tensor([[0], [1]]), edge_attr=edge_attr, num_nodes=2)
    swapped = Data(x=x, edge_index=torch.tensor([[1], [0]]), edge_attr=edge_attr, num_nodes=2)
    with torch.no_grad():
        pooled = encoder(Batch.from_data_list([forward, empty, swapped]))
    assert torch.equal(pooled[1], torch.zeros(16))
    assert _changed(pooled[0], pooled[2])


def test_projector_makes_t_tokens_of_the_llm_width_that_depend_on_the_input() -> None:
    torch.manual_seed(0)
    projector = GraphTokenProjector(in_dim=32, hidden_dim=16, llm_hidden_size=48, tokens=3)
    pooled = torch.randn(5, 32)
    tokens = projector(pooled)
    assert tokens.shape == (5, 3, 48)
    for i in range(1, 5):
        assert _changed(tokens[0], tokens[i]), f"graphs 0 and {i} differ, their tokens must too"
    assert torch.allclose(projector(pooled[2:3])[0], tokens[2], atol=1e-6), "each graph's tokens come from its own vector"


def test_projector_without_norm_is_the_papers_eq7_two_layer_mlp() -> None:
    """``normalize=False`` (``model.projector.norm: false``) is ``W2 σ(W1 g + b1) + b2`` with nothing after it (paper Eq. 7)."""
    torch.manual_seed(0)
    projector = GraphTokenProjector(in_dim=32, hidden_dim=16, llm_hidden_size=48, tokens=3, normalize=False)
    first, act, second = projector.mlp
    assert (type(first), type(act), type(second)) == (torch.nn.Linear, torch.nn.GELU, torch.nn.Linear)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in projector.modules())
    assert {name for name, _ in projector.named_parameters()} == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"}
    pooled = torch.randn(5, 32)
    by_hand = torch.nn.functional.gelu(pooled @ first.weight.T + first.bias) @ second.weight.T + second.bias
    assert torch.allclose(projector(pooled), by_hand.view(5, 3, 48), atol=1e-6)
    projector.set_scale(3.0)
    assert torch.allclose(projector(pooled), by_hand.view(5, 3, 48), atol=1e-6), "no scale to set without the norm"


def test_zero_layers_pass_the_frozen_node_features_through_unchanged() -> None:
    """``model.encoder.layers: 0``: no message passing, no parameters; the readout pools the embedder's node features."""
    encoder = RelationalGraphEncoder(DIM, hidden_dim=16, layers=0, heads=2)
    assert encoder.out_dim == DIM and not list(encoder.parameters())
    x = torch.randn(3, DIM)
    graph = _batch(x, [(0, 1), (1, 2)], torch.randn(2, DIM))
    assert torch.equal(encoder.node_states(graph), x)
    assert torch.allclose(encoder(graph)[0], x.mean(0))
    with pytest.raises(ValueError, match="0 or more"):
        RelationalGraphEncoder(DIM, hidden_dim=16, layers=-1, heads=2)


@pytest.mark.parametrize("normalize", [False, True])
def test_projector_with_no_hidden_layer_is_one_linear_map(normalize: bool) -> None:
    """``model.projector.hidden_dim: 0``: one linear layer from the pooled vector to the tokens (with ``norm: false``, nothing after it)."""
    torch.manual_seed(0)
    projector = GraphTokenProjector(in_dim=32, hidden_dim=0, llm_hidden_size=48, tokens=3, normalize=normalize)
    (linear,) = projector.mlp
    assert isinstance(linear, torch.nn.Linear) and (linear.in_features, linear.out_features) == (32, 144)
    pooled = torch.randn(5, 32)
    by_hand = (pooled @ linear.weight.T + linear.bias).view(5, 3, 48)
    if normalize:
        by_hand = torch.nn.functional.layer_norm(by_hand, (48,)) / 48**0.5  # the learned scale starts at 1
    assert torch.allclose(projector(pooled), by_hand, atol=1e-5)
