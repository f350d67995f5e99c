"""``predict`` output as JSONL: one line per example with the generation, parsed answer and exact match.

Lines are written batch by batch to a temporary file beside the target and renamed into place when
the prediction loop ends, so a killed run never leaves a half-written ``predictions.jsonl``. Under
several processes each rank writes its own ``<name>.rank<N>.jsonl``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter


class JsonlPredictionWriter(BasePredictionWriter):
    """Write every ``predict_step`` record to a JSONL file, atomically."""

    def __init__(self, path: str | None = None) -> None:
        """Write predictions to ``path``.

        Args:
            path: output file (default: ``<trainer.default_root_dir>/predictions.jsonl``).
        """
        super().__init__(write_interval="batch")
        self.path = path
        self._handle: IO[str] | None = None
        self._staging: Path | None = None
        self._target: Path | None = None

    def target(self, trainer: L.Trainer) -> Path:
        """Where this process's predictions go."""
        path = Path(self.path) if self.path else Path(trainer.default_root_dir) / "predictions.jsonl"
        return path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}") if trainer.world_size > 1 else path

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._target = self.target(trainer)
        self._target.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=f".{self._target.name}.", dir=self._target.parent)
        self._staging = Path(staging)
        self._handle = os.fdopen(handle, "w", encoding="utf-8")

    def write_on_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, prediction: Any, batch_indices: Any, batch: Any, batch_idx: int, dataloader_idx: int
    ) -> None:
        for record in prediction:
            self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._handle.close()
        os.chmod(self._staging, 0o644)
        os.replace(self._staging, self._target)
        self._handle = self._staging = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._handle is not None:
            self._handle.close()
            self._staging.unlink(missing_ok=True)
            self._handle = self._staging = None
