"""Centered projector (``model.graph_projector: centered``): a learned prompt plus a graph part that averages to zero."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qgmem_train.graph.centered_projector import CenteredGraphProjector
from qgmem_train.graph.diagnostics import graph_token_diagnostics
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.graph.projector import GraphTokenProjector
from qgmem_train.model.checkpoint import trainable_state_dict
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, fixture_corpus, save_tiny_decoder, tiny_module_kwargs


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return save_tiny_decoder(tmp_path_factory.mktemp("tiny"), fixture_corpus())


@pytest.fixture(scope="module")
def data() -> TrajectoryDataModule:
    module = TrajectoryDataModule(str(FIXTURE), batch_size=2)
    module.setup("fit")
    return module


def _module(llm_dir, data, **overrides) -> GraphAugmentedLM:
    torch.manual_seed(0)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, graph_projector="centered", **overrides))
    model.load_backbone()
    return model


def test_graph_part_averages_to_zero_over_what_it_observed_and_varies_per_vector() -> None:
    torch.manual_seed(0)
    projector = CenteredGraphProjector(in_dim=6, llm_hidden_size=8, tokens=2)
    projector.set_scale(3.0)
    shared = torch.randn(6) * 10  # a large component every vector has: what the MLP projector's tokens drift to
    vectors = shared + 0.01 * torch.randn(5, 6)
    projector.train()
    projector(vectors)
    projector.eval()
    with torch.no_grad():
        tokens = projector(vectors)
    graph_part = tokens - 3.0 * projector.prompt
    assert torch.allclose(graph_part.mean(0), torch.zeros(2, 8), atol=1e-4)
    # standardised, the 1% differences between the vectors reach the tokens at the prompt's size; through the MLP
    # projector they stay 1% of a shared direction
    mlp = GraphTokenProjector(6, 16, 8, 2)
    with torch.no_grad():
        mlp_tokens = mlp(vectors)
    assert graph_token_diagnostics(list(tokens))["between_variance_ratio"] > 0.1
    assert graph_token_diagnostics(list(mlp_tokens))["between_variance_ratio"] < 0.01
    # empty graphs pool to zeros: a projector that has only seen zeros gives the prompt, the soft-prompt control
    empty = CenteredGraphProjector(in_dim=6, llm_hidden_size=8, tokens=2).train()
    assert torch.equal(empty(torch.zeros(3, 6)), empty.prompt.expand(3, 2, 8))


def test_padding_rows_of_the_edges_readout_do_not_enter_the_statistics(llm_dir, data) -> None:
    model = _module(llm_dir, data, graph_readout="edges", graph_tokens=4)
    graph = data.collate([data.splits["train"][0], dataclasses.replace(data.splits["train"][1], graph=LocalGraph())])["graph"]
    model.train()
    tokens = model.graph_embeddings(graph)
    vectors, mask = model.readout(model.encoder.node_states(graph), graph)
    real = vectors[mask.bool()].detach()
    assert tokens.counts()[1] == 0 and real.shape[0] > 1
    assert torch.allclose(model.projector.running_mean, real.mean(0), atol=1e-6)
    assert torch.allclose(model.projector.running_var, real.var(0, unbiased=False), atol=1e-6)


def test_checkpoints_carry_the_running_statistics_and_a_step_trains_both_parts(llm_dir, data) -> None:
    model = _module(llm_dir, data, graph_tokens=2)
    model.train()
    batch = data.collate(data.splits["train"][:2])
    model.example_losses(batch).mean().backward()
    trained = {n.split(".")[0] + "." + n.split(".")[1] for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {"projector.prompt", "projector.graph"} <= trained and any(n.startswith("encoder.") for n in trained)
    state = trainable_state_dict(model)
    assert {"projector.running_mean", "projector.running_var", "projector.observed"} <= set(state)
    assert not any(name.startswith("llm.") for name in state)
    checkpoint: dict = {}
    model.on_save_checkpoint(checkpoint)
    restored = _module(llm_dir, data, graph_tokens=2)
    restored.on_load_checkpoint(checkpoint)
    restored.load_state_dict(checkpoint["state_dict"], strict=False)
    assert torch.equal(restored.projector.running_mean, model.projector.running_mean)
    restored.eval(), model.eval()
    with torch.no_grad():
        assert torch.equal(restored.graph_embeddings(batch["graph"]).embeds, model.graph_embeddings(batch["graph"]).embeds)


def test_unknown_projector_is_refused(llm_dir, data) -> None:
    from qgmem_train.errors import InputError

    with pytest.raises(InputError, match="model.graph_projector"):
        GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, graph_projector="linear"))
