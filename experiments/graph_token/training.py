"""Training and testing one arm of the graph-token study: its module and data, the loss-curve callback, the run with
its checkpoints and resume, and answering more questions with a finished run's checkpoint."""

from __future__ import annotations

import argparse
import logging
import math
import re
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from qgmem_train.reports import portable
from experiments.graph_token.answering import ANSWER_BATCHES, answer_questions, answer_scores, answered_ids, answered_subset, per_question_losses
from experiments.graph_token.arms import Variant, shuffled_graphs
from qgmem_train.errors import InputError
from qgmem_train.fileio import write_json_atomic

log = logging.getLogger(__name__)


def loss_curve_callback(every: int, monitor: str = "val/loss") -> Any:
    """A Lightning callback recording train loss per step and the ``monitor`` validation loss per check, logging progress."""
    import lightning as L

    class LossCurve(L.Callback):
        """Its curves and training seconds travel in the run's checkpoints, so a resumed run reports the whole run."""

        def __init__(self) -> None:
            self.train: list[list[float]] = []
            self.val: list[list[float]] = []
            self.seconds_before = 0.0  # training time before this fit started (the resumed checkpoint's)
            self.started: float | None = None

        def train_seconds(self) -> float:
            return self.seconds_before + (time.perf_counter() - self.started if self.started is not None else 0.0)

        def state_dict(self) -> dict[str, Any]:
            return {"train": self.train, "val": self.val, "train_s": self.train_seconds()}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.train, self.val, self.seconds_before = state_dict["train"], state_dict["val"], state_dict["train_s"]

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.started = time.perf_counter()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.seconds_before, self.started = self.train_seconds(), None

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            step = trainer.global_step
            self.train.append([step, float(loss)])
            if step % every == 0 or step == trainer.max_steps:
                rate = self.train_seconds() / max(step, 1)
                log.info("    step %d/%d train loss %.4f (%.1f s/step)", step, trainer.max_steps, float(loss), rate)

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.sanity_checking or monitor not in trainer.callback_metrics:
                return
            value = float(trainer.callback_metrics[monitor])
            self.val.append([trainer.global_step, value])
            log.info("    step %d %s %.4f", trainer.global_step, monitor, value)

    return LossCurve()


WARMUP_FRACTION = 0.1
"""Share of a trained arm's steps spent warming up to the peak learning rate."""


def build_module(args: argparse.Namespace, variant: Variant, feature_dim: int, **overrides: Any) -> Any:
    """The arm's ``GraphAugmentedLM`` over the frozen ``args.llm`` (float32), with the experiment's encoder, schedule and
    context; ``overrides`` are further module settings (a group changes only the fields it names)."""
    from qgmem_train.model.module import GraphAugmentedLM
    from qgmem_train.model.settings import merge_settings

    settings = {
        "feature_dim": feature_dim, "llm": args.llm, "dtype": "float32",
        "readout": {"tokens": variant.graph_tokens, "kind": variant.graph_readout},
        "prompt": {"text_path": variant.text_path, "max_context_tokens": args.max_context_tokens},
        "encoder": {"hidden_dim": args.gnn_hidden, "layers": 2, "heads": 4},
        "projector": {"hidden_dim": 2 * args.gnn_hidden, "center": variant.graph_center}, "lora": {"r": variant.lora_r},
        "optim": {"learning_rate": args.lr, "weight_decay": 0.0, "warmup_fraction": WARMUP_FRACTION},
        "generation": {"max_new_tokens": args.max_new_tokens, "val_generate": False},
    }  # fmt: skip
    return GraphAugmentedLM(**merge_settings(settings, overrides))


