"""Slurm's requeue signal handled at a step boundary: the handler only sets a flag, the ranks save together.

Lightning's own handler saves ``hpc_ckpt_N.ckpt`` and runs ``scontrol requeue`` inside the signal handler, wherever
each process is: a forked DataLoader worker (which inherits the handler) then calls ``save_checkpoint`` and its
barrier, and one rank's barrier can meet another rank's gradient all-reduce (Lightning issue #21406). Here the
handler records the signal in the training process only; after each optimizer step the ranks agree (one
all-reduce of a flag) whether any of them was signalled, and if so all save the same checkpoint, rank 0 requeues
the job, and every rank waits for Slurm to stop it, so no collective and no file write is cut off half-way.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
import time
from types import FrameType
from typing import Any

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment

log = logging.getLogger(__name__)


class StepBoundaryRequeue(L.Callback):
    """Under Slurm with auto-requeue, save ``hpc_ckpt_N.ckpt`` and requeue at the optimizer step after the signal."""

    def __init__(self) -> None:
        self.requested = False
        self._pid: int | None = None
        self._signal: int | None = None
        self._previous: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Install the flag-setting handler before Lightning's signal set-up, which then leaves the signal alone."""
        environment = trainer._accelerator_connector.cluster_environment
        if stage != "fit" or not isinstance(environment, SLURMEnvironment) or not environment.auto_requeue:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        self.requested, self._pid, self._signal = False, os.getpid(), int(environment.requeue_signal or signal.SIGUSR1)
        self._previous = signal.signal(self._signal, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        """Record the signal in the training process; a forked DataLoader worker inherits this handler and does nothing."""
        if os.getpid() == self._pid:
            self.requested = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After an optimizer step, on every rank at once: save and requeue when any rank was signalled."""
        if self._pid is None or trainer.fit_loop.epoch_loop._should_accumulate():
            return
        if not trainer.strategy.reduce_boolean_decision(self.requested, all=False):
            return
        path = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
        for logger in trainer.loggers:
            logger.finalize("finished")
        trainer.save_checkpoint(path)
        requeued = trainer.strategy.broadcast(requeue_job() if trainer.is_global_zero else False, src=0)
        if not requeued:
            self.requested = False
            return
        log.info(f"saved {path} at step {trainer.global_step} and requeued the job: waiting for Slurm to stop this step")
        while True:
            time.sleep(1)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Give the signal its previous handler back."""
        if self._pid == os.getpid() and self._signal is not None:
            signal.signal(self._signal, self._previous)
        self._pid = None


def requeue_job() -> bool:
    """``scontrol requeue`` this job (or array task); whether Slurm accepted it."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]
    if not re.fullmatch(r"[0-9_]+", job):
        log.warning(f"not requeueing: Slurm job id {job!r} is not a number")
        return False
    result = subprocess.run(["scontrol", "requeue", job], check=False)
    if result.returncode != 0:
        log.warning(f"requeueing Slurm job {job} failed with exit code {result.returncode}: training goes on")
        return False
    log.info(f"Requeued SLURM job: {job}")
    return True
