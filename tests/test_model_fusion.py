"""Graph-text fusion: a padded batch equals one-sample references (right padding in training, left in generation)."""

from __future__ import annotations

import pytest
import torch

from qgmem_train.answer.parsing import parse_answer
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.fusion import IGNORE_INDEX
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
    # The whole sequence in one pass: tests/test_prefix_cache.py checks the cached path against this one.
    model = GraphAugmentedLM(**tiny_module_kwargs(folder, data.feature_dim, readout={"tokens": 2}, prefix_cache=False))
    model.load_backbone("cpu")
    return model


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
    slot = model.prompt_ids(examples[0]).graph_slot
    assert (inputs["attention_mask"][:, 0] == 1).all() and (labels[: slot + 2] == IGNORE_INDEX).all()


def test_graph_tokens_open_the_user_message(model, data) -> None:
    example = data.splits["train"][0]
    batch = data.collate([example])
    with torch.no_grad():
        inputs = model.training_inputs(batch)
        graph = model.graph_embeddings(batch["graph"]).embeds[0]
        prompt = model.prompt_ids(example)
        tokens = model.llm.get_input_embeddings()(torch.tensor(prompt.ids))
    slot, embeds = prompt.graph_slot, inputs["inputs_embeds"][0]
    assert torch.equal(embeds[:slot], tokens[:slot])
    assert torch.equal(embeds[slot : slot + 2], graph)
    assert torch.equal(embeds[slot + 2 : len(prompt.ids) + 2], tokens[slot:])
    assert model.tokenizer.decode(prompt.ids[:slot]).endswith("<|im_end|>\n<|im_start|>user\n")
    assert model.tokenizer.decode(prompt.ids[slot:]).startswith("Question: ")


def test_the_loss_depends_on_the_graph_tokens(model, data) -> None:
    batch = data.collate(data.splits["train"][:2])
    with torch.no_grad():
        graph = model.graph_embeddings(batch["graph"])
        plain = model.example_losses(batch, graph)
        shifted = model.example_losses(batch, graph._replace(embeds=graph.embeds + torch.randn_like(graph.embeds)))
        again = model.example_losses(batch, graph)
    assert torch.equal(plain, again)
    assert not torch.allclose(plain, shifted), "the graph tokens must reach the LLM's prediction of the target"


def test_left_padded_generation_matches_one_sample_generation_and_is_schema_valid(model, data) -> None:
    examples = data.splits["train"][:3]
    together = model.generate(examples, data.collate(examples)["graph"])
    alone = [model.generate([ex], data.collate([ex])["graph"])[0] for ex in examples]
    assert together == alone
    assert all(parse_answer(text) is not None for text in together), together


@pytest.mark.slow
def test_smollm2_graph_path_answers_are_schema_valid_for_a_left_padded_batch(data) -> None:
    """The bundled SmolLM2 with an untrained graph token: every answer parses, whatever its quality."""
    from qgmem_train.config import BUNDLED_LLM

    torch.manual_seed(0)
    model = GraphAugmentedLM(
        feature_dim=data.feature_dim, llm=BUNDLED_LLM, dtype="float32", encoder={"hidden_dim": 32, "layers": 1, "heads": 2},
        projector={"hidden_dim": 32}, prompt={"max_context_tokens": 64}, generation={"max_new_tokens": 48},
    )  # fmt: skip
    model.load_backbone("cpu")
    examples = data.splits["train"][:4]
    assert len({len(model.prompt_ids(ex).ids) for ex in examples}) > 1, "prompts of different lengths"
    texts = model.generate(examples, data.collate(examples)["graph"])
    parsed = [parse_answer(text) for text in texts]
    assert all(p is not None for p in parsed), texts
    assert all(len(p.answer) <= (48 - 24) // 2 and len(p.reasoning_path) <= (48 - 24) // 2 for p in parsed)
