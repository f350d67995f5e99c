"""``python -m qgmem_train fit|validate|test|predict --config FILE``: LightningCLI over the graph-augmented LM.

A config holds LightningCLI's sections (``seed_everything``, ``trainer``, ``model``, ``data``,
``checkpoint``) and the pipeline's (``pipeline``: models, construction, retrieval, generation). The
model references are written once, under ``pipeline.models``, and linked into the model and data
module; the ``graph.*`` settings go to the data module, which records them in every checkpoint; the node/edge feature
width is linked from the loaded embedder. A ModelCheckpoint that keeps
``last.ckpt`` is always present, so ``--ckpt_path last`` resumes the latest run. The model's settings are grouped
(``model.encoder.hidden_dim``, :mod:`qgmem_train.model.settings`); a flat key of before (``model.gnn_hidden``) is refused
in one line naming its new key, and a checkpoint with flat hyperparameters is read as groups.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from qgmem_train.config import PipelineConfig, read_yaml
from qgmem_train.errors import InputError
from qgmem_train.graph.shuffle_gap import graph_reading_line
from qgmem_train.logging_setup import is_quiet, route_to_root
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.launch_checks import ValidationOnStepBoundaries, refuse_stale_requeue_checkpoints, refuse_true_precision
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.model.prediction_writer import JsonlPredictionWriter
from qgmem_train.model.rank_exit import ExitOnFault
from qgmem_train.model.requeue import StepBoundaryRequeue
from qgmem_train.model.settings import FLAT_NAMES, grouped_hparams, new_key

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
        parser.link_arguments("pipeline.graph", "data.graph", compute_fn=lambda graph: graph.as_dict())
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

    def parse_arguments(self, parser: LightningArgumentParser, args: Sequence[str] | None) -> None:
        """Refuse a flat model key of before the grouping (in a ``--config`` file or a ``--model.*`` flag), then parse."""
        refuse_flat_model_keys(list(args) if args is not None else [])
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """As Lightning does, let the ``--ckpt_path`` checkpoint's module settings override the config's, reading the
        flat hyperparameters of a checkpoint written before the grouping as groups."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = torch.load(ckpt_path, weights_only=True, map_location="cpu").get("hyper_parameters", {})
        hparams.pop("_instantiator", None)
        if hparams:
            self.config = self.parser.parse_object({subcommand: {"model": grouped_hparams(hparams)}}, self.config)

    def before_instantiate_classes(self) -> None:
        """Refuse, before any model loads, a ``*-true`` half precision and (fit) a stale Slurm requeue checkpoint; move the
        config's loggers to a run folder given on the command line (:func:`follow_run_folder`)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        refuse_true_precision(config["trainer"]["precision"])
        follow_run_folder(config)
        if self.subcommand == "fit":
            refuse_stale_requeue_checkpoints(config["trainer"]["default_root_dir"] or os.getcwd(), config["ckpt_path"])


def follow_run_folder(config: Any) -> None:
    """Loggers whose ``save_dir`` lies under the config file's ``trainer.default_root_dir`` move under the one the command
    line gives (``slurm/train.sbatch``'s ``RUN_DIR``), so two runs of one config never write one log folder."""
    files = [Path(str(path)) for path in config.get("config") or []]
    written = [((read_yaml(path).get("trainer") or {}).get("default_root_dir")) for path in files]
    old, new = next((root for root in reversed(written) if root), None), config["trainer"]["default_root_dir"]
    if not old or not new or Path(old) == Path(new):
        return
    loggers = config["trainer"]["logger"]
    for logger in loggers if isinstance(loggers, list) else []:
        save_dir = getattr(getattr(logger, "init_args", None), "save_dir", None)
        if save_dir is not None and Path(save_dir).is_relative_to(old):
            logger.init_args.save_dir = str(Path(new) / Path(save_dir).relative_to(old))


def refuse_flat_model_keys(argv: list[str]) -> None:
    """One :class:`InputError` naming the new key for the first flat model setting (``gnn_hidden``) that a ``--config``
    file's ``model`` section or a ``--model.*`` flag of ``argv`` still uses."""
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name.startswith("--model.") and name[len("--model.") :] in FLAT_NAMES:
            raise InputError(name, f"renamed to --model.{new_key(name[len('--model.'):])} (the model's settings are grouped)")
        path = value if value else (argv[i + 1] if i + 1 < len(argv) else "")
        if name in ("--config", "-c") and Path(path).is_file():
            model = read_yaml(path).get("model")
            for key in model if isinstance(model, dict) else ():
                if key in FLAT_NAMES:
                    raise InputError(f"{path}: model.{key}", f"renamed to model.{new_key(key)} (the model's settings are grouped)")


def always_on_callbacks() -> list[Callback]:
    """Callbacks every run gets whatever its config lists: checkpoints only at optimizer-step boundaries (Slurm's
    requeue signal handled at the next one, validation refused inside an accumulation window), and every rank ending on
    a fault (loader workers shut down on an exception, a stalled rank ended by the watchdog)."""
    return [StepBoundaryRequeue(), ValidationOnStepBoundaries(), ExitOnFault()]


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
