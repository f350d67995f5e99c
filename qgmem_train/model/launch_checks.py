"""Trainer settings a fit refuses: ``*-true`` half precisions, stale Slurm requeue checkpoints, validation or timed
checkpoints inside an accumulation window.

Each fails late or silently otherwise: a true half precision casts the graph encoder while PyG batches stay
float32 (the first step fails on dtypes) and AdamW on half weights loses small updates; under Slurm, Lightning
resumes from any ``hpc_ckpt_*.ckpt`` in the root folder when no ``ckpt_path`` is given, even one of a finished job;
a checkpoint saved by validation inside an accumulation window lacks the accumulated gradients, so resuming from
it is inexact. The first two are refused before anything loads, the last in ``setup``, from the training loader's
length, before the LLM loads on any rank.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
from lightning.pytorch.trainer.states import RunningStage
from torch.utils.data import DistributedSampler

from qgmem_train.errors import InputError

SUPPORTED_TRUE_PRECISIONS = {"32-true", "32"}
"""The one ``*-true`` precision that keeps the trainable weights and graph batches in float32."""


def refuse_true_precision(precision: Any) -> None:
    """One line for ``bf16-true``, ``16-true`` or ``64-true``: use ``bf16-mixed`` (the LLM's dtype is ``pipeline.models.dtype``)."""
    name = str(precision)
    if name in SUPPORTED_TRUE_PRECISIONS or not (name.endswith("-true") or name == "64"):
        return
    raise InputError(
        "trainer.precision",
        f"{name} casts the graph encoder and projector while graph batches stay float32 (the first step fails on dtypes), "
        "and AdamW on half-precision weights loses small updates; use bf16-mixed (the frozen LLM's own dtype is pipeline.models.dtype)",
    )


def stale_requeue_checkpoints(root: str | os.PathLike, ckpt_path: str | None) -> list[Path]:
    """The ``hpc_ckpt_*.ckpt`` in ``root`` that Lightning would resume from unasked: under Slurm, no ``ckpt_path``, first start of the job.

    A requeued job (``SLURM_RESTART_COUNT`` above 0) resumes its own checkpoint, which is what requeue is for.
    """
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if ckpt_path is not None or not SLURMEnvironment.detect() or int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:
        return []
    return sorted(Path(root).glob("hpc_ckpt_*.ckpt"))


def refuse_stale_requeue_checkpoints(root: str | os.PathLike, ckpt_path: str | None) -> None:
    """One line naming the stale checkpoint (see :func:`stale_requeue_checkpoints`) and what to do instead."""
    stale = stale_requeue_checkpoints(root, ckpt_path)
    if stale:
        raise InputError(
            str(stale[-1]),
            f"a requeue checkpoint of an earlier job ({len(stale)} in {root}): under Slurm Lightning resumes from it when no ckpt_path "
            "is given; to start over move the hpc_ckpt_*.ckpt files away or use another run folder, to resume pass --ckpt_path",
        )


class ValidationOnStepBoundaries(L.Callback):
    """Refuse a ``val_check_interval`` that validates (and checkpoints), or a timed checkpoint, inside an accumulation window."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        accumulate = trainer.accumulate_grad_batches
        if stage != "fit" or accumulate == 1:
            return
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback._train_time_interval is not None:
                raise InputError(
                    "checkpoint.train_time_interval",
                    f"saves on a timer, inside an accumulation window of {accumulate} too: such a checkpoint lacks the accumulated "
                    "gradients, so resuming from it is inexact; use checkpoint.every_n_train_steps",
                )
        if getattr(trainer, "_val_check_time_interval", None) is not None:
            raise InputError("trainer.val_check_interval", f"validates on a timer, inside an accumulation window of {accumulate} too; use a number of batches")
        batches, interval = training_batches(trainer), trainer.val_check_interval
        if not isinstance(interval, int) and batches == math.inf:
            return
        every = interval if isinstance(interval, int) else max(1, int(batches * interval))
        if every % accumulate and every < batches:
            raise InputError(
                "trainer.val_check_interval",
                f"validates every {every} batches, inside an accumulation window of {accumulate}: a checkpoint saved there lacks "
                f"the accumulated gradients, so resuming from it is inexact; use a multiple of {accumulate} batches",
            )


def training_batches(trainer: L.Trainer) -> int | float:
    """Training batches an epoch of this process will run, as Lightning will count them (``inf`` for a loader without length).

    A loader without a DistributedSampler gets one from Lightning on several ranks, which splits the dataset first.
    """
    loader = trainer.fit_loop._data_source.dataloader()
    try:
        batches = len(loader)
    except TypeError:
        return math.inf
    world = trainer.world_size
    if world > 1 and not isinstance(getattr(loader, "sampler", None), DistributedSampler) and getattr(loader, "batch_size", None):
        batches = math.ceil(math.ceil(len(loader.dataset) / world) / loader.batch_size)
    return _parse_num_batches(RunningStage.TRAINING, batches, trainer.limit_train_batches)