def arm_data_and_module(args: argparse.Namespace, variant: Variant, seed: int, data_path: Path) -> tuple[Any, Any]:
    """The arm's data module, set up (empty graphs for a soft prompt, shuffled test graphs for a shuffled-graph test), and its
    module, seeded as every run of the arm is, so an untrained arm is the same model each time it is built."""
    import lightning as L
    import torch

    from qgmem_train.graph.local_graph import LocalGraph
    from qgmem_train.model.datamodule import TrajectoryDataModule

    L.seed_everything(seed, verbose=False)
    data = TrajectoryDataModule(
        str(data_path), embedder=args.embedder, batch_size=args.batch_size, eval_batch_size=args.eval_batch_size, shuffle_seed=seed
    )
    data.setup()
    if variant.empty_graphs:
        data.splits = {name: [replace(ex, graph=LocalGraph()) for ex in part] for name, part in data.splits.items()}
    if variant.shuffled_of is not None:
        data.splits["test"] = shuffled_graphs(data.splits["test"], seed)
    torch.manual_seed(seed)
    return data, build_module(args, variant, data.feature_dim)



def load_trained_weights(model: Any, ckpt: str) -> None:
    """The trainable parameters of the experiment checkpoint ``ckpt`` in ``model``, checked as Lightning's own load checks them."""
    import torch

    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    model.on_load_checkpoint(checkpoint)
    model.load_state_dict(checkpoint["state_dict"], strict=False)


def extend_answers(
    args: argparse.Namespace, variant: Variant, seed: int, data_path: Path, run_dir: Path, result: dict[str, Any], wanted: set[str]
) -> dict[str, Any]:
    """A finished run's answers made those of the questions ``wanted`` (today's ``--max-f1-questions`` sample), without
    training or a test pass: the questions its answers lack are answered with the checkpoint it was tested with (saved
    as they come, in ``answers.partial.json``), answers outside the sample are dropped, and the answer scores are recomputed."""
    import lightning as L

    records = result["predictions"]
    missing = wanted - answered_ids(result)
    started = time.perf_counter()
    answers: dict[str, dict[str, Any]] = {}
    if missing:
        ckpt = result["checkpoint_best"] and str(args.out.resolve() / run_relative(result["checkpoint_best"]))
        if ckpt and not Path(ckpt).is_file():
            raise InputError(ckpt, f"the checkpoint {variant.key}, seed {seed} was tested with is gone; remove {run_dir / 'result.json'} to run it again")
        sample = f"the sample of {args.max_f1_questions}" if args.max_f1_questions else "every test question"
        log.info("  answering the %d question(s) its answers lack (%s), with %s", len(missing), sample, ckpt or "its untrained weights")
        data, model = arm_data_and_module(args, variant, seed, data_path)
        trainer = L.Trainer(accelerator="cpu", devices=1, precision="32-true", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, deterministic=True)  # fmt: skip
        asked = [ex for ex in data.splits["test"] if ex.question_id in missing]
        answers = answer_questions(trainer, model, data, asked, ckpt, run_dir / "answers.partial.json", ANSWER_BATCHES * args.eval_batch_size)
    extended = []
    for record in records:
        qid, losses = record["question_id"], {k: record[k] for k in ("loss", "answer_loss")}
        if qid in missing:
            extended.append({**answers[qid], **losses})
        else:
            extended.append(record if qid in wanted else {"question_id": qid, **losses})
    result = {**result, **answer_scores(extended), "predictions": extended,
              "answers_extended_s": round(result.get("answers_extended_s", 0.0) + time.perf_counter() - started, 1)}  # fmt: skip
    write_json_atomic(run_dir / "result.json", portable(result, args.out.resolve()))
    (run_dir / "answers.partial.json").unlink(missing_ok=True)
    return result



