"""Exact resume: every example once per epoch under gradient accumulation, a resumed run equal to an uninterrupted one.

Seven training batches an epoch with ``accumulate_grad_batches=4`` make two optimizer steps an epoch, the
second over a partial accumulation of three batches, so a position counted in optimizer steps drifts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.model.datamodule import ResumableSampler, TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.trajectory import TrajectoryExample, write_trajectory_dataset
from tests.tiny_decoder import save_tiny_decoder, tiny_module_kwargs

PEOPLE = ["Alice", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kemal", "Lena", "Mads"]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Quito", "Accra", "Hanoi", "Porto", "Cairo", "Dhaka", "Perth", "Turin"]
ACCUMULATE = 4
EPOCH_BATCHES = 7
"""Batches of one example an epoch: 7 = 4 + a partial accumulation of 3."""
TOTAL_STEPS = 4
"""Two epochs: two optimizer steps each."""
CONSTANT_RATE = {"optim": {"warmup_fraction": 0.0, "min_lr_ratio": 1.0}, "generation": {"max_new_tokens": 32}}
"""A learning rate that does not depend on the run's length, so a run stopped at ``max_steps`` trains like a longer one."""


def _example(i: int) -> TrajectoryExample:
    person, city = PEOPLE[i], CITIES[i]
    graph = LocalGraph(node_labels=[person, city], edge_src=[0], edge_dst=[1], edge_labels=["moved to"], edge_unit_labels=["F1"])
    return TrajectoryExample(
        case_id=f"case-{i}", question_id=f"q{i}", source_dataset="convomem/user_evidence", namespace=f"case-{i}",
        question=f"Where does {person} live?", question_time="2023-06-01", context=f"Facts:\n[F1] {person} | moved to | {city}",
        answer=city, reasoning_path=f"F1 says {person} moved to {city}.", graph=graph, unit_ids=["u1"],
    )


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> tuple[Path, Path]:
    """A 13-example train split and a tiny decoder whose tokenizer knows its texts."""
    root = tmp_path_factory.mktemp("resume")
    examples = [_example(i) for i in range(len(PEOPLE))]
    data = write_trajectory_dataset({"train": examples}, root / "traj")
    corpus = [text for ex in examples for text in (ex.question, ex.context, ex.target_json())]
    return data, save_tiny_decoder(root / "tiny", corpus)


