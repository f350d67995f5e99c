"""The shuffle gap of every fit: the validation loss with another example's graph minus the loss with its own.

Pure parts first (who gives whose graph, the interval, the verdict line); then two short fits of the tiny decoder on
synthetic tasks: one whose answer is only in the graph (no text), where the gap must be above 0, and one whose graph
is irrelevant to the answer, where it must be within noise of 0. The first fit also shows the gap in the checkpoint's
metadata, in fit's last line and in the export's model card.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.graph.shuffle_gap import conversation_interval, graph_donors, graph_reading_line, shuffle_gap_summary
from qgmem_train.model.checkpoint import METADATA_KEY
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.trajectory import TrajectoryExample, write_trajectory_dataset
from tests.tiny_decoder import publish_to_hub_cache, save_tiny_decoder, tiny_module_kwargs

COLOURS = ["red", "blue", "green", "yellow"]
ANIMALS = ["otter", "heron", "badger", "lynx", "marten", "stoat", "ibis", "vole"]
FIT_STEPS = 100
READABLE = {"readout": {"tokens": 8}, "projector": {"norm": False}}
"""Graph tokens this tiny frozen decoder can read within a short fit: eight, with the paper's projector (no LayerNorm).
With the shipped LayerNorm projector, at one token or eight, the gap stayed under 0.0002 nats in 160 steps here (a probe outside this file)."""


# ------------------------------------------------------------------------------------------------ pure parts


def test_donors_stay_in_the_conversation_and_never_give_an_example_its_own_graph() -> None:
    cases = ["a", "a", "a", "b", "b", "c", "a"]
    for seed in range(8):
        donors = graph_donors(cases, seed)
        assert all(d != i for i, d in enumerate(donors)), "never its own graph"
        assert all(cases[d] == cases[i] for i, d in enumerate(donors) if cases[i] != "c"), "another question of the same conversation"
        assert sorted(d for i, d in enumerate(donors) if cases[i] == "a") == [i for i, c in enumerate(cases) if c == "a"], "each graph once"
        assert donors[5] is not None and cases[donors[5]] != "c", "a lone question takes another conversation's graph"
    assert graph_donors(cases, 0) == graph_donors(cases, 0)
    assert any(graph_donors(cases, 0) != graph_donors(cases, s) for s in range(1, 8)), "the seed picks the derangement"


def test_lone_questions_swap_among_themselves_and_a_split_of_one_has_no_donor() -> None:
    donors = graph_donors(["a", "b", "c", "d"], 3)
    assert sorted(donors) == [0, 1, 2, 3] and all(d != i for i, d in enumerate(donors))
    assert graph_donors(["a"], 0) == [None] and graph_donors([], 0) == []


def test_the_interval_resamples_conversations_not_examples() -> None:
    """Ten copies of each conversation's example add nothing: the interval is that of one example a conversation (a
    per-example interval would narrow by about √10); the mean weighs every example alike."""
    cases, values = ["a", "b", "c", "d", "e"], [0.1, 0.3, 0.2, 0.4, -0.1]
    once = conversation_interval(cases, values)
    tenfold = conversation_interval([c for c in cases for _ in range(10)], [v for v in values for _ in range(10)])
    assert (tenfold["low"], tenfold["high"]) == pytest.approx((once["low"], once["high"]))
    assert tenfold["examples"] == 50 and tenfold["conversations"] == 5 and once["low"] < 0.18 < once["high"]
    uneven = conversation_interval(["a", "a", "a", "b"], [0.0, 0.0, 0.0, 1.0])
    assert uneven["mean"] == pytest.approx(0.25) and uneven["low"] == pytest.approx(0.0) and uneven["high"] == pytest.approx(1.0)
    alone = conversation_interval(["a", "a", "b"], [0.5, 0.7, float("nan")])
    assert alone["mean"] == pytest.approx(0.6) and alone["examples"] == 2 and alone["low"] is None and alone["high"] is None


def test_summary_gives_the_whole_target_and_the_answer_span_each_its_interval() -> None:
    got = shuffle_gap_summary(["a", "b", "c"], [0.01, 0.02, 0.03], [0.5, float("nan"), 0.7])
    assert got["shuffle_gap"] == pytest.approx(0.02) and got["examples"] == 3 and got["conversations"] == 3
    assert got["answer_shuffle_gap"] == pytest.approx(0.6) and got["answer_examples"] == 2
    assert 0.5 <= got["answer_shuffle_gap_low"] <= got["answer_shuffle_gap_high"] <= 0.7


def test_the_line_says_what_the_gap_means() -> None:
    reading = {"shuffle_gap": 0.2, "shuffle_gap_low": 0.15, "shuffle_gap_high": 0.25, "examples": 40, "token_cosine": 0.5, "floor": 0.01}
    assert "graph tokens carry 0.200 nats" in graph_reading_line(reading) and "the model uses" in graph_reading_line(reading)
    nothing = {**reading, "shuffle_gap": 0.001, "shuffle_gap_low": -0.002, "shuffle_gap_high": 0.004, "token_cosine": 0.9999}
    assert "the model reads nothing from its graphs: the tokens act as a learned prompt" in graph_reading_line(nothing)
    unsure = {**reading, "shuffle_gap": 0.02, "shuffle_gap_low": -0.01, "shuffle_gap_high": 0.05}
    assert "undecided" in graph_reading_line(unsure)
    assert "undecided" in graph_reading_line({**reading, "shuffle_gap_low": None, "shuffle_gap_high": None, "examples": 1})
    assert "graph_tokens is 0" in graph_reading_line({"skipped": "graph_tokens is 0: no graph to shuffle"})
    assert "no validation" in graph_reading_line(None)
    off = graph_reading_line({"skipped": "off: model.diagnostics.shuffle_gap: false", "token_cosine": 0.1234})
    assert "not measured" in off and "graph-token cosine 0.1234 (centred)" in off


def test_the_verdict_reads_the_answer_span_where_the_whole_target_dilutes_it() -> None:
    diluted = {"shuffle_gap": 0.012, "shuffle_gap_low": 0.004, "shuffle_gap_high": 0.02, "examples": 40, "conversations": 8, "floor": 0.01}
    reading = {**diluted, "answer_shuffle_gap": 0.3, "answer_shuffle_gap_low": 0.2, "answer_shuffle_gap_high": 0.4, "answer_examples": 40,
               "answer_conversations": 8}  # fmt: skip
    line = graph_reading_line(reading)
    assert "carry 0.300 nats an answer token" in line and "on the whole target +0.0120" in line and "of 8 conversations" in line
    assert "undecided" in graph_reading_line(diluted), "a reading of before the answer span: the whole target's gap decides"


# ------------------------------------------------------------------------------------------------ fits


def _example(case: str, number: int, colour: str, animal: str, graph_answers: bool) -> TrajectoryExample:
    """A question whose answer (a colour) is in its graph and nowhere in its text, or in its question with a graph of animals."""
    if graph_answers:
        graph = LocalGraph(node_labels=["the code", colour], edge_src=[0], edge_dst=[1], edge_labels=["is"], edge_unit_labels=["F1"])
        question = "Which colour is the code?"
    else:
        graph = LocalGraph(node_labels=[animal, "the river"], edge_src=[0], edge_dst=[1], edge_labels=["swims in"], edge_unit_labels=["F1"])
        question = f"Say {colour}."
    return TrajectoryExample(
        case_id=case, question_id=f"{case}/q{number}", source_dataset="synthetic", namespace=case, question=question,
        question_time="", context="", answer=colour, reasoning_path=colour, graph=graph,
    )  # fmt: skip


def _task(root: Path, graph_answers: bool) -> Path:
    """Training conversations of four questions, one per colour; validation conversations of four questions each."""
    splits: dict[str, list[TrajectoryExample]] = {"train": [], "validation": []}
    for split, conversations in (("train", 6), ("validation", 4)):
        for c in range(conversations):
            case = f"{split}-{c}"
            for q, colour in enumerate(COLOURS):
                splits[split].append(_example(case, q, colour, ANIMALS[(c + 3 * q) % len(ANIMALS)], graph_answers))
    return write_trajectory_dataset(splits, root / "traj")


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny decoder with words for the synthetic tasks, published as a Hub id (an export names its base model so)."""
    corpus = [text for flag in (True, False) for ex in (_example("c", 0, col, a, flag) for col in COLOURS for a in ANIMALS)
              for text in (ex.question, ex.target_json(), *ex.graph.node_labels)]  # fmt: skip
    return publish_to_hub_cache(save_tiny_decoder(tmp_path_factory.mktemp("tiny") / "shuffle-gap-tiny", corpus, initializer_range=0.1))


