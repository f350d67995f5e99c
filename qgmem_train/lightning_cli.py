"""``python -m qgmem_train fit|validate|test|predict --config FILE``: LightningCLI over the graph-augmented LM.

A config holds LightningCLI's sections (``seed_everything``, ``trainer``, ``model``, ``data``,
``checkpoint``) and the pipeline's (``pipeline``: models, construction, retrieval, generation). The
model references are written once, under ``pipeline.models``, and linked into the model and data
module; the node/edge feature width is linked from the loaded embedder. A ModelCheckpoint that keeps
``last.ckpt`` is always present, so ``--ckpt_path last`` resumes the latest run.
"""

from __future__ import annotations

import os
import warnings

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from qgmem_train.config import PipelineConfig
from qgmem_train.graph.shuffle_gap import graph_reading_line
from qgmem_train.logging_setup import is_quiet, route_to_root
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.launch_checks import ValidationOnStepBoundaries, refuse_stale_requeue_checkpoints, refuse_true_precision
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.model.prediction_writer import JsonlPredictionWriter
from qgmem_train.model.requeue import StepBoundaryRequeue

PIPELINE_LINKS = {
    "pipeline.models.llm": "model.llm",
    "pipeline.models.llm_revision": "model.llm_revision",
    "pipeline.models.dtype": "model.dtype",
    "pipeline.models.quantization": "model.quantization",
    "pipeline.models.cache_dir": ["model.cache_dir", "data.cache_dir"],
    "pipeline.models.trust_remote_code": "model.trust_remote_code",
    "pipeline.models.embedder": "data.embedder",
}
"""Pipeline settings that the model and data module take from the ``pipeline`` section."""


class QGMemCLI(LightningCLI):
    """LightningCLI with the ``pipeline`` section, its links, and an always-on last-checkpoint callback."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_dataclass_arguments(PipelineConfig, "pipeline")
        for source, targets in PIPELINE_LINKS.items():
            for target in [targets] if isinstance(targets, str) else targets:
                parser.link_arguments(source, target)
        parser.link_arguments("data.feature_dim", "model.feature_dim", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(JsonlPredictionWriter, "predictions")
        parser.set_defaults(
            {
                "checkpoint.save_last": True,
                "checkpoint.monitor": "val/loss",
                "checkpoint.mode": "min",
                "checkpoint.save_top_k": 1,
                "checkpoint.filename": "step{step}-val_loss{val/loss:.4f}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )

    def before_instantiate_classes(self) -> None:
        """Refuse, before any model loads, a ``*-true`` half precision and (fit) a stale Slurm requeue checkpoint."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        refuse_true_precision(config["trainer"]["precision"])
        if self.subcommand == "fit":
            refuse_stale_requeue_checkpoints(config["trainer"]["default_root_dir"] or os.getcwd(), config["ckpt_path"])


def always_on_callbacks() -> list[Callback]:
    """Callbacks every run gets whatever its config lists: checkpoints only at optimizer-step boundaries (Slurm's
    requeue signal handled at the next one, validation refused inside an accumulation window)."""
    return [StepBoundaryRequeue(), ValidationOnStepBoundaries()]


def summary(subcommand: str, trainer: Trainer) -> str | None:
    """The lines a run ends with: steps, validation loss and last checkpoint after fit, then whether the model reads its
    graphs (:func:`~qgmem_train.graph.shuffle_gap.graph_reading_line`); the file after predict.

    validate and test end with Lightning's own table of metrics.
    """
    if subcommand == "fit":
        loss = trainer.callback_metrics.get("val/loss")
        checkpoint = trainer.checkpoint_callback
        parts = [f"fit: {trainer.global_step} steps"]
        if loss is not None:
            parts.append(f"val/loss {float(loss):.4f}")
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.last_model_path:
            parts.append(f"last checkpoint {checkpoint.last_model_path}")
        return ", ".join(parts) + "\n" + graph_reading_line(trainer.lightning_module.graph_reading)
    if subcommand == "predict":
        writer = next(c for c in trainer.callbacks if isinstance(c, JsonlPredictionWriter))
        return f"predict: wrote {writer.target(trainer)}"
    return None


def main(argv: list[str]) -> int:
    """Run one LightningCLI subcommand (``argv[0]`` is fit, validate, test or predict) and print its summary line.

    Lightning's logs follow the output policy; quiet runs (the default) also leave out its model summary
    table, which ``-v`` shows.
    """
    route_to_root("lightning")
    with warnings.catch_warnings():
        # The dispatcher passes sys.argv on as ``args`` on purpose; LightningCLI warns about exactly that.
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
        trainer_defaults = {"callbacks": always_on_callbacks(), **({"enable_model_summary": False} if is_quiet() else {})}
        cli = QGMemCLI(GraphAugmentedLM, TrajectoryDataModule, args=argv, save_config_kwargs={"overwrite": True}, trainer_defaults=trainer_defaults)
    line = summary(cli.subcommand, cli.trainer) if cli.subcommand else None
    if line and cli.trainer.is_global_zero:
        print(line)
    return 0
