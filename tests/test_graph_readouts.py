"""Graph readouts (``model.readout.kind``): per-edge tokens with a padding mask, question-aware pooling, the paper's mean."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import tiny_module_kwargs


def _module(llm_dir, data, **overrides) -> GraphAugmentedLM:
    torch.manual_seed(0)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, **overrides))
    model.load_backbone()
    return model.eval()


def _cut(example, edges: int):
    """``example`` with only the first ``edges`` edges of its local graph (nodes kept)."""
    g = example.graph
    graph = LocalGraph(list(g.node_labels), g.edge_src[:edges], g.edge_dst[:edges], g.edge_labels[:edges], g.edge_unit_labels[:edges])
    return dataclasses.replace(example, graph=graph)


def test_edges_readout_gives_one_token_per_edge_in_fact_order_up_to_the_cap(llm_dir, data) -> None:
    model = _module(llm_dir, data, readout={"kind": "edges", "tokens": 4})
    examples = [_cut(data.splits["train"][0], 2), _cut(data.splits["train"][1], 6), _cut(data.splits["train"][2], 0)]
    batch = data.collate(examples)
    tokens = model.graph_embeddings(batch["graph"])
    assert tokens.embeds.shape == (3, 4, model.llm.config.hidden_size)
    assert tokens.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]] and tokens.counts() == [2, 4, 0]
    # token j of a graph is its j-th edge (the text path's [F j+1]): subject and object states with the predicate feature
    graph = batch["graph"]
    states = model.encoder.node_states(graph)
    src, dst = graph.edge_index
    first_of_second = 2  # the second graph's edges start after the first graph's two
    for j in range(4):
        e = first_of_second + j
        vector = torch.cat([states[src[e]], states[dst[e]], graph.edge_attr[e]])
        assert torch.allclose(tokens.embeds[1, j], model.projector(vector[None])[0, 0], atol=1e-5)


def test_edges_readout_padded_batch_equals_one_at_a_time(llm_dir, data) -> None:
    model = _module(llm_dir, data, readout={"kind": "edges", "tokens": 5})
    examples = [_cut(data.splits["train"][0], 1), _cut(data.splits["train"][1], 5), _cut(data.splits["train"][2], 0)]
    with torch.no_grad():
        batch = data.collate(examples)
        inputs = model.training_inputs(batch)
        alone = [model.training_inputs(data.collate([ex])) for ex in examples]
        # masked graph-token positions never reach the LLM: each row holds exactly its own real tokens
        assert inputs["attention_mask"].sum(1).tolist() == [a["attention_mask"].shape[1] for a in alone]
        for i, single in enumerate(alone):
            length = single["inputs_embeds"].shape[1]  # (with the prefix cache, the tokens after the cached prefix)
            assert torch.equal(inputs["position_ids"][i, :length], single["position_ids"][0])
            assert torch.allclose(inputs["inputs_embeds"][i, :length], single["inputs_embeds"][0], atol=1e-6)
            assert torch.equal(inputs["labels"][i, :length], single["labels"][0])
        together = model.example_losses(batch)
        separate = torch.cat([model.example_losses(data.collate([ex])) for ex in examples])
    assert torch.allclose(together, separate, atol=1e-4)
    assert model.generate(examples, batch["graph"]) == [model.generate([ex], data.collate([ex])["graph"])[0] for ex in examples]


def test_query_readout_changes_with_the_question_not_only_with_the_graph(llm_dir, data) -> None:
    model = _module(llm_dir, data, readout={"kind": "query", "tokens": 3})
    first, second = data.splits["train"][0], data.splits["train"][1]
    assert first.question != second.question and first.graph != second.graph
    asked_otherwise = dataclasses.replace(first, question=second.question)
    other_graph = dataclasses.replace(first, graph=second.graph)
    with torch.no_grad():
        base, again, by_question, by_graph = (
            model.graph_embeddings(data.collate([ex])["graph"]) for ex in (first, first, asked_otherwise, other_graph)
        )
    assert base.embeds.shape == (1, 3, model.llm.config.hidden_size) and base.mask is None
    assert torch.equal(base.embeds, again.embeds), "deterministic, so any difference below comes from the input"
    # at initialisation the attention is close to uniform, so the differences are small but far above rounding
    assert (base.embeds - by_question.embeds).abs().max() > 1e-5, "same graph, another question: other tokens"
    assert (base.embeds - by_graph.embeds).abs().max() > 1e-5, "same question, another graph: other tokens"
    # an empty graph gives the same tokens whatever the question (a soft prompt), so the question alone carries nothing
    empty = [dataclasses.replace(ex, graph=LocalGraph()) for ex in (first, asked_otherwise)]
    with torch.no_grad():
        a, b = (model.graph_embeddings(data.collate([ex])["graph"]).embeds for ex in empty)
    assert torch.allclose(a, b)


def test_mean_readout_is_the_papers_and_every_readout_trains(llm_dir, data) -> None:
    batch = data.collate(data.splits["train"][:2])
    for readout, names in (("mean", {"encoder", "projector"}), ("edges", {"encoder", "projector"}), ("query", {"encoder", "projector", "readout"})):
        model = _module(llm_dir, data, readout={"kind": readout, "tokens": 2})
        model.train()
        model.example_losses(batch).mean().backward()
        assert {n.split(".")[0] for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0} == names
    mean = _module(llm_dir, data, readout={"tokens": 2})
    with torch.no_grad():
        tokens = mean.graph_embeddings(batch["graph"])
        assert tokens.mask is None and torch.allclose(tokens.embeds, mean.projector(mean.encoder(batch["graph"])))


def test_checkpoint_settings_name_the_readout(llm_dir, data) -> None:
    mean, edges = _module(llm_dir, data, readout={"tokens": 2}), _module(llm_dir, data, readout={"tokens": 2, "kind": "edges"})
    assert mean.checkpoint_metadata()["settings"]["graph_readout"] == "mean"
    assert mean.checkpoint_metadata()["config_hash"] != edges.checkpoint_metadata()["config_hash"]


def test_unknown_readout_is_refused(llm_dir, data) -> None:
    from qgmem_train.errors import InputError

    with pytest.raises(InputError, match="model.readout.kind"):
        GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, readout={"kind": "max"}))


def test_validation_logs_answer_loss_and_graph_token_diagnostics(llm_dir, data) -> None:
    import lightning as L

    model = _module(llm_dir, data, readout={"kind": "query", "tokens": 2}, generation={"val_generate": False})
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.validate(model, datamodule=data, verbose=False)[0]
    assert {"val/loss", "val/answer_loss", "val/graph_token_cosine", "val/graph_token_between_variance_ratio"} <= set(metrics)
    assert metrics["val/answer_loss"] != metrics["val/loss"] and -1.0 <= metrics["val/graph_token_cosine"] <= 1.0
    batch = data.collate(data.splits["validation"])
    with torch.no_grad():
        whole, answer = model.evaluation_losses(batch)
    assert metrics["val/answer_loss"] == pytest.approx(float(answer.mean()), rel=1e-4)
    assert metrics["val/loss"] == pytest.approx(float(whole.mean()), rel=1e-4)