def _fit(tiny_llm: str, root: Path, graph_answers: bool, **module: object) -> tuple[GraphAugmentedLM, L.Trainer]:
    L.seed_everything(0)
    data = TrajectoryDataModule(str(_task(root, graph_answers)), batch_size=4, shuffle_seed=0)
    settings = {**READABLE, "generation": {"val_generate": False}, "optim": {"warmup_fraction": 0.0, "min_lr_ratio": 1.0}, **module}
    model = GraphAugmentedLM(**tiny_module_kwargs(tiny_llm, data.feature_dim, **settings))  # type: ignore[arg-type]
    trainer = L.Trainer(
        accelerator="cpu", max_steps=FIT_STEPS, val_check_interval=FIT_STEPS, check_val_every_n_epoch=None, num_sanity_val_steps=0, logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root, gradient_clip_val=1.0,
        callbacks=[ModelCheckpoint(dirpath=root / "ckpt", save_last=True, monitor="val/loss")],
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    return model, trainer


@pytest.fixture(scope="module")
def graph_task(tiny_llm: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[GraphAugmentedLM, L.Trainer, Path]:
    root = tmp_path_factory.mktemp("graph-task")
    model, trainer = _fit(tiny_llm, root, graph_answers=True)
    return model, trainer, root


@pytest.mark.slow
def test_a_graph_that_holds_the_answer_shows_a_gap_above_zero(graph_task) -> None:
    model, trainer, _ = graph_task
    gap = float(trainer.callback_metrics["val/graph_shuffle_gap"])
    reading = model.graph_reading
    assert reading is not None and reading["shuffle_gap"] == pytest.approx(gap, abs=1e-6)
    assert reading["shuffle_gap_low"] > reading["floor"], reading
    assert reading["answer_shuffle_gap_low"] > reading["floor"], reading
    assert float(trainer.callback_metrics["val/graph_shuffle_gap_answer"]) == pytest.approx(reading["answer_shuffle_gap"], abs=1e-6)
    assert reading["examples"] == 16 and reading["conversations"] == 4 and reading["step"] == FIT_STEPS
    assert "val/graph_token_cosine" in trainer.callback_metrics and reading["token_cosine"] < 0.999


@pytest.mark.slow
def test_a_graph_irrelevant_to_the_answer_shows_a_gap_within_noise_of_zero(tiny_llm: str, tmp_path: Path) -> None:
    model, trainer = _fit(tiny_llm, tmp_path, graph_answers=False)
    reading = model.graph_reading
    assert reading is not None and float(trainer.callback_metrics["val/graph_shuffle_gap"]) == pytest.approx(reading["shuffle_gap"], abs=1e-6)
    for gap in ("shuffle_gap", "answer_shuffle_gap"):
        assert reading[f"{gap}_low"] <= 0.0 <= reading[f"{gap}_high"] or abs(reading[gap]) < reading["floor"], reading
    assert "carry" not in graph_reading_line(reading)


@pytest.mark.slow
def test_the_checkpoint_the_fit_line_and_the_model_card_carry_the_gap(graph_task, tiny_llm: str, tmp_path: Path) -> None:
    from export.package import export_model
    from qgmem_train.config import BUNDLED_EMBEDDER
    from qgmem_train.lightning_cli import summary

    model, trainer, root = graph_task
    checkpoint = torch.load(root / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    stored = checkpoint[METADATA_KEY]["graph_reading"]
    assert stored == model.graph_reading and stored["shuffle_gap"] > 0

    line = graph_reading_line(stored)
    lines = summary("fit", trainer).splitlines()
    assert lines[0].startswith(f"fit: {FIT_STEPS} steps") and lines[-1] == line and f"{stored['answer_shuffle_gap']:.3f} nats" in line

    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump({"pipeline": {"models": {"llm": tiny_llm, "embedder": BUNDLED_EMBEDDER, "reranker": "none"}}}))
    card = (export_model(root / "ckpt" / "last.ckpt", config, tmp_path / "export") / "README.md").read_text()
    assert line in card and "val/graph_shuffle_gap" in card and "val/graph_token_cosine" in card
    assert "`val/graph_shuffle_gap_answer`: the same on the answer's tokens alone" in card and f"{stored['answer_shuffle_gap']:+.4f}" in card


@pytest.mark.slow
def test_the_switch_turns_the_extra_pass_off_and_no_graph_is_skipped_with_a_reason(tiny_llm: str, tmp_path: Path) -> None:
    L.seed_everything(0)
    data = TrajectoryDataModule(str(_task(tmp_path, graph_answers=True)), batch_size=4)
    switches = (({"diagnostics": {"shuffle_gap": False}}, "model.diagnostics.shuffle_gap: false"), ({"readout": {"tokens": 0}, "lora": {"r": 2}}, "readout.tokens is 0"))
    for settings, says in switches:
        model = GraphAugmentedLM(**tiny_module_kwargs(tiny_llm, data.feature_dim, generation={"val_generate": False}, **settings))  # type: ignore[arg-type]
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        (metrics,) = trainer.validate(model, datamodule=data)
        assert "val/graph_shuffle_gap" not in metrics and says in graph_reading_line(model.graph_reading)
        has_tokens = "readout" not in settings
        assert (model.graph_reading.get("token_cosine") is not None) == has_tokens, "with the gap off the token cosine is kept"


class TokenizerOfTheLoaderOnly:
    """A tokenizer that works in the loader's worker processes and fails in the process that made it (the training one)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer, self._training_process = tokenizer, os.getpid()

    def _in_a_worker(self, what: str) -> None:
        if os.getpid() == self._training_process:
            raise AssertionError(f"the training process tokenised ({what})")

    def __getattr__(self, name: str) -> Any:
        self._in_a_worker(name)
        return getattr(self._tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._in_a_worker("__call__")
        return self._tokenizer(*args, **kwargs)


class TokenizeInWorkersOnly(L.Callback):
    """Once the data module is set up, the module's and the loader's tokenizers work only in the loader's workers."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        only = TokenizerOfTheLoaderOnly(pl_module.tokenizer)
        trainer.datamodule.prompt_tokens = replace(trainer.datamodule.prompt_tokens, tokenizer=only)
        pl_module.prompt_tokens, pl_module.tokenizer = replace(pl_module.prompt_tokens, tokenizer=only), only


def test_the_shuffle_gap_pass_is_tokenised_in_the_loader_workers(tiny_llm: str, tmp_path: Path) -> None:
    """The validation's own pass and its shuffled-graph pass read prompt ids and answer flags that the loader's worker built."""
    data = TrajectoryDataModule(str(_task(tmp_path, graph_answers=True)), batch_size=4, num_workers=1)
    model = GraphAugmentedLM(**tiny_module_kwargs(tiny_llm, data.feature_dim, **READABLE, generation={"val_generate": False}))  # type: ignore[arg-type]
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[TokenizeInWorkersOnly()],
    )  # fmt: skip
    (metrics,) = trainer.validate(model, datamodule=data)
    assert "val/graph_shuffle_gap" in metrics and "val/graph_shuffle_gap_answer" in metrics
    assert model.graph_reading["examples"] == 16 and model.graph_reading["answer_examples"] == 16
