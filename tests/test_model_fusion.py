"""Graph-text fusion: a padded batch equals one-sample references (right padding in training, left in generation)."""

from __future__ import annotations

import pytest
import torch

from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.fusion import GRAPH_SLOT, IGNORE_INDEX
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, fixture_corpus, save_tiny_decoder, tiny_module_kwargs


@pytest.fixture(scope="module")
def data() -> TrajectoryDataModule:
    module = TrajectoryDataModule(str(FIXTURE), batch_size=3, shuffle=False)
    module.setup("fit")
    return module


@pytest.fixture(scope="module")
def model(tmp_path_factory, data) -> GraphAugmentedLM:
    folder = save_tiny_decoder(tmp_path_factory.mktemp("tiny"), fixture_corpus())
    torch.manual_seed(0)
    return GraphAugmentedLM(**tiny_module_kwargs(folder, data.feature_dim, graph_tokens=2))


def _logits(model: GraphAugmentedLM, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return model.llm.get_output_embeddings()(model.hidden_states(inputs))


def test_right_padded_batch_matches_one_sample_references(model, data) -> None:
    examples = data.splits["train"][:3]
    batch = data.collate(examples)
    inputs = model.training_inputs(batch)
    lengths = inputs["attention_mask"].sum(-1)
    assert len(set(lengths.tolist())) > 1, "the fixture should give samples of different lengths"
    with torch.no_grad():
        batched = _logits(model, inputs)
        for i, example in enumerate(examples):
            single = model.training_inputs(data.collate([example]))
            n = int(lengths[i])
            assert single["inputs_embeds"].shape[1] == n
            assert torch.equal(single["labels"][0], inputs["labels"][i, :n])
            assert torch.equal(inputs["position_ids"][i, :n], torch.arange(n))
            assert torch.allclose(_logits(model, single)[0], batched[i, :n], atol=1e-5)
    labels = inputs["labels"][0]
    target = model.tokenizer(examples[0].target_json(), add_special_tokens=False)["input_ids"] + [model.tokenizer.eos_token_id]
    assert labels[labels != IGNORE_INDEX].tolist() == target
    assert (inputs["attention_mask"][:, 0] == 1).all() and (labels[: GRAPH_SLOT + 2] == IGNORE_INDEX).all()


def test_graph_tokens_sit_right_after_the_template_start(model, data) -> None:
    example = data.splits["train"][0]
    batch = data.collate([example])
    with torch.no_grad():
        inputs = model.training_inputs(batch)
        graph = model.graph_embeddings(batch["graph"])[0]
        prompt = model.prompt_ids(example)
        tokens = model.llm.get_input_embeddings()(torch.tensor(prompt))
    embeds = inputs["inputs_embeds"][0]
    assert torch.equal(embeds[:GRAPH_SLOT], tokens[:GRAPH_SLOT])
    assert torch.equal(embeds[GRAPH_SLOT : GRAPH_SLOT + 2], graph)
    assert torch.equal(embeds[GRAPH_SLOT + 2 : len(prompt) + 2], tokens[GRAPH_SLOT:])
    assert model.tokenizer.decode(prompt[:GRAPH_SLOT]) == "<|im_start|>"


def test_left_padded_generation_matches_one_sample_generation(model, data) -> None:
    examples = data.splits["train"][:3]
    together = model.generate(examples, data.collate(examples)["graph"])
    alone = [model.generate([ex], data.collate([ex])["graph"])[0] for ex in examples]
    assert together == alone
    assert all(isinstance(text, str) for text in together)
