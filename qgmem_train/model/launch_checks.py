"""Trainer settings a fit refuses before anything loads: ``*-true`` half precisions and stale Slurm requeue checkpoints.

Both fail late or silently otherwise: a true half precision casts the graph encoder while PyG batches stay
float32 (the first step fails on dtypes) and AdamW on half weights loses small updates; under Slurm, Lightning
resumes from any ``hpc_ckpt_*.ckpt`` in the root folder when no ``ckpt_path`` is given, even one of a finished job.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
