"""The contrastive term that makes a question's own graph worth more to its answer than another question's graph."""

from __future__ import annotations

import pytest
import torch

from qgmem_train.errors import InputError
from qgmem_train.graph.readout import GraphTokens
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
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, **overrides))
    model.load_backbone()
    model.train()
    return model


@pytest.mark.parametrize("readout", ["mean", "edges"])
def test_training_loss_adds_the_hinge_on_own_against_another_questions_graph(llm_dir, data, readout) -> None:
    model = _module(llm_dir, data, graph_readout=readout, graph_tokens=3, graph_contrast=0.5, graph_contrast_margin=0.2)
    batch = data.collate(data.splits["train"][:3])
    tokens = model.graph_embeddings(batch["graph"])
    own = model.example_losses(batch, tokens)
    rolled = GraphTokens(tokens.embeds.roll(1, 0), None if tokens.mask is None else tokens.mask.roll(1, 0))
    other = model.example_losses(batch, rolled)
    assert not torch.equal(own, other)
    expected = own.mean() + 0.5 * torch.relu(0.2 + own - other).mean()
    assert model.training_step(batch, 0).item() == pytest.approx(expected.item(), rel=1e-6)


def test_without_the_term_the_loss_is_the_answer_loss(llm_dir, data) -> None:
    model = _module(llm_dir, data)
    batch = data.collate(data.splits["train"][:2])
    assert model.training_step(batch, 0).item() == pytest.approx(model.example_losses(batch).mean().item(), rel=1e-6)


def test_a_batch_of_one_has_no_other_graph_and_trains_on_its_answer_alone(llm_dir, data) -> None:
    model = _module(llm_dir, data, graph_contrast=1.0)
    batch = data.collate(data.splits["train"][:1])
    assert model.training_step(batch, 0).item() == pytest.approx(model.example_losses(batch).mean().item(), rel=1e-6)


def test_the_term_reaches_the_graph_path(llm_dir, data) -> None:
    model = _module(llm_dir, data, graph_contrast=1.0, graph_contrast_margin=10.0)
    batch = data.collate(data.splits["train"][:2])
    plain = _module(llm_dir, data)
    model.training_step(batch, 0).backward()
    plain.training_step(batch, 0).backward()
    mine, theirs = model.encoder.parameters().__next__().grad, plain.encoder.parameters().__next__().grad
    assert mine is not None and not torch.allclose(mine, theirs)


@pytest.mark.parametrize("field,value", [("graph_contrast", -0.1), ("graph_contrast_margin", -1.0)])
def test_negative_settings_are_refused(llm_dir, data, field, value) -> None:
    with pytest.raises(InputError, match=field):
        GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, **{field: value}))