class _Batches(Callback):
    """``(epoch, batch_idx, question ids, loss)`` of every training batch."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, list[str], float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rows.append((trainer.current_epoch, batch_idx, [ex.question_id for ex in batch["examples"]], float(outputs["loss"])))


def _fit(assets, root: Path, ckpt_path: str | None = None, max_steps: int = TOTAL_STEPS, **data_overrides: Any) -> list:
    """Rows of :class:`_Batches` of a run of at most two epochs (bounded: a sampler that skips batches can starve the optimizer)."""
    data_path, llm_dir = assets
    L.seed_everything(0)
    settings: dict[str, Any] = dict(batch_size=1, max_examples=EPOCH_BATCHES)
    settings.update(data_overrides)
    data = TrajectoryDataModule(str(data_path), **settings)
    torch.manual_seed(0)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, **CONSTANT_RATE))
    batches = _Batches()
    every_step = ModelCheckpoint(dirpath=root / "ckpt", filename="{step}", every_n_train_steps=1, save_top_k=-1, save_last=True)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=max_steps, max_epochs=2, accumulate_grad_batches=ACCUMULATE, limit_val_batches=0,
        logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root, callbacks=[batches, every_step],
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return batches.rows


def _same_run(resumed: list, straight: list) -> None:
    assert [row[:3] for row in resumed] == [row[:3] for row in straight]
    assert [row[3] for row in resumed] == pytest.approx([row[3] for row in straight], abs=1e-5)


@pytest.fixture(scope="module")
def straight(assets, tmp_path_factory) -> tuple[list, Path]:
    """The uninterrupted two-epoch run and the folder of its every-step checkpoints."""
    root = tmp_path_factory.mktemp("straight")
    return _fit(assets, root), root / "ckpt"


def test_every_example_once_per_epoch_with_a_partial_last_accumulation(assets, straight, tmp_path) -> None:
    """Batches of 1 over 7 examples, and batches of 2 over 13: 7 batches an epoch either way."""
    pairs = _fit(assets, tmp_path, max_steps=-1, batch_size=2, max_examples=13)
    for rows, examples in ((straight[0], EPOCH_BATCHES), (pairs, 13)):
        assert len(rows) == 2 * EPOCH_BATCHES
        for epoch in (0, 1):
            seen = [qid for row in rows if row[0] == epoch for qid in row[2]]
            assert sorted(seen) == sorted(f"q{i}" for i in range(examples)), f"{examples} examples, epoch {epoch}"


@pytest.mark.parametrize(
    ("checkpoint", "remaining"),
    [("step=2", 7), ("step=3", 3)],
    ids=["after-the-partial-accumulation", "mid-second-epoch"],
)
def test_resume_from_a_step_checkpoint_equals_the_uninterrupted_run(assets, straight, tmp_path, checkpoint, remaining) -> None:
    rows, checkpoints = straight
    resumed = _fit(assets, tmp_path, ckpt_path=str(checkpoints / f"{checkpoint}.ckpt"))
    assert len(resumed) == remaining
    _same_run(resumed, rows[-remaining:])


@pytest.mark.parametrize("stop", [2, 3], ids=["stopped-at-an-epoch-end", "stopped-mid-epoch"])
def test_resume_from_a_max_steps_checkpoint_equals_the_uninterrupted_run(assets, straight, tmp_path, stop) -> None:
    first = _fit(assets, tmp_path, max_steps=stop)
    second = _fit(assets, tmp_path, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    _same_run(first + second, straight[0])


def test_resume_with_loader_workers_equals_the_uninterrupted_run(assets, straight, tmp_path) -> None:
    """Workers draw indices when Lightning makes the iterator, before it has restored where the epoch stands."""
    rows, checkpoints = straight
    resumed = _fit(assets, tmp_path, ckpt_path=str(checkpoints / "step=2.ckpt"), num_workers=2)
    _same_run(resumed, rows[-EPOCH_BATCHES:])


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_split_each_batch_like_one_process_with_the_whole_batch(world) -> None:
    """Rank r takes every world-th index, so W ranks with batch B see what one process with batch W × B sees."""
    size, batch, epoch, done = 11, 2, 3, 1

    def indices(world_size: int, rank: int, batch_size: int) -> list[int]:
        return list(ResumableSampler(size, batch_size, world_size, rank, True, 0, lambda: (epoch, done)))

    ranks = [indices(world, rank, batch) for rank in range(world)]
    whole = indices(1, 0, world * batch)
    interleaved = [ranks[r][i] for i in range(len(ranks[0])) for r in range(world)]
    assert interleaved[: len(whole)] == whole
    assert len(ranks[0]) == ResumableSampler(size, batch, world, 0, True, 0, lambda: (epoch, 0)).num_samples - done * batch


def test_graph_labels_are_embedded_on_the_trainers_device_which_the_embedder_then_leaves(assets, monkeypatch) -> None:
    data = TrajectoryDataModule(str(assets[0]))
    placed: list[torch.device] = []
    model = data.embedder.model
    monkeypatch.setattr(model, "to", lambda device: placed.append(torch.device(device)) or model)
    encoded: list[int] = []
    encode = data.embedder.encode
    monkeypatch.setattr(data.embedder, "encode", lambda texts: encoded.append(len(placed)) or encode(texts))
    strategy = type("Strategy", (), {"root_device": torch.device("cuda", 3)})()
    # what setup reads of a one-rank trainer: its strategy's device, its module (no prompt tokens), its ranks and validation
    data.trainer = type("Trainer", (), {"strategy": strategy, "lightning_module": None, "world_size": 1, "limit_val_batches": 1.0})()
    data.setup("fit")
    assert placed == [torch.device("cuda", 3), torch.device("cpu")], "the embedder leaves the GPU once the labels are cached"
    assert encoded and all(count == 1 for count in encoded), "labels are embedded between the two moves"
