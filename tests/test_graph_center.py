"""Reference-centered graph tokens (``model.projector.center: reference``): what all graphs share cancels, the graph part
keeps its share, evaluation reuses the last training step's statistics, and the adapter carries them."""

from __future__ import annotations

import math

import pytest
import torch

from qgmem_train.errors import InputError
from qgmem_train.graph.centered_projector import ReferenceCenteredProjector
from qgmem_train.graph.projector import GraphTokenProjector
from qgmem_train.model.checkpoint import trainable_state_dict
from qgmem_train.model.module import GraphAugmentedLM, reference_graphs
from qgmem_train.model.settings import merge_settings
from tests.tiny_decoder import fit_to_last_checkpoint, tiny_module_kwargs

HIDDEN = 12


def _projector(share: float = 0.5) -> ReferenceCenteredProjector:
    torch.manual_seed(0)
    projector = ReferenceCenteredProjector(8, 16, HIDDEN, tokens=2, share=share)
    projector.set_scale(3.0)
    return projector


def test_the_graph_part_averages_to_zero_over_the_reference_and_keeps_its_share() -> None:
    projector = _projector(share=0.5).train()
    reference = torch.randn(20, 8)
    tokens = projector(reference, reference)
    graph_part = tokens * math.sqrt(HIDDEN) / projector.scale - projector.norm(projector.prompt)
    assert graph_part.mean(0).abs().max().item() < 1e-5
    assert graph_part.pow(2).mean().sqrt().item() == pytest.approx(0.5, rel=1e-4)


def test_a_shift_every_graph_shares_cancels_where_the_plain_projector_follows_it() -> None:
    reference, vectors = torch.randn(20, 8), torch.randn(3, 8)
    centered = _projector().train()
    torch.manual_seed(0)
    plain = GraphTokenProjector(8, 16, HIDDEN, tokens=2)
    before = centered(vectors, reference), plain(vectors)
    with torch.no_grad():
        for projector in (centered, plain):
            projector.mlp[-1].bias += torch.linspace(-2.0, 3.0, 2 * HIDDEN)
    assert torch.allclose(centered(vectors, reference), before[0], atol=1e-5)
    assert not torch.allclose(plain(vectors), before[1], atol=1e-2)


def test_evaluation_uses_the_statistics_of_the_last_training_step() -> None:
    projector = _projector().train()
    reference, vectors = torch.randn(20, 8), torch.randn(3, 8)
    trained = projector(vectors, reference)
    projector.eval()
    assert torch.allclose(projector(vectors), trained, atol=1e-6)
    projector(vectors, torch.randn(20, 8) + 5.0)  # an evaluation with another reference leaves the kept statistics
    assert torch.allclose(projector(vectors), trained, atol=1e-6)


def _module(llm_dir, data, **overrides) -> GraphAugmentedLM:
    torch.manual_seed(0)
    centered = merge_settings({"projector": {"center": "reference"}, "readout": {"tokens": 2}}, overrides)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, **centered))
    model.load_backbone()
    return model


@pytest.mark.parametrize("readout", ["mean", "edges", "query"])
def test_every_readout_trains_centered_and_its_tokens_follow_the_graph(llm_dir, data, readout) -> None:
    model = _module(llm_dir, data, readout={"kind": readout}).train()
    model.set_reference_graphs(reference_graphs(data, 4))
    batch = data.collate(data.splits["train"][:2])
    model.training_step(batch, 0).backward()
    assert next(model.encoder.parameters()).grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        tokens = model.graph_embeddings(batch["graph"]).per_example()
    assert not torch.allclose(tokens[0][0], tokens[1][0], atol=1e-3)


def test_training_without_reference_graphs_is_one_clear_error(llm_dir, data) -> None:
    model = _module(llm_dir, data).train()
    with pytest.raises(RuntimeError, match="no reference graphs"):
        model.training_step(data.collate(data.splits["train"][:1]), 0)


@pytest.mark.parametrize("field,value", [("center", "batch"), ("reference_graphs", 1)])
def test_bad_settings_are_refused(llm_dir, data, field, value) -> None:
    with pytest.raises(InputError, match=f"model.projector.{field}"):
        GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, projector={field: value}))


def test_a_fit_picks_its_reference_and_the_checkpoint_carries_the_statistics(llm_dir, data, tmp_path) -> None:
    model = _module(llm_dir, data)
    checkpoint = torch.load(fit_to_last_checkpoint(model, data, tmp_path, steps=2), weights_only=False)
    assert {"projector.center", "projector.spread"} <= set(checkpoint["state_dict"]) == set(trainable_state_dict(model))
    assert checkpoint["state_dict"]["projector.center"].abs().sum() > 0
    restored = _module(llm_dir, data)
    restored.on_load_checkpoint(checkpoint)
    restored.load_state_dict(checkpoint["state_dict"], strict=False)
    graph = data.collate(data.splits["test"][:2])["graph"]
    with torch.no_grad():
        assert torch.allclose(restored.eval().graph_embeddings(graph).embeds, model.eval().graph_embeddings(graph).embeds, atol=1e-6)
