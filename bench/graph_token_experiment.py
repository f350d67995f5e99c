"""Does the graph token help? Graph-token variants against their controls on ConvoMem conversations, split by conversation.

    python bench/graph_token_experiment.py --out out/graph_token                 # the default run below
    python bench/graph_token_experiment.py --data DIR --out DIR --steps 300      # the specified 300 steps (hours on 2 cores)

Stages (progress lines for each; rerunning the same command resumes):

1. **Data.** Every case of the ConvoMem-format folder ``--data`` (default ``../shared/data/convomem/test_cases``)
   is read with ``data_prep.convomem``. Cases that share a session id are one conversation (in the test_cases
   layout, ``dataset_<i>.json`` of every category is LoCoMo conversation i). Conversations, never questions,
   are split: one test, one validation, the rest train (``--split-seed``, or name them). Each conversation
   becomes one staged case holding its questions of every category, so data prep (``python -m data_prep``
   with turns units, rule intent, gold targets) builds its memory once instead of once per category file;
   each question's category is kept beside it for the per-category scores. Questions are capped per split
   (a seeded sample of each conversation's questions) before data prep, which activates only those.
2. **Runs.** The frozen SmolLM2 (``--llm``) with, per variant: (a) graph token T=1; (b) T=4; (c) the same
   token trained on empty graphs (a learned soft prompt: the control for the graph's content); (d)
   ``graph_tokens: 0``, no training; (e) the text path, the graph's facts in the prompt, no training; (f)
   LoRA r=8 on the backbone without graph. Trained variants run ``--steps`` optimizer steps (seeded,
   ``deterministic=True``), validate loss on the validation conversation every ``steps / --val-checks``
   steps, keep the best (lowest validation loss) and the last checkpoint, and are tested with the best.
   Nothing is chosen on the test conversation.
3. **Report.** Test loss, valid-JSON rate, F1, BLEU-1 and exact match (mean ± std over seeds), F1 per
   category, and a paired bootstrap 95% interval over test questions of the F1 differences (a) − (c) and
   (a) − (d) (per-question F1 averaged over seeds). Written to ``results.json``, ``results.md`` and PNGs
   (``loss_curves.png``, ``f1.png``, ``f1_per_category.png``) in ``--out``.

Layout of ``--out``: ``data/`` (staged cases, data-prep output, ``trajectories/`` with the split, ``split.json``),
``runs/<variant>-seed<k>/`` (``checkpoints/best-*.ckpt`` and ``last.ckpt``: trainable parameters only, for
``export``; ``logs/`` CSV metrics; ``result.json`` with per-question predictions). A run whose ``result.json``
exists is skipped, so a killed experiment resumes at the run it was in. Settings that change the data or the
runs are recorded in ``settings.json``; rerunning with other ones into the same ``--out`` is refused.

Defaults, chosen by measurement for about 75 minutes on 2 cores shared with other jobs (load average 4-7
while this was written). Measured with SmolLM2-135M in float32 and one torch thread: a training step of one
example (about 500 tokens, of which the prompt's fixed system part is 279) 3.9 s, for T=1, T=4 and LoRA alike;
the loss of one example 1.7 s; a schema-constrained answer 2.3 s per question in batches of 8; building one
LoCoMo conversation's memory (about 600 turns) 73 s without sentence vectors (144 s with); activation 0.4 s a
question. With two threads on the shared machine the same step took 29.5 s (threads waiting on each other
while other processes held the cores), hence ``--threads 1``. The defaults:

- ``--steps 60`` optimizer steps of ``--batch-size 1`` per trained run, not the specified 300: eight trained
  runs (3 seeds of (a) and (c), one of (b) and (f)) of 300 steps take about 8 × 300 × 3.9 s ≈ 2.6 hours of
  training alone here. ``--steps 300`` runs the specified setting with everything else the same (into a new
  ``--out``; the data stage is then rebuilt, about 11 minutes).
- ``--max-test-questions 30`` (a seeded sample of the test conversation's questions; about 2 minutes of test
  loss and generation per run, ten runs), ``--max-val-questions 12`` with ``--val-checks 3``,
  ``--max-train-questions 300`` (as many as 300 steps of batch 1 use; 60 steps see 60 of them).
- ``--max-context-tokens 128`` of serialized working memory, ``--max-new-tokens 96`` (each answer string is
  capped at 36 characters by the schema), learning rate 1e-3 with 10% warm-up and cosine decay for every
  trained variant, graph encoder width 256 (2 layers), projector 512.
- Data prep without dynamic memory traces (``pipeline.construction.traces: false``: SmolLM2 writing the
  traces' trajectories took 460 of a case's 630 s) and without sentence vectors (``--sentence-vectors`` to
  add them); the whole haystack of every conversation is built. About 11 minutes for the seven conversations.

Estimate: data 11 min, each trained run about 7 min (60 steps, 3 validations, test), each untrained run 2.5 min:
about 73 minutes in all at the speeds above; a busier machine stretches it.

Bad input (no folder, no cases, fewer than three conversations) is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled models are local; never reach for the Hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bootstrap import paired_bootstrap  # noqa: E402
from machine import machine_info  # noqa: E402

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM  # noqa: E402
from qgmem_train.errors import InputError, ModelUnavailableError  # noqa: E402
from qgmem_train.fileio import atomic_output, write_json_atomic  # noqa: E402
from qgmem_train.memory.types import Session  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "convomem" / "test_cases"
SPLITS = ("train", "validation", "test")
METRICS = ("test_loss", "json_valid", "f1", "bleu1", "exact_match")
"""Per-run test metrics, in table order."""
STAGED_CATEGORY = "conversations"
"""Folder of the staged cases (data prep's one category): one case per conversation."""

log = logging.getLogger("graph_token_experiment")


@dataclass(frozen=True)
class Variant:
    """One arm of the experiment: how the module is configured and whether it trains."""

    key: str
    name: str
    graph_tokens: int = 0
    text_path: bool = False
    lora_r: int = 0
    empty_graphs: bool = False
    """Train and evaluate on empty graphs (the learned soft-prompt control)."""

    @property
    def trained(self) -> bool:
        """Whether the variant has trainable parameters (else it is only validated and tested)."""
        return self.graph_tokens > 0 or self.lora_r > 0


def variants(control_tokens: int = 1) -> dict[str, Variant]:
    """The six arms of the experiment, by letter."""
    return {
        "a": Variant("a", "(a) graph token T=1", graph_tokens=1),
        "b": Variant("b", "(b) graph tokens T=4", graph_tokens=4),
        "c": Variant("c", f"(c) soft prompt T={control_tokens} (empty graphs)", graph_tokens=control_tokens, empty_graphs=True),
        "d": Variant("d", "(d) no graph, no training"),
        "e": Variant("e", "(e) text path: graph facts in the prompt, no training", text_path=True),
        "f": Variant("f", "(f) LoRA r=8, no graph", lora_r=8),
    }


# ---------------------------------------------------------------------------------------------- data


@dataclass
class ConversationCases:
    """The cases of one conversation: its sessions (the union of the cases' haystacks) and its questions."""

    name: str
    case_ids: list[str]
    sessions: list[Session]
    questions: list[tuple[str, Any]]
    """``(category, CaseQuestion)`` in case order."""


def category_of(file: Path) -> str:
    """A case file's category: its folder, or the folder above a Hub ``<n>_evidence`` folder."""
    folder = file.parent
    return folder.parent.name if re.fullmatch(r"\d+_evidence", folder.name) else folder.name


def find_conversations(root: Path) -> list[ConversationCases]:
    """Every case below ``root`` grouped into conversations: cases that share a session id are one conversation.

    Named after the cases' common file stem (``dataset_3``) when they have one, else after their first session.
    """
    from data_prep.convomem import discover_cases, load_case

    if not root.is_dir():
        raise InputError(str(root), "not a folder; pass --data DIR, a ConvoMem-format folder (<source>/<category>/*.json)")
    files = [p for p in sorted(root.rglob("*.json")) if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    categories = sorted({category_of(p) for p in files})
    refs = sorted({ref for found in discover_cases(root, categories).values() for ref in found}, key=lambda r: r.case_id)
    if not refs:
        raise InputError(str(root), "no ConvoMem test cases (*.json below <category>/ folders) here")
    cases = [load_case(root, ref, max_questions=None, max_sessions=None) for ref in refs]

    parent = list(range(len(cases)))

    def top(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, case in enumerate(cases):
        for session in case.conversation.sessions:
            if session.id in owner:
                parent[top(i)] = top(owner[session.id])
            else:
                owner[session.id] = i
    groups: dict[int, list[Any]] = defaultdict(list)
    for i, case in enumerate(cases):
        groups[top(i)].append(case)

    found: list[ConversationCases] = []
    taken: Counter = Counter()
    for members in groups.values():
        stems = {Path(c.ref.path).stem for c in members}
        sessions: dict[str, Session] = {}
        for case in sorted(members, key=lambda c: (-len(c.conversation.sessions), c.ref.case_id)):
            for session in case.conversation.sessions:
                sessions.setdefault(session.id, session)
        base = stems.pop() if len(stems) == 1 else next(iter(sessions), "conversation")
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", base)
        taken[base] += 1
        name = base if taken[base] == 1 else f"{base}-{taken[base]}"
        questions = [(c.ref.category, q) for c in sorted(members, key=lambda c: c.ref.case_id) for q in c.questions]
        found.append(ConversationCases(name, sorted(c.ref.case_id for c in members), list(sessions.values()), questions))
    return sorted(found, key=lambda c: c.name)


def split_conversations(names: list[str], seed: int, test: str | None = None, validation: str | None = None) -> dict[str, list[str]]:
    """One test and one validation conversation (named, else drawn with ``seed``), every other one train.

    A conversation is in exactly one split; fewer than three conversations cannot be split.
    """
    names = sorted(set(names))
    if len(names) < 3:
        raise InputError("--data", f"{len(names)} conversation(s) found ({', '.join(names) or 'none'}); the split needs at least 3 (train, validation, test)")
    for option, name in (("--test-conversation", test), ("--validation-conversation", validation)):
        if name is not None and name not in names:
            raise InputError(option, f"{name!r} is not a conversation here (found: {', '.join(names)})")
    if test is not None and test == validation:
        raise InputError("--validation-conversation", "must differ from --test-conversation")
    pool = [n for n in names if n not in (test, validation)]
    random.Random(f"split:{seed}").shuffle(pool)
    test = test or pool.pop(0)
    validation = validation or pool.pop(0)
    return {"train": sorted(pool), "validation": [validation], "test": [test]}


def quotas(total: int | None, sizes: list[int]) -> list[int]:
    """``total`` questions spread evenly over conversations of ``sizes`` questions (None: all of them)."""
    if total is None:
        return list(sizes)
    share, extra = divmod(total, len(sizes))
    return [min(size, share + (i < extra)) for i, size in enumerate(sizes)]


def staged_case(conversation: ConversationCases, picked: list[int]) -> dict[str, Any]:
    """A ConvoMem test case of the conversation's whole haystack and the ``picked`` questions (with their category)."""
    items = []
    for i in picked:
        category, question = conversation.questions[i]
        items.append(
            {
                "question": question.question,
                "answer": question.answer,
                "message_evidences": [{"speaker": "User", "text": t} for t in question.evidence_texts],
                "category": category,
            }
        )
    sessions = [{"id": s.id, "messages": [{"speaker": t.speaker, "text": t.text} for t in s.turns]} for s in conversation.sessions]
    return {"evidenceItems": items, "conversations": sessions}


def prepare_data(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Split by conversation, stage one case per conversation, run data prep, write the split trajectory folder."""
    from data_prep.config import load_data_prep_config
    from data_prep.merge import merge
    from data_prep.run import run_shard
    from qgmem_train.model.trajectory import read_trajectory_dataset, write_trajectory_dataset

    data_dir = out / "data"
    summary_file = data_dir / "split.json"
    if summary_file.exists() and (data_dir / "trajectories").exists():
        log.info("[data] reusing %s", data_dir / "trajectories")
        return json.loads(summary_file.read_text())

    started = time.perf_counter()
    conversations = find_conversations(args.data)
    by_name = {c.name: c for c in conversations}
    split = split_conversations(list(by_name), args.split_seed, args.test_conversation, args.validation_conversation)
    caps = {"train": args.max_train_questions, "validation": args.max_val_questions, "test": args.max_test_questions}
    log.info(
        "[data] %d conversations in %s: %s", len(conversations), args.data,
        "; ".join(f"{s} {', '.join(split[s])}" for s in SPLITS),
    )  # fmt: skip

    source = data_dir / "source" / STAGED_CATEGORY
    questions: dict[str, dict[str, str]] = {}
    for name in SPLITS:
        members = [by_name[n] for n in split[name]]
        for conversation, quota in zip(members, quotas(caps[name], [len(c.questions) for c in members])):
            order = list(range(len(conversation.questions)))
            random.Random(f"questions:{args.split_seed}:{conversation.name}").shuffle(order)
            picked = sorted(order[:quota])
            write_json_atomic(source / f"{conversation.name}.json", staged_case(conversation, picked))
            case_id = f"{STAGED_CATEGORY}/{conversation.name}.json#0"
            for number, i in enumerate(picked):
                questions[f"{case_id}/q{number}"] = {"conversation": conversation.name, "split": name, "category": conversation.questions[i][0]}

    config = data_dir / "data_prep.yaml"
    config.write_text(
        "# Written by bench/graph_token_experiment.py: one staged case per conversation; rerun with\n"
        f"#   python -m data_prep --config {config}\n"
        "data_prep:\n"
        f"  source: {json.dumps(str(source.parent))}\n"
        f"  categories: {{{STAGED_CATEGORY}: 1}}\n"
        f"  total_cases: {len(conversations)}\n"
        "  seed: 0\n  intent: rules\n  target: gold\n  validation_fraction: 0.0\n  test_fraction: 0.0\n"
        f"  out: {json.dumps(str(data_dir / 'prep'))}\n"
        "pipeline:\n"
        f"  models:\n    llm: {BUNDLED_LLM}\n    embedder: {args.embedder}\n    reranker: none\n    dtype: float32\n    device: cpu\n"
        f"  construction:\n    units: turns\n    traces: false\n    sentence_vectors: {str(args.sentence_vectors).lower()}\n"
        "  retrieval:\n    k: 10\n"
    )  # fmt: skip
    cfg, pipeline = load_data_prep_config(config)
    log.info("[data] data prep: %d staged cases, %d questions (%s)", len(conversations), len(questions), config)
    run_shard(cfg, pipeline)
    manifest = merge(cfg, pipeline)

    rows = read_trajectory_dataset(manifest["dataset"])["train"]
    splits: dict[str, list[Any]] = {name: [] for name in SPLITS}
    for example in rows:
        splits[questions[example.question_id]["split"]].append(example)
    write_trajectory_dataset(splits, data_dir / "trajectories")
    per_category = {
        name: dict(sorted(Counter(questions[ex.question_id]["category"] for ex in splits[name]).items())) for name in SPLITS
    }
    summary = {
        "source": str(args.data),
        "conversations": {
            c.name: {"cases": c.case_ids, "sessions": len(c.sessions), "turns": sum(len(s.turns) for s in c.sessions), "questions": len(c.questions)}
            for c in conversations
        },
        "split": split,
        "examples": {name: len(part) for name, part in splits.items()},
        "examples_per_category": per_category,
        "questions": questions,
        "data_prep": {
            "config": str(config),
            "seconds_per_case": manifest["seconds_per_case"],
            "cases_per_hour": manifest["cases_per_hour"],
            "questions_per_hour": manifest["questions_per_hour"],
            "wall_s": round(time.perf_counter() - started, 1),
        },
    }
    write_json_atomic(summary_file, summary)
    log.info("[data] done in %.0f s: %s examples", summary["data_prep"]["wall_s"], summary["examples"])
    return summary


# ---------------------------------------------------------------------------------------------- runs


def loss_curve_callback(every: int) -> Any:
    """A Lightning callback recording train loss per step and validation loss per check, logging progress."""
    import lightning as L

    class LossCurve(L.Callback):
        def __init__(self) -> None:
            self.train: list[list[float]] = []
            self.val: list[list[float]] = []
            self.started = time.perf_counter()

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            step = trainer.global_step
            self.train.append([step, float(loss)])
            if step % every == 0 or step == trainer.max_steps:
                rate = (time.perf_counter() - self.started) / max(step, 1)
                log.info("    step %d/%d train loss %.4f (%.1f s/step)", step, trainer.max_steps, float(loss), rate)

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.sanity_checking or "val/loss" not in trainer.callback_metrics:
                return
            value = float(trainer.callback_metrics["val/loss"])
            self.val.append([trainer.global_step, value])
            log.info("    step %d val loss %.4f", trainer.global_step, value)

    return LossCurve()


def run_variant(args: argparse.Namespace, variant: Variant, seed: int, data_path: Path, run_dir: Path) -> dict[str, Any]:
    """Train (when the variant has something to train), validate, then test and predict the test conversation."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from qgmem_train.graph.local_graph import LocalGraph
    from qgmem_train.model.datamodule import TrajectoryDataModule
    from qgmem_train.model.module import GraphAugmentedLM

    started = time.perf_counter()
    L.seed_everything(seed, verbose=False)
    data = TrajectoryDataModule(
        str(data_path), embedder=args.embedder, batch_size=args.batch_size, eval_batch_size=args.eval_batch_size, shuffle_seed=seed
    )
    data.setup()
    if variant.empty_graphs:
        data.splits = {name: [replace(ex, graph=LocalGraph()) for ex in part] for name, part in data.splits.items()}
    torch.manual_seed(seed)
    model = GraphAugmentedLM(
        feature_dim=data.feature_dim, llm=args.llm, dtype="float32", graph_tokens=variant.graph_tokens, text_path=variant.text_path,
        gnn_hidden=args.gnn_hidden, gnn_layers=2, gnn_heads=4, projector_hidden=2 * args.gnn_hidden, lora_r=variant.lora_r,
        learning_rate=args.lr, weight_decay=0.0, warmup_fraction=0.1, max_context_tokens=args.max_context_tokens,
        max_new_tokens=args.max_new_tokens, val_generate=False,
    )  # fmt: skip
    every = max(1, math.ceil(args.steps / args.val_checks))
    curve = loss_curve_callback(max(1, args.steps // 10))
    checkpoints = ModelCheckpoint(
        dirpath=run_dir / "checkpoints", filename="best-{step}", monitor="val/loss", mode="min", save_top_k=1, save_last=True
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, precision="32-true", max_steps=args.steps, val_check_interval=every, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, gradient_clip_val=1.0, deterministic=True, log_every_n_steps=1, enable_progress_bar=False,
        enable_model_summary=False, logger=CSVLogger(str(run_dir), name="logs", version=0),
        callbacks=[curve, checkpoints] if variant.trained else [curve],
        enable_checkpointing=variant.trained,
    )  # fmt: skip
    train_s, best_step, ckpt = 0.0, None, None
    if variant.trained:
        log.info("  training %d steps (batch %d, validation every %d steps)", args.steps, args.batch_size, every)
        fit_started = time.perf_counter()
        trainer.fit(model, datamodule=data)
        train_s = time.perf_counter() - fit_started
        ckpt = checkpoints.best_model_path or checkpoints.last_model_path
        found = re.search(r"step=(\d+)", Path(checkpoints.best_model_path).name)
        best_step = int(found.group(1)) if found else None
        best_val = float(checkpoints.best_model_score) if checkpoints.best_model_score is not None else None
    else:
        log.info("  nothing to train: validation and test only")
        best_val = trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"]
        curve.val.append([0, best_val])
    eval_started = time.perf_counter()
    log.info("  testing %d questions of the test conversation", len(data.splits["test"]))
    test_loss = trainer.test(model, datamodule=data, ckpt_path=ckpt or None, verbose=False)[0]["test/loss"]
    records = [r for batch in trainer.predict(model, datamodule=data, ckpt_path=ckpt or None) for r in batch]
    eval_s = time.perf_counter() - eval_started
    scores = {key: statistics.fmean(float(r[field]) for r in records) for key, field in
              (("json_valid", "valid_json"), ("f1", "f1"), ("bleu1", "bleu1"), ("exact_match", "exact_match"))}  # fmt: skip
    result = {
        "variant": variant.key,
        "name": variant.name,
        "seed": seed,
        "steps": args.steps if variant.trained else 0,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "wall_s": round(time.perf_counter() - started, 1),
        "train_s": round(train_s, 1),
        "seconds_per_step": round(train_s / args.steps, 2) if variant.trained else None,
        "eval_s": round(eval_s, 1),
        "best_val_loss": best_val,
        "best_step": best_step,
        "checkpoint_best": checkpoints.best_model_path if variant.trained else None,
        "checkpoint_last": checkpoints.last_model_path if variant.trained else None,
        "train_curve": curve.train,
        "val_curve": curve.val,
        "test_loss": float(test_loss),
        **scores,
        "predictions": records,
    }
    write_json_atomic(run_dir / "result.json", result)
    return result


# ---------------------------------------------------------------------------------------------- report


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def per_question_f1(runs: list[dict[str, Any]]) -> dict[str, float]:
    """F1 per test question id, averaged over the runs (seeds)."""
    scores: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for record in run["predictions"]:
            scores[record["question_id"]].append(float(record["f1"]))
    return {qid: statistics.fmean(v) for qid, v in scores.items()}


def summarize(runs: dict[str, list[dict[str, Any]]], questions: dict[str, dict[str, str]], args: argparse.Namespace) -> dict[str, Any]:
    """Per-variant means ± std over seeds, per-category F1, and the paired bootstrap of (a) − (c) and (a) − (d)."""
    out: dict[str, Any] = {"variants": {}, "bootstrap": {}}
    for key, done in runs.items():
        if not done:
            continue
        row: dict[str, Any] = {"name": done[0]["name"], "seeds": [r["seed"] for r in done], "steps": done[0]["steps"]}
        for metric in METRICS:
            mean, std = mean_std([r[metric] for r in done])
            row[metric] = {"mean": mean, "std": std}
        by_category: dict[str, list[float]] = defaultdict(list)
        for qid, f1 in per_question_f1(done).items():
            by_category[questions[qid]["category"]].append(f1)
        row["f1_per_category"] = {c: {"mean": statistics.fmean(v), "questions": len(v)} for c, v in sorted(by_category.items())}
        row["runs"] = [{k: v for k, v in r.items() if k not in ("predictions",)} for r in done]
        out["variants"][key] = row
    for other in ("c", "d"):
        if runs.get("a") and runs.get(other):
            out["bootstrap"][f"a-{other}"] = paired_bootstrap(
                per_question_f1(runs["a"]), per_question_f1(runs[other]), args.bootstrap_resamples, args.bootstrap_seed
            )
    return out


def fmt(cell: dict[str, Any], digits: int = 3) -> str:
    """``mean ± std`` (std left out for one seed)."""
    return f"{cell['mean']:.{digits}f}" + (f" ± {cell['std']:.{digits}f}" if cell["std"] is not None else "")


def markdown(result: dict[str, Any]) -> str:
    """results.md: command, commit, machine, split, steps and time per run, the table, per-category F1, the bootstrap."""
    m, d, s = result["machine"], result["data"], result["settings"]
    variants_ = result["summary"]["variants"]
    lines = [
        "# Graph token experiment: graph tokens against a soft prompt, no graph, the text path and LoRA", "",
        f"Command: `{result['command']}`  ",
        f"Commit: `{result['git']['commit']}`" + (f" ({result['git']['dirty_files']} files modified)" if result["git"]["dirty_files"] else "") + "  ",
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores, torch {m.get('torch')} ({m.get('torch_threads')} threads), "
        f"load average {m.get('load_average_1m')} at the start. Wall time {result['wall_s'] / 60:.1f} min.", "",
        f"Data: `{d['source']}`; split by conversation (never one conversation in two splits), split seed {s['split_seed']}:", "",
        "| split | conversations | questions used | per category |", "|---|---|---|---|",
    ]  # fmt: skip
    for name in SPLITS:
        per_cat = ", ".join(f"{c} {n}" for c, n in d["examples_per_category"][name].items())
        lines.append(f"| {name} | {', '.join(d['split'][name])} | {d['examples'][name]} | {per_cat} |")
    dp = d["data_prep"]
    lines += [
        "",
        f"Data prep (`{dp['config']}`): turns units, rule intent, gold targets, no traces; one staged case per conversation; "
        f"{dp['seconds_per_case']} seconds per case, {dp['questions_per_hour']} questions/hour, {dp['wall_s']:.0f} s in all.", "",
        f"Training: frozen `{s['llm']}` (float32), {s['steps']} optimizer steps of batch {s['batch_size']}, learning rate {s['lr']} "
        f"(10% warm-up, cosine), validation loss every {math.ceil(s['steps'] / s['val_checks'])} steps on the validation conversation "
        f"(best checkpoint tested); context {s['max_context_tokens']} tokens, {s['max_new_tokens']} new tokens, schema-constrained.", "",
        "## Test conversation", "",
        "| variant | seeds | steps | test loss | valid JSON | F1 | BLEU-1 | EM |", "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in variants_.values():
        lines.append(
            f"| {row['name']} | {len(row['seeds'])} | {row['steps']} | {fmt(row['test_loss'])} | {fmt(row['json_valid'])} | "
            f"{fmt(row['f1'])} | {fmt(row['bleu1'])} | {fmt(row['exact_match'])} |"
        )
    lines += ["", "Mean ± sample std over seeds (no ± for one seed)."]
    boot = result["summary"]["bootstrap"]
    if boot:
        lines += ["", "## Paired bootstrap of the F1 difference", "",
                  "| difference | questions | mean | 95% interval | resamples above 0 |", "|---|---|---|---|---|"]  # fmt: skip
        for key, b in boot.items():
            lines.append(
                f"| {key.replace('-', ' − ')} | {b['questions']} | {b['mean_difference']:+.4f} | "
                f"[{b['ci95'][0]:+.4f}, {b['ci95'][1]:+.4f}] | {b['share_of_resamples_above_0']:.3f} |"
            )
        lines += ["", f"Per-question F1 averaged over seeds; {next(iter(boot.values()))['resamples']} resamples of the test questions, seed {s['bootstrap_seed']}."]
    categories = sorted({c for row in variants_.values() for c in row["f1_per_category"]})
    if categories:
        lines += ["", "## F1 per category", "", "| variant | " + " | ".join(categories) + " |", "|---|" + "---|" * len(categories)]
        for row in variants_.values():
            cells = [f"{row['f1_per_category'][c]['mean']:.3f}" if c in row["f1_per_category"] else "" for c in categories]
            lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
        counts = next(iter(variants_.values()))["f1_per_category"]
        lines += ["", "Questions per category: " + ", ".join(f"{c} {counts[c]['questions']}" for c in categories if c in counts) + "."]
    lines += ["", "## Runs", "", "| variant | seed | steps | s/step | train s | test s | wall s | best val loss (step) | checkpoint |", "|---|---|---|---|---|---|---|---|---|"]
    for row in variants_.values():
        for r in row["runs"]:
            best = f"{r['best_val_loss']:.4f}" + (f" ({r['best_step']})" if r["best_step"] is not None else "")
            ckpt = f"`{Path(r['checkpoint_best']).relative_to(result['out'])}`" if r["checkpoint_best"] else "none (nothing trained)"
            lines.append(f"| {row['name']} | {r['seed']} | {r['steps']} | {r['seconds_per_step'] or ''} | {r['train_s']} | {r['eval_s']} | {r['wall_s']} | {best} | {ckpt} |")
    lines += ["", "Plots: `loss_curves.png`, `f1.png`, `f1_per_category.png`."]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], runs: dict[str, list[dict[str, Any]]], out: Path) -> list[Path]:
    """Loss curves per trained variant, F1 per variant (± std over seeds) and F1 per category, as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants_ = result["summary"]["variants"]
    written = []
    trained = [k for k, done in runs.items() if done and done[0]["steps"]]
    reference = variants_.get("d", {}).get("runs", [{}])[0].get("best_val_loss")
    columns = max(1, len(trained))
    fig, axes = plt.subplots(1, columns, figsize=(4.5 * columns, 3.6), squeeze=False, sharey=True)
    for ax, key in zip(axes[0], trained):
        for run in runs[key]:
            if run["train_curve"]:
                steps, losses = zip(*run["train_curve"])
                ax.plot(steps, losses, alpha=0.35, linewidth=0.8, label=f"train, seed {run['seed']}")
            if run["val_curve"]:
                steps, losses = zip(*run["val_curve"])
                ax.plot(steps, losses, marker="o", label=f"validation, seed {run['seed']}")
        if reference is not None:
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1, label="validation, (d) no graph")
        ax.set_title(variants_[key]["name"], fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("loss (target JSON tokens)")
    if not trained:
        axes[0][0].text(0.5, 0.5, "no trained variant", ha="center", va="center")
    fig.tight_layout()
    written.append(out / "loss_curves.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    names = [row["name"] for row in variants_.values()]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names)), 3.8))
    means = [row["f1"]["mean"] for row in variants_.values()]
    errors = [row["f1"]["std"] or 0.0 for row in variants_.values()]
    ax.bar(range(len(names)), means, yerr=errors, capsize=4, color="tab:blue")
    ax.set_xticks(range(len(names)), [n.split(" ", 1)[0] for n in names])
    ax.set_ylim(0, max(0.05, max(m + e for m, e in zip(means, errors)) * 1.15))
    ax.set_ylabel("test F1 (mean ± std over seeds)")
    ax.set_title("F1 per variant on the test conversation", fontsize=10)
    fig.text(0.01, 0.01, "; ".join(names), fontsize=5, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    written.append(out / "f1.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    categories = sorted({c for row in variants_.values() for c in row["f1_per_category"]})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * max(1, len(categories))), 3.8))
    width = 0.8 / max(1, len(variants_))
    for i, row in enumerate(variants_.values()):
        values = [row["f1_per_category"].get(c, {}).get("mean", 0.0) for c in categories]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=row["name"])
    ax.set_xticks([x + width * (len(variants_) - 1) / 2 for x in range(len(categories))], categories, fontsize=7, rotation=15)
    top = max((v.get("mean", 0.0) for row in variants_.values() for v in row["f1_per_category"].values()), default=0.0)
    ax.set_ylim(0, max(0.05, top * 1.15))
    ax.set_ylabel("test F1")
    ax.set_title("F1 per category", fontsize=10)
    ax.legend(fontsize=6)
    fig.tight_layout()
    written.append(out / "f1_per_category.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def git_state() -> dict[str, Any]:
    """The commit this runs from and how many tracked files differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty_files": 0}
    return {"commit": commit, "dirty_files": len(status.splitlines())}


# ---------------------------------------------------------------------------------------------- entry


def parser() -> argparse.ArgumentParser:
    """The command line; the defaults are the ~75-minute run described in the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help=f"ConvoMem-format folder (default: {DEFAULT_DATA} when present)")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "graph_token", help="output folder (resumes what is there)")
    p.add_argument("--variants", nargs="+", default=list("abcdef"), choices=list("abcdef"), help="arms to run")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 for (a) and (c)")
    p.add_argument("--other-seeds", type=int, default=1, help="seeds 0..N-1 for (b), (d), (e), (f)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per trained run")
    p.add_argument("--batch-size", type=int, default=1, help="training examples per step")
    p.add_argument("--eval-batch-size", type=int, default=8, help="examples per validation/test/predict batch")
    p.add_argument("--val-checks", type=int, default=3, help="validation-loss checks per trained run (model selection, curves)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of every trained variant")
    p.add_argument("--gnn-hidden", type=int, default=256, help="graph encoder width (projector: twice this)")
    p.add_argument("--control-tokens", type=int, default=1, help="graph tokens of the soft-prompt control (c), as (a)")
    p.add_argument("--max-context-tokens", type=int, default=128, help="serialized working memory kept in the prompt")
    p.add_argument("--max-new-tokens", type=int, default=96, help="generation budget (answer strings capped at (N-24)//2 characters)")
    p.add_argument("--max-train-questions", type=int, default=300, help="train questions over all train conversations")
    p.add_argument("--max-val-questions", type=int, default=12, help="validation questions")
    p.add_argument("--max-test-questions", type=int, default=30, help="test questions (a seeded sample of the test conversation)")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the conversation split and the question samples")
    p.add_argument("--test-conversation", help="name the test conversation (e.g. dataset_6) instead of drawing it")
    p.add_argument("--validation-conversation", help="name the validation conversation instead of drawing it")
    p.add_argument("--sentence-vectors", action="store_true", help="data prep also embeds every sentence of a unit (about 2x slower)")
    p.add_argument("--bootstrap-resamples", type=int, default=2000)
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: on a shared 2-core machine, 2 threads ran 8x slower)")
    p.add_argument("--llm", default=BUNDLED_LLM, help="frozen backbone of the runs")
    p.add_argument("--embedder", default=BUNDLED_EMBEDDER, help="retrieval and graph-feature embedder")
    return p


RUN_SETTINGS = (
    "steps", "batch_size", "val_checks", "lr", "gnn_hidden", "control_tokens", "max_context_tokens", "max_new_tokens", "llm",
)  # fmt: skip
"""Settings that change a run's result: rerunning into the same --out with others is refused."""
DATA_SETTINGS = (
    "data", "max_train_questions", "max_val_questions", "max_test_questions", "split_seed", "test_conversation",
    "validation_conversation", "sentence_vectors", "embedder",
)  # fmt: skip
"""Settings that change the data."""


def check_settings(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Record the settings in ``out/settings.json``, refusing to mix runs made with other ones."""
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k in RUN_SETTINGS + DATA_SETTINGS}
    file = out / "settings.json"
    if file.exists():
        before = json.loads(file.read_text())
        changed = sorted(k for k in settings if before.get(k) != settings[k])
        if changed:
            raise InputError(str(file), f"this folder holds runs made with other {', '.join(changed)}; pass another --out")
    write_json_atomic(file, settings)
    return settings


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """The whole experiment: data, every run (skipping finished ones), then the report."""
    started = time.perf_counter()
    if args.data is None:
        if not DEFAULT_DATA.is_dir():
            raise InputError("--data", f"no ConvoMem folder at the default {DEFAULT_DATA}; pass --data DIR")
        args.data = DEFAULT_DATA
    args.data = args.data.resolve()
    for name in ("steps", "seeds", "other_seeds", "val_checks", "batch_size", "eval_batch_size", "threads"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", "must be at least 1")
    import lightning  # noqa: F401  (sets its own log level on import; quieted below)
    import torch

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # the stage lines say what it would
    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    settings = check_settings(args, out)
    data = prepare_data(args, out)

    arms = variants(args.control_tokens)
    plan = [(arms[k], seed) for k in args.variants for seed in range(args.seeds if k in "ac" else args.other_seeds)]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in args.variants}
    for number, (variant, seed) in enumerate(plan, 1):
        run_dir = out / "runs" / f"{variant.key}-seed{seed}"
        result_file = run_dir / "result.json"
        if result_file.exists():
            log.info("[run %d/%d] %s, seed %d: done before, reusing %s", number, len(plan), variant.name, seed, result_file)
            runs[variant.key].append(json.loads(result_file.read_text()))
            continue
        log.info("[run %d/%d] %s, seed %d", number, len(plan), variant.name, seed)
        result = run_variant(args, variant, seed, out / "data" / "trajectories", run_dir)
        log.info(
            "[run %d/%d] done in %.0f s: test loss %.4f, valid JSON %.3f, F1 %.3f, BLEU-1 %.3f, EM %.3f", number, len(plan),
            result["wall_s"], result["test_loss"], result["json_valid"], result["f1"], result["bleu1"], result["exact_match"],
        )  # fmt: skip
        runs[variant.key].append(result)

    result = {
        "command": shlex.join(["python", "bench/graph_token_experiment.py", *argv]),
        "git": git_state(),
        "machine": machine,
        "settings": {**settings, "variants": args.variants, "seeds": args.seeds, "other_seeds": args.other_seeds,
                     "eval_batch_size": args.eval_batch_size, "bootstrap_resamples": args.bootstrap_resamples,
                     "bootstrap_seed": args.bootstrap_seed},  # fmt: skip
        "out": str(out),
        "data": {k: v for k, v in data.items() if k != "questions"},
        "summary": summarize(runs, data["questions"], args),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    result["plots"] = [p.name for p in plot(result, runs, out)]
    write_json_atomic(out / "results.json", result)
    with atomic_output(out / "results.md") as handle:
        handle.write(markdown(result))
    log.info("[report] wrote %s, %s and %s", out / "results.json", out / "results.md", ", ".join(result["plots"]))
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the experiment; bad input is one line on stderr and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    for name in ("graph_token_experiment", "data_prep"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    for message in (".*does not have many workers.*", ".*`srun` command is available.*", ".*LeafSpec.*", ".*module\\(s\\) in eval mode.*"):
        warnings.filterwarnings("ignore", message=message)
    try:
        run(args, argv)
    except (InputError, ModelUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
