"""Trainer settings a fit refuses: ``*-true`` half precisions, stale Slurm requeue checkpoints, validation inside an
accumulation window.

Each fails late or silently otherwise: a true half precision casts the graph encoder while PyG batches stay
float32 (the first step fails on dtypes) and AdamW on half weights loses small updates; under Slurm, Lightning
resumes from any ``hpc_ckpt_*.ckpt`` in the root folder when no ``ckpt_path`` is given, even one of a finished job;
a checkpoint saved by validation inside an accumulation window lacks the accumulated gradients, so resuming from
it is inexact. The first two are refused before anything loads, the last once Lightning knows the epoch's batches.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L

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
    """Refuse a ``val_check_interval`` that validates (and checkpoints) inside an accumulation window."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        accumulate, every = trainer.accumulate_grad_batches, trainer.val_check_batch
        if accumulate > 1 and isinstance(every, int) and every % accumulate and every < trainer.num_training_batches:
            raise InputError(
                "trainer.val_check_interval",
                f"validates every {every} batches, inside an accumulation window of {accumulate}: a checkpoint saved there lacks "
                f"the accumulated gradients, so resuming from it is inexact; use a multiple of {accumulate} batches",
            )
