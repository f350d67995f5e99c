"""Slurm's requeue signal and SIGTERM handled at a step boundary: the handlers only set a flag, the ranks save together.

Lightning's own handlers act inside the signal handler, wherever each process is: on the requeue signal it saves
``hpc_ckpt_N.ckpt`` and runs ``scontrol requeue``, on SIGTERM it broadcasts a tensor; a forked DataLoader worker
inherits the handler and joins in, and one rank's barrier or broadcast can meet another rank's gradient all-reduce
(Lightning issue #21406). Here the handlers record the signal in the training process only (workers ignore it);
after each optimizer step, and after each validation batch that every rank runs, the ranks agree (one all-reduce)
whether any of them was signalled, and if so all save the same checkpoint. On the requeue signal rank 0 then
requeues the job and every rank waits for Slurm to stop it; on SIGTERM (``scancel``, preemption) the fit ends.
A validation pass changes no weights, so a save in it holds the step boundary the pass started from; resuming
from it runs that pass again from its start, then trains on.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import subprocess
import threading
import time
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from qgmem_train.model.rank_exit import ExitOnFault

log = logging.getLogger(__name__)

REQUEUE, TERMINATE = 1, 2
"""What a rank was signalled to do; the ranks agree on the largest (a SIGTERM anywhere ends the fit)."""


class StepBoundaryRequeue(L.Callback):
    """Save at the optimizer step (or validation batch) after a signal: then requeue (Slurm's requeue signal, with auto-requeue) or end (SIGTERM)."""

    def __init__(self) -> None:
        self.requested = 0
        self._pid: int | None = None
        self._originals: dict[int, Any] = {}
        self._shared_val_batches = 0
        self.stopped_validation_at: int | None = None
        """The step whose validation pass a signal stopped and saved in (kept in the checkpoint): run it again on resume."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Install the requeue signal's handler before Lightning's signal set-up, which then leaves that signal alone."""
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        self.requested, self._pid = 0, os.getpid()
        self._originals = {signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
        environment = trainer._accelerator_connector.cluster_environment
        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
            requeue_signal = int(environment.requeue_signal or signal.SIGUSR1)
            self._originals[requeue_signal] = signal.signal(requeue_signal, self._note_requeue)

    def _install_sigterm(self) -> None:
        """Replace the SIGTERM handler that Lightning installs on every fit, before any loader worker is forked."""
        if self._pid == os.getpid() and signal.getsignal(signal.SIGTERM) != self._note_sigterm:
            signal.signal(signal.SIGTERM, self._note_sigterm)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install_sigterm()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install_sigterm()
        if self.stopped_validation_at is not None:
            self._validate_again(trainer)

    def _validate_again(self, trainer: L.Trainer) -> None:
        """Resumed from a checkpoint saved in a stopped validation pass: run that pass again before training on."""
        if trainer.is_global_zero:
            log.warning(f"resuming: the validation at step {self.stopped_validation_at} was stopped by a signal; running it again")
        self.stopped_validation_at = None
        epoch_loop = trainer.fit_loop.epoch_loop
        epoch_loop.val_loop.restarting = False
        trainer.validating = True
        epoch_loop.val_loop.run()
        trainer.training = True

    def state_dict(self) -> dict[str, Any]:
        return {"stopped_validation_at": self.stopped_validation_at}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stopped_validation_at = state_dict.get("stopped_validation_at")

    def _note_requeue(self, signum: int, frame: FrameType | None) -> None:
        """Record the requeue signal in the training process; a forked DataLoader worker inherits this handler and does nothing."""
        if os.getpid() == self._pid:
            self.requested = max(self.requested, REQUEUE)

    def _note_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Record SIGTERM in the training process; a forked DataLoader worker ignores it (it ends with the training process)."""
        if os.getpid() == self._pid:
            self.requested = TERMINATE

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After an optimizer step, on every rank at once."""
        if self._pid is not None and not trainer.fit_loop.epoch_loop._should_accumulate():
            self._act_on_signals(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Agree on the validation batches every rank runs of every loader (the ranks' shares of a split may differ by one batch)."""
        self._shared_val_batches = 0
        if self._pid is not None and trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            batches = min(trainer.num_val_batches, default=0)
            mine = torch.tensor(int(batches) if math.isfinite(batches) else 0, device=trainer.strategy.root_device)
            self._shared_val_batches = int(trainer.strategy.reduce(mine, reduce_op="min"))

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After a validation batch that every rank runs: the pass stops here when a rank was signalled."""
        if batch_idx < self._shared_val_batches:
            self._act_on_signals(trainer)

    def _act_on_signals(self, trainer: L.Trainer) -> None:
        """When any rank was signalled: every rank saves ``hpc_ckpt_N.ckpt``, then ends the fit (SIGTERM) or requeues and waits."""
        flags = torch.tensor(self.requested, device=trainer.strategy.root_device)
        decision = int(trainer.strategy.reduce(flags, reduce_op="max"))
        if not decision:
            return
        path = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
        for logger in trainer.loggers:
            logger.finalize("finished")
        self.stopped_validation_at = trainer.global_step if trainer.validating else None
        trainer.save_checkpoint(path)
        self.stopped_validation_at = None
        if decision == TERMINATE:
            log.info(f"saved {path} at step {trainer.global_step} on SIGTERM: ending the fit")
            raise SIGTERMException(128 + signal.SIGTERM)
        requeued = trainer.strategy.broadcast(requeue_job() if trainer.is_global_zero else False, src=0)
        if not requeued:
            self.requested = 0
            return
        log.info(f"saved {path} at step {trainer.global_step} and requeued the job: waiting for Slurm to stop this step")
        for callback in trainer.callbacks:
            if isinstance(callback, ExitOnFault):
                callback.beat("the wait for Slurm to stop the requeued job")
        while True:
            time.sleep(1)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Give the signals their handlers from before the fit back."""
        if self._pid == os.getpid():
            for signum, handler in self._originals.items():
                signal.signal(signum, handler)
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
