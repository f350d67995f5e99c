"""LightningDataModule over a trajectory folder (``datasets`` save_to_disk) with deterministic splits.

The folder's own ``train``/``validation``/``test`` splits are used as they are; a folder with a single
split is divided by a hash of the case id, so a case never straddles two splits and the split does
not depend on row order. Node and edge labels, and the questions, are embedded once at setup with the retrieval
embedder and cached; batches carry the examples plus a torch_geometric ``Batch`` of their local graphs, each with
its question's embedding (``question_embedding``, read by the ``query`` readout).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler
from torch_geometric.data import Batch
from tqdm.auto import tqdm

from qgmem_train.config import BUNDLED_EMBEDDER, refuse_other_graph_settings
from qgmem_train.errors import InputError
from qgmem_train.graph.local_graph import LocalGraph, graph_to_data
from qgmem_train.graph.shuffle_gap import graph_donors
from qgmem_train.model.prompt_tokens import PromptTokens
from qgmem_train.trajectory import TrajectoryExample, read_trajectory_dataset, split_of_case, trajectory_graph_settings

SPLITS = ("train", "validation", "test")


class ResumableSampler(DistributedSampler):
    """Per-epoch seeded shuffle that starts at the batch training is about to run, so a resumed run sees what an uninterrupted one would.

    ``position()`` gives ``(epoch, batches)``: the epoch being trained and how many of its batches this
    process has already trained (``None``: not training; then the epoch of ``set_epoch`` and no skip, as a
    plain DistributedSampler). The epoch picks the permutation (``seed + epoch``); the batches are skipped,
    and an epoch already fully trained yields nothing (resuming from a checkpoint saved at ``max_steps`` at
    an epoch's end, Lightning asks that epoch for one more batch). ``position()`` is read when the first index is
    drawn, not when ``iter()`` is called. Ranks take every ``world``-th index as DistributedSampler does,
    so a batch of B per process on W processes covers the same examples as one process with batch W × B.
    Being a DistributedSampler, Lightning leaves it in place under DDP.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        world: int,
        rank: int,
        shuffle: bool,
        seed: int,
        position: Callable[[], tuple[int, int] | None] | None = None,
    ) -> None:
        super().__init__(range(size), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size
        self.position = position

    def __iter__(self) -> Iterator[int]:
        # A generator: nothing below runs before the first index is drawn.
        where = self.position() if self.position is not None else None
        epoch, done = where if where is not None else (self.epoch, 0)
        size = len(self.dataset)
        if self.shuffle:
            order = torch.randperm(size, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        else:
            order = list(range(size))
        order += order[: self.total_size - size]
        mine = order[self.rank : self.total_size : self.num_replicas]
        yield from mine[done * self.batch_size :]


class FirstDrawDataLoader(DataLoader):
    """A DataLoader whose iterator (its worker processes, its sampler) starts at the first batch drawn, not at ``iter()``.

    Lightning 2.6's fit loop calls ``iter()`` on the training loader in ``FitLoop.setup_data``, on resume
    before it has finished restoring where the run stands (the epoch counter and the batch progress are
    adjusted afterwards, in the loops' ``reset``); worker processes draw their first indices as soon as the
    iterator exists, so a :class:`ResumableSampler` asked then would read the checkpoint's raw counters.
    """

    def __iter__(self) -> Iterator[Any]:
        # A generator: the real iterator is made when Lightning draws the first batch.
        yield from super().__iter__()


def ignore_sigterm(worker_id: int) -> None:
    """DataLoader worker start-up: ignore the SIGTERM that Slurm sends to every process of a step (``scancel``, preemption),
    but end on one from the training process.

    PyTorch's workers die on a SIGTERM that their parent did not send, so the training process would fail on its next
    batch instead of reaching the step boundary where it saves (:mod:`qgmem_train.model.requeue`). The training process
    itself ends workers it could not stop otherwise with SIGTERM (``multiprocessing`` does so at exit, then joins them):
    ignored, that exit would wait forever. So the signal is blocked and a thread reads each one with its sender.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_end_on_sigterm_from, args=(os.getppid(),), name="sigterm-from-parent", daemon=True).start()


def _end_on_sigterm_from(parent: int) -> None:
    """Wait for SIGTERMs (blocked in every thread of the worker); end the worker quietly at the first that ``parent`` sent."""
    while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent:
        pass
    os._exit(0)


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
        graph: dict[str, Any] | None = None,
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
            shuffle: shuffle training examples (a fixed permutation per epoch and seed, so a resumed run matches an uninterrupted one).
            shuffle_seed: seed of that permutation.
            predict_split: split that ``predict`` runs over.
            max_examples: keep at most this many examples per split (smoke runs).
            graph: the ``graph.*`` settings the trajectories' graphs were built with (:class:`~qgmem_train.config.GraphConfig`
                as a mapping); linked from ``pipeline.graph``, recorded in every checkpoint (``datamodule_hyper_parameters``,
                which the export checks its config against), and a checkpoint of other settings is refused on resume.
        """
        super().__init__()
        from qgmem_train.llm.embedder import Embedder

        self.save_hyperparameters()
        self.embedder = Embedder(embedder, revision=embedder_revision, cache_dir=cache_dir)
        self.splits: dict[str, list[TrajectoryExample]] = {}
        self._features: dict[str, np.ndarray] = {}
        self._questions: dict[str, np.ndarray] = {}
        self.prompt_tokens: PromptTokens | None = None
        self.shuffled_graphs = False
        """Whether validation and test batches also carry their examples with other examples' graphs (``shuffled``): set
        under a trainer whose module measures the shuffle gap (``wants_shuffled_graphs``)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the data: the ``graph.*`` settings, checked again on resume (:meth:`load_state_dict`)."""
        return {"graph": self.hparams.graph}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse to go on from a checkpoint whose graph settings are not this config's (None: not recorded, either side):
        its graph path learned graphs built otherwise, as a checkpoint of another base model is refused."""
        refuse_other_graph_settings(state_dict.get("graph"), self.hparams.graph, "pipeline.graph")

    @property
    def feature_dim(self) -> int:
        """Width of node and edge features: the embedder's dimension."""
        return self.embedder.dim

    def setup(self, stage: str | None = None) -> None:
        """Read and split the folder, then embed every distinct label once, on this process's device when a trainer runs it
        (the embedder goes back to the CPU afterwards). Under a trainer of several ranks, an evaluation split with fewer
        examples than ranks is refused first (see :meth:`_refuse_splits_smaller_than_the_ranks`). Under a trainer whose module
        tokenises prompts (``prompt_tokens``), batches carry their ids, computed in the loader's workers; under one that
        measures the shuffle gap, evaluation batches carry the shuffled pass's batch too (:meth:`collate`)."""
        if self.trainer is not None:
            self.prompt_tokens = getattr(self.trainer.lightning_module, "prompt_tokens", None)
            self.shuffled_graphs = bool(getattr(self.trainer.lightning_module, "wants_shuffled_graphs", False))
        if self.splits:
            self._refuse_splits_smaller_than_the_ranks(stage)
            return
        refuse_other_graph_settings(
            trajectory_graph_settings(self.hparams.path), self.hparams.graph, "pipeline.graph", f"the trajectories at {self.hparams.path} were built"
        )
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
        self._refuse_splits_smaller_than_the_ranks(stage)
        labels = sorted({label for part in self.splits.values() for ex in part for label in ex.graph.node_labels + ex.graph.edge_labels})
        if self.trainer is not None:
            # setup runs after the strategy has set up this process's environment, so root_device is this rank's device
            self.embedder.model.to(self.trainer.strategy.root_device)
        self._features = self._embed(labels)
        self._questions = self._embed(sorted({ex.question for part in self.splits.values() for ex in part}))
        if self.trainer is not None:
            # the features are cached: the embedder's weights leave the GPU to the frozen LLM and its activations
            self.embedder.model.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _refuse_splits_smaller_than_the_ranks(self, stage: str | None) -> None:
        """One line for a validation or test split of this stage with fewer examples than ranks, before any model loads.

        Each example is evaluated on exactly one rank (:meth:`_eval_sampler`), so a rank would get none and its sampler
        asserts, after every rank has loaded the LLM. An empty split is no error: Lightning skips its loop.
        """
        world = self.trainer.world_size if self.trainer is not None else 1
        for name in {"fit": ["validation"], "validate": ["validation"], "test": ["test"]}.get(stage or "", ["validation", "test"]):
            if stage == "fit" and self.trainer is not None and self.trainer.limit_val_batches == 0:
                continue  # a fit that never validates
            size = len(self.splits[name])
            if 0 < size < world:
                raise InputError(
                    f"{self.hparams.path} {name} split",
                    f"{size} example{'s' if size > 1 else ''} for {world} ranks: each example is evaluated on one rank and every rank "
                    "needs one; give the split more examples (data.max_examples, data.validation_fraction) or run fewer ranks",
                )

    def _embed(self, labels: list[str]) -> dict[str, np.ndarray]:
        batch = 256
        rows = [self.embedder.encode(labels[i : i + batch]) for i in tqdm(range(0, len(labels), batch), desc="embedding graph labels and questions", disable=len(labels) <= batch)]
        matrix = np.concatenate(rows) if rows else np.zeros((0, self.feature_dim), dtype=np.float32)
        return dict(zip(labels, matrix))

    def _label_features(self, labels: list[str]) -> np.ndarray:
        return np.stack([self._features[label] for label in labels])

    def collate(self, examples: list[TrajectoryExample], donors: Mapping[tuple[str, str], LocalGraph] | None = None) -> dict[str, Any]:
        """The examples plus the ``Batch`` of their local graphs with cached label features and question embeddings, and
        with :attr:`prompt_tokens` set, the examples' prompt and target ids and answer-span flags (``prompts``, ``targets``,
        ``answer_masks``). With ``donors`` (each example's donor graph by case and question id, :meth:`donor_graphs`), also
        ``shuffled``: the batch of the same examples with those graphs, which the shuffle gap's extra loss pass reads, so
        that its prompts are tokenised here, in the loader's workers, too.

        A question met after setup (an example swapped in by the caller) is embedded then.
        """
        missing = sorted({ex.question for ex in examples} - set(self._questions))
        if missing:
            self._questions.update(zip(missing, self.embedder.encode(missing)))
        graphs = [graph_to_data(ex.graph, self._label_features, self.feature_dim, self._questions[ex.question]) for ex in examples]
        ids = self.prompt_tokens.batch(examples) if self.prompt_tokens is not None else {}
        batch = {"examples": examples, "graph": Batch.from_data_list(graphs), **ids}
        if donors:
            batch["shuffled"] = self.collate([replace(ex, graph=donors[(ex.case_id, ex.question_id)]) for ex in examples])
        return batch

    def donor_graphs(self, examples: list[TrajectoryExample]) -> dict[tuple[str, str], LocalGraph] | None:
        """Each example's donor graph for the shuffle gap (:func:`~qgmem_train.graph.shuffle_gap.graph_donors` over the whole
        split, so the same on every rank), or ``None`` where :attr:`shuffled_graphs` is off or the split has one example."""
        if not self.shuffled_graphs or len(examples) < 2:
            return None
        donors = graph_donors([ex.case_id for ex in examples])
        return {(ex.case_id, ex.question_id): examples[d].graph for ex, d in zip(examples, donors) if d is not None}

    def train_dataloader(self) -> DataLoader:
        """Training batches from where the fit loop stands (see :class:`ResumableSampler`)."""
        data = self.splits["train"]
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        hp = self.hparams
        sampler = ResumableSampler(len(data), hp.batch_size, world, rank, hp.shuffle, hp.shuffle_seed, self._position)
        return self._loader(data, hp.batch_size, sampler, loader=FirstDrawDataLoader)

    def _position(self) -> tuple[int, int] | None:
        """``(epoch, batches of it trained)`` from the fit loop's progress (restored on resume), or None when not training.

        The epoch is ``trainer.current_epoch`` (the fit loop's completed epochs), not the value Lightning
        passes to ``set_epoch``: resuming from a checkpoint saved at ``max_steps`` mid-epoch, Lightning
        finishes that epoch while ``set_epoch`` already says the next one. The batches are the epoch
        loop's ``batch_progress.current.ready``, which at the first draw of an epoch is the index of the
        batch Lightning is about to run: 0 in a new epoch, the batches trained so far on resume (also after
        a partial last accumulation, where counting optimizer steps × accumulation would drift).
        """
        trainer = self.trainer
        if trainer is None or not trainer.training:
            return None
        return trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_progress.current.ready

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.splits["validation"])

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.splits["test"])

    def _eval_loader(self, data: list[TrajectoryExample]) -> DataLoader:
        """Batches of an evaluated split, with the shuffle gap's donor graphs where :meth:`donor_graphs` gives some."""
        return self._loader(data, self._eval_batch_size(), self._eval_sampler(data), donors=self.donor_graphs(data))

    def _eval_sampler(self, data: list[TrajectoryExample]) -> DistributedSampler | None:
        """Every example on exactly one rank: Lightning's default DistributedSampler pads a split that does not divide by
        the ranks with repeated examples, counted twice in the metrics (the ranks' batch counts may then differ by one)."""
        if self.trainer is None or self.trainer.world_size == 1:
            return None
        from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

        return UnrepeatedDistributedSampler(data, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        if self.hparams.predict_split not in self.splits:
            raise InputError("data.predict_split", f"unknown split {self.hparams.predict_split!r} (one of {', '.join(SPLITS)})")
        return self._loader(self.splits[self.hparams.predict_split], self._eval_batch_size())

    def _eval_batch_size(self) -> int:
        return self.hparams.eval_batch_size or self.hparams.batch_size

    def _loader(
        self, data: list[TrajectoryExample], batch_size: int, sampler: Any = None, loader: type = DataLoader, donors: Mapping[tuple[str, str], LocalGraph] | None = None
    ) -> DataLoader:  # fmt: skip
        workers = self.hparams.num_workers
        init = ignore_sigterm if workers else None
        collate = partial(self.collate, donors=donors) if donors else self.collate
        return loader(data, batch_size=batch_size, sampler=sampler, collate_fn=collate, num_workers=workers, worker_init_fn=init)