def run_variant(args: argparse.Namespace, variant: Variant, seed: int, data_path: Path, run_dir: Path, source: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train (when the variant has something to train), validate, then test and predict the test conversations.

    A shuffled-graph arm trains nothing: it tests ``source``'s best checkpoint (its arm, same seed) on shuffled test graphs.
    """
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    started = time.perf_counter()
    data, model = arm_data_and_module(args, variant, seed, data_path)
    every = max(1, math.ceil(args.steps / args.val_checks))
    curve = loss_curve_callback(max(1, args.steps // 10), args.monitor)
    checkpoints = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="best-{step}", monitor=args.monitor, mode="min", save_top_k=1)
    # ``last.ckpt`` at every validation, improved or not (ModelCheckpoint's save_last follows only its top-k saves):
    # what a killed run resumes from.
    latest = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="last", save_top_k=1, enable_version_counter=False)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, precision="32-true", max_steps=args.steps, val_check_interval=every, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, gradient_clip_val=1.0, deterministic=True, log_every_n_steps=1, enable_progress_bar=False,
        enable_model_summary=False, logger=CSVLogger(str(run_dir), name="logs"),
        callbacks=[curve, checkpoints, latest] if variant.trained else [curve],
        enable_checkpointing=variant.trained,
    )  # fmt: skip
    train_s, best_step, ckpt = 0.0, None, None
    if source is not None:
        ckpt, best_step, best_val = str(args.out.resolve() / run_relative(source["checkpoint_best"])), source["best_step"], source["best_val_loss"]
        log.info("  testing the checkpoint of %s, seed %d, on shuffled test graphs: %s", variant.shuffled_of, seed, ckpt)
    elif variant.trained:
        resume = run_dir / "checkpoints" / "last.ckpt"
        if resume.exists():
            log.info("  resuming from %s (training ends at step %d)", resume, args.steps)
        else:
            log.info("  training %d steps (batch %d, validation every %d steps)", args.steps, args.batch_size, every)
        trainer.fit(model, datamodule=data, ckpt_path=str(resume) if resume.exists() else None)
        train_s = curve.train_seconds()
        ckpt = checkpoints.best_model_path or latest.best_model_path
        found = re.search(r"step=(\d+)", Path(checkpoints.best_model_path).name)
        best_step = int(found.group(1)) if found else None
        best_val = float(checkpoints.best_model_score) if checkpoints.best_model_score is not None else None
    else:
        log.info("  nothing to train: validation and test only")
        best_val = trainer.validate(model, datamodule=data, verbose=False)[0][args.monitor]
        curve.val.append([0, best_val])
    eval_started = time.perf_counter()
    tested_questions = data.splits["test"]
    log.info("  testing %d questions of the test conversation", len(tested_questions))
    asked = answered_subset(tested_questions, args.max_f1_questions, args.split_seed)
    log.info("  answering %d of them (F1, BLEU-1, EM)", len(asked))
    answers = answer_questions(trainer, model, data, asked, ckpt or None, run_dir / "answers.partial.json", ANSWER_BATCHES * args.eval_batch_size)
    if ckpt:
        load_trained_weights(model, ckpt)  # whether or not anything was left to answer with them
    losses, diagnostics = per_question_losses(model, data)
    test_loss = statistics.fmean(loss["loss"] for loss in losses.values())
    records = [{"question_id": ex.question_id, **answers.get(ex.question_id, {}), **losses[ex.question_id]} for ex in tested_questions]
    eval_s = time.perf_counter() - eval_started
    result = {
        "variant": variant.key,
        "name": variant.name,
        "seed": seed,
        "steps": args.steps if variant.trained else (source["steps"] if source else 0),
        "checkpoint_of": variant.shuffled_of,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "wall_s": round(time.perf_counter() - started, 1),
        "train_s": round(train_s, 1),
        "seconds_per_step": round(train_s / args.steps, 2) if variant.trained else None,
        "eval_s": round(eval_s, 1),
        "best_val_loss": best_val,
        "best_step": best_step,
        "checkpoint_best": ckpt if source else (checkpoints.best_model_path if variant.trained else None),
        "checkpoint_last": str(Path(latest.dirpath) / "last.ckpt") if variant.trained else None,  # its best path is empty after a resumed fit
        "train_curve": curve.train,
        "val_curve": curve.val,
        "test_loss": float(test_loss),
        "test_answer_loss": statistics.fmean(r["answer_loss"] for r in records),
        **diagnostics,
        **answer_scores(records),
        "predictions": records,
    }
    write_json_atomic(run_dir / "result.json", portable(result, args.out.resolve()))
    (run_dir / "answers.partial.json").unlink(missing_ok=True)
    return result


def run_relative(recorded: str) -> Path:
    """A path a run recorded (absolute, in the ``--out`` it ran in) from its ``runs/`` folder on: where it lies in
    ``--out`` wherever the folder has moved since."""
    parts = Path(recorded).parts
    if "runs" not in parts:
        raise ValueError(f"{recorded}: not under a runs/ folder of an experiment")
    return Path(*parts[len(parts) - 1 - parts[::-1].index("runs") :])
