"""Every rank ends on every fault: loader workers shut down on an exception, and a watchdog ends a rank that stalls.

An exception (SIGTERM's included) raised mid-validation leaves the training loader's workers running: Lightning tears
down only the loop that is active, the validation loop, and at exit ``multiprocessing`` joins the workers it could not
end. Here every loader of the fit is shut down on any exception. A rank whose peer failed or stopped sits in a collective
until the process group's timeout (30 minutes) with NCCL; the watchdog ends it sooner: when no batch, step or save of
this rank ends for ``QGMEM_STALL_LIMIT_S`` seconds, it writes one line naming the rank and its phase, then every
thread's stack, and exits with :data:`STALL_EXIT_CODE`.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import Any

import lightning as L
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

STALL_LIMIT_ENV = "QGMEM_STALL_LIMIT_S"
DEFAULT_STALL_LIMIT_S = 600.0
"""Seconds without a batch, step or save ending before a rank is ended; 0 turns the watchdog off."""
STALL_EXIT_CODE = 124
"""Exit code of a rank the watchdog ended (as ``timeout`` ends a command)."""


def stall_limit() -> float:
    """The stall limit in seconds from ``QGMEM_STALL_LIMIT_S`` (default :data:`DEFAULT_STALL_LIMIT_S`)."""
    raw = os.environ.get(STALL_LIMIT_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_STALL_LIMIT_S
    except ValueError:
        from qgmem_train.errors import InputError

        raise InputError(STALL_LIMIT_ENV, f"{raw!r} is not a number of seconds (0 turns the watchdog off)") from None


def shut_down_loader_workers(trainer: L.Trainer) -> None:
    """End the worker processes of the training and validation loaders of a fit, then tear both loops' fetchers down."""
    for loop in (trainer.fit_loop, trainer.fit_loop.epoch_loop.val_loop):
        fetcher = loop._data_fetcher
        combined = getattr(fetcher, "_combined_loader", None)
        iterator = getattr(combined, "_iterator", None)
        for worker_iterator in getattr(iterator, "iterators", []):
            if isinstance(worker_iterator, _MultiProcessingDataLoaderIter):
                worker_iterator._shutdown_workers()
    trainer.fit_loop.teardown()


class ExitOnFault(L.Callback):
    """Shut the loaders' workers down on an exception; end this rank when it stalls past the limit (see the module)."""

    def __init__(self, limit_s: float | None = None) -> None:
        self.limit_s = stall_limit() if limit_s is None else limit_s
        self.phase = "start of the fit"
        self._last = time.monotonic()
        self._rank = 0
        self._stop: threading.Event | None = None

    def beat(self, phase: str) -> None:
        """Note progress: this rank is now in ``phase`` (named in the stall line)."""
        self.phase, self._last = phase, time.monotonic()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._rank = trainer.global_rank
        self.beat("start of the fit")
        if self.limit_s > 0 and self._stop is None:
            self._stop = threading.Event()
            threading.Thread(target=self._watch, args=(self._stop,), name="qgmem-stall-watchdog", daemon=True).start()

    def _watch(self, stop: threading.Event) -> None:
        while not stop.wait(min(5.0, self.limit_s / 4)):
            stalled = time.monotonic() - self._last
            if stalled > self.limit_s:
                print(
                    f"error: rank {self._rank} made no progress for {stalled:.0f} s in {self.phase} (limit {self.limit_s:g} s, "
                    f"{STALL_LIMIT_ENV}): a collective waits on a rank that failed or stopped; ending this rank (exit {STALL_EXIT_CODE})",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                os._exit(STALL_EXIT_CODE)

    def _disarm(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self.beat(f"training batch {batch_idx} (step {trainer.global_step}: forward, backward, gradient all-reduce)")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.beat(f"the end of training batch {batch_idx} (step {trainer.global_step}: signal check, logging, checkpoint)")

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.beat(f"validation batch {batch_idx} at step {trainer.global_step}")

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.beat(f"the end of validation batch {batch_idx} at step {trainer.global_step} (signal check)")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.beat(f"the end of validation at step {trainer.global_step} (metric all-reduce, checkpoint)")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self.beat(f"a checkpoint save at step {trainer.global_step}")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.beat(f"the teardown after {type(exception).__name__}")
        shut_down_loader_workers(trainer)
        self._disarm()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._disarm()
