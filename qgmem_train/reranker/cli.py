"""``python -m qgmem_train fit-reranker --config configs/reranker-cpu.yaml``: train the cross-encoder reranker.

LightningCLI over :class:`CrossEncoderModule` and :class:`RerankDataModule` (``seed_everything``,
``trainer``, ``model``, ``data`` sections, overridable as ``--model.learning_rate 3e-5``), plus
``--out``: the folder the trained CrossEncoder is written to. The run validates before training and
after each epoch (once more only when the last epoch ended without a pass); the folder is published
atomically with ``training.json`` beside the weights (the split, both validation losses, steps and
seconds), so a later evaluation knows which conversations the model never saw.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from qgmem_train.fileio import publish_output_folder, refuse_foreign_folder, staging_beside
from qgmem_train.logging_setup import is_quiet, route_to_root
from qgmem_train.memory.store_uri import shown_store
from qgmem_train.reranker.datamodule import RerankDataModule
from qgmem_train.reranker.module import CrossEncoderModule
from qgmem_train.retrieval.cross_encoder import TRAINING_RECORD, trained_document_layout

DEFAULT_OUT = "checkpoints/reranker-cpu/model"
"""File written beside the CrossEncoder weights: how and on what the model was trained."""


class RerankerCLI(LightningCLI):
    """LightningCLI with ``--out``, the folder the trained CrossEncoder goes to."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--out", default=DEFAULT_OUT, help="folder for the trained CrossEncoder: new, empty or an earlier output (replaced atomically)")


class LastValidation(Callback):
    """Remembers the optimizer step of the latest validation pass, so the final weights are validated once."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.step = trainer.global_step


def _metrics(trainer: Any) -> dict[str, float]:
    return {key: round(float(value), 4) for key, value in trainer.callback_metrics.items() if key.startswith("val/")}


def training_record(cli: RerankerCLI, before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
    """What the saved folder records about its training run."""
    data: RerankDataModule = cli.datamodule
    return {
        "base_model": cli.model.hparams.base_model,
        "hyperparameters": dict(cli.model.hparams),
        "seed": cli.config.get("seed_everything"),
        "input": str(data.input),
        "input_sha256": hashlib.sha256(data.input.read_bytes()).hexdigest()[:16],
        "store": shown_store(data.store),
        "train_conversations": data.train_data.conversations,
        "val_conversations": data.val_data.conversations,
        "train_questions": len(data.train_data.examples),
        "val_questions": len(data.val_data.examples),
        "negatives": data.negatives,
        "batch_size": data.batch_size,
        "document_layout": data.document_layout,
        "mined_with": data.mine_with,
        "steps": cli.trainer.global_step,
        "epochs": cli.trainer.current_epoch,
        "validation_before": before,
        "validation_after": after,
        "seconds": round(seconds, 1),
    }


def check_teacher_layout(model: CrossEncoderModule, data: RerankDataModule) -> None:
    """Refuse a teacher trained on another document layout than the data's: it would score documents it never read."""
    if model.teacher is None:
        return
    data.check_layout_of("model.teacher", model.hparams.teacher, trained_document_layout(model.teacher, Path(model.hparams.teacher)))


def main(argv: list[str]) -> int:
    """Validate, fit (validating the final weights once), then publish the CrossEncoder folder and print one summary line."""
    started = time.perf_counter()
    route_to_root("lightning")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
        trainer_defaults = {"enable_model_summary": False, "enable_checkpointing": False} if is_quiet() else {"enable_checkpointing": False}
        cli = RerankerCLI(CrossEncoderModule, RerankDataModule, args=argv, run=False, save_config_callback=None, trainer_defaults=trainer_defaults)
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    out = Path(cli.config.out)
    refuse_foreign_folder(out)
    check_teacher_layout(model, data)
    last_validation = LastValidation()
    trainer.callbacks.append(last_validation)
    trainer.validate(model, datamodule=data, verbose=False)
    before = _metrics(trainer)
    trainer.fit(model, datamodule=data)
    if last_validation.step != trainer.global_step:
        trainer.validate(model, datamodule=data, verbose=False)
    after = _metrics(trainer)
    with staging_beside(out) as staging:
        model.save(staging, data.document_layout)
        record = training_record(cli, before, after, time.perf_counter() - started)
        (staging / TRAINING_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        publish_output_folder(staging, out, "fit-reranker")
    print(f"fit-reranker: {record['steps']} steps in {record['seconds'] / 60:.1f} min, val/loss {before.get('val/loss')} -> "
          f"{after.get('val/loss')}, val/top1 {before.get('val/top1')} -> {after.get('val/top1')}; saved {out}")
    return 0
