"""LightningDataModule over a trajectory folder (``datasets`` save_to_disk) with deterministic splits.

The folder's own ``train``/``validation``/``test`` splits are used as they are; a folder with a single
split is divided by a hash of the case id, so a case never straddles two splits and the split does
not depend on row order. Node and edge labels are embedded once at setup with the retrieval embedder
and cached; batches carry the examples plus a torch_geometric ``Batch`` of their local graphs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler
from torch_geometric.data import Batch
from tqdm.auto import tqdm

from qgmem_train.config import BUNDLED_EMBEDDER
from qgmem_train.errors import InputError
from qgmem_train.graph.local_graph import graph_to_data
from qgmem_train.model.trajectory import TrajectoryExample, read_trajectory_dataset

SPLITS = ("train", "validation", "test")


class ResumableSampler(DistributedSampler):
    """Per-epoch seeded shuffle that starts where the run stands, so stopping and resuming sees the same batches.

    The position comes from ``position()`` (batches this process has consumed, i.e. the trainer's
    global step × gradient accumulation, restored from the checkpoint on resume): its epoch picks the
    permutation (``seed + epoch``), its offset skips the batches already trained on. Ranks take
    every ``world``-th index as DistributedSampler does, so a batch of B per process on W processes
    covers the same examples as one process with batch W × B. Being a DistributedSampler, Lightning
    leaves it in place under DDP.
    """

    def __init__(self, size: int, batch_size: int, world: int, rank: int, shuffle: bool, seed: int, position: Callable[[], int]) -> None:
        super().__init__(range(size), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size
        self.position = position

    def __iter__(self) -> Iterator[int]:
        batches_per_epoch = max(1, math.ceil(self.num_samples / self.batch_size))
        epoch, offset = divmod(self.position(), batches_per_epoch)
        size = len(self.dataset)
        if self.shuffle:
            order = torch.randperm(size, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        else:
            order = list(range(size))
        order += order[: self.total_size - size]
        mine = order[self.rank : self.total_size : self.num_replicas]
        return iter(mine[offset * self.batch_size :])


def split_of_case(case_id: str, validation_fraction: float, test_fraction: float) -> str:
    """Deterministic split of a case from the SHA-1 of its id: test, then validation, else train."""
    bucket = int(hashlib.sha1(case_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    if bucket < test_fraction:
        return "test"
    return "validation" if bucket < test_fraction + validation_fraction else "train"


class TrajectoryDataModule(L.LightningDataModule):
    """Trajectory batches ``{"examples": [...], "graph": Batch}`` with embedder features for the graphs."""

    def __init__(
        self,
        path: str,
        embedder: str = BUNDLED_EMBEDDER,
        embedder_revision: str | None = None,
        cache_dir: str | None = None,
        batch_size: int = 2,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        validation_fraction: float = 0.1,
        test_fraction: float = 0.1,
        shuffle: bool = True,
        shuffle_seed: int = 0,
        predict_split: str = "test",
        max_examples: int | None = None,
    ) -> None:
        """Load the embedder (its width becomes the model's ``feature_dim``).

        Args:
            path: folder written by data prep (``datasets`` DatasetDict or Dataset).
            embedder: sentence-embedder reference for node/edge features; linked from ``pipeline.models.embedder``.
            embedder_revision: hub revision of the embedder.
            cache_dir: cache of converted bundled models.
            batch_size: examples per training step and process.
            eval_batch_size: examples per validation/test/predict step (default: ``batch_size``).
            num_workers: DataLoader worker processes.
            validation_fraction: share of cases for validation when the folder has a single split.
            test_fraction: share of cases for test when the folder has a single split.
            shuffle: shuffle training examples (a fixed permutation per epoch and seed, so resumed runs match).
            shuffle_seed: seed of that permutation.
            predict_split: split that ``predict`` runs over.
            max_examples: keep at most this many examples per split (smoke runs).
        """
        super().__init__()
        from qgmem_train.llm.embedder import Embedder

        self.save_hyperparameters()
        self.embedder = Embedder(embedder, revision=embedder_revision, cache_dir=cache_dir)
        self.splits: dict[str, list[TrajectoryExample]] = {}
        self._features: dict[str, np.ndarray] = {}

    @property
    def feature_dim(self) -> int:
        """Width of node and edge features: the embedder's dimension."""
        return self.embedder.dim

    def setup(self, stage: str | None = None) -> None:
        """Read and split the folder, then embed every distinct label once."""
        if self.splits:
            return
        loaded = read_trajectory_dataset(self.hparams.path)
        if set(loaded) & set(SPLITS):
            splits = {name: loaded.get(name, []) for name in SPLITS}
        else:
            rows = [ex for part in loaded.values() for ex in part]
            splits = {name: [] for name in SPLITS}
            for ex in rows:
                splits[split_of_case(ex.case_id, self.hparams.validation_fraction, self.hparams.test_fraction)].append(ex)
        limit = self.hparams.max_examples
        self.splits = {name: part[:limit] if limit else part for name, part in splits.items()}
        if not self.splits["train"] and stage in (None, "fit"):
            raise InputError(f"{self.hparams.path}", "no training examples in the train split")
        labels = sorted({label for part in self.splits.values() for ex in part for label in ex.graph.node_labels + ex.graph.edge_labels})
        self._features = self._embed(labels)

    def _embed(self, labels: list[str]) -> dict[str, np.ndarray]:
        batch = 256
        rows = [self.embedder.encode(labels[i : i + batch]) for i in tqdm(range(0, len(labels), batch), desc="embedding graph labels", disable=len(labels) <= batch)]
        matrix = np.concatenate(rows) if rows else np.zeros((0, self.feature_dim), dtype=np.float32)
        return dict(zip(labels, matrix))

    def _label_features(self, labels: list[str]) -> np.ndarray:
        return np.stack([self._features[label] for label in labels])

    def collate(self, examples: list[TrajectoryExample]) -> dict[str, Any]:
        """The examples plus the ``Batch`` of their local graphs with cached label features."""
        graphs = [graph_to_data(ex.graph, self._label_features, self.feature_dim) for ex in examples]
        return {"examples": examples, "graph": Batch.from_data_list(graphs)}

    def train_dataloader(self) -> DataLoader:
        data = self.splits["train"]
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        sampler = ResumableSampler(
            len(data), self.hparams.batch_size, world, rank, self.hparams.shuffle, self.hparams.shuffle_seed, self._batches_consumed
        )
        return self._loader(data, self.hparams.batch_size, sampler)

    def _batches_consumed(self) -> int:
        """Training batches this process has consumed in the run (restored from the checkpoint on resume)."""
        if self.trainer is None:
            return 0
        return self.trainer.global_step * self.trainer.accumulate_grad_batches

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.splits["validation"], self._eval_batch_size())

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.splits["test"], self._eval_batch_size())

    def predict_dataloader(self) -> DataLoader:
        if self.hparams.predict_split not in self.splits:
            raise InputError("data.predict_split", f"unknown split {self.hparams.predict_split!r} (one of {', '.join(SPLITS)})")
        return self._loader(self.splits[self.hparams.predict_split], self._eval_batch_size())

    def _eval_batch_size(self) -> int:
        return self.hparams.eval_batch_size or self.hparams.batch_size

    def _loader(self, data: list[TrajectoryExample], batch_size: int, sampler: Any = None) -> DataLoader:
        return DataLoader(data, batch_size=batch_size, sampler=sampler, collate_fn=self.collate, num_workers=self.hparams.num_workers)
