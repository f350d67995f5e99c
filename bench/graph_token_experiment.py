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
2. **Runs.** The frozen SmolLM2 (``--llm``) with, per arm (``--variants``, keys below): each graph design, ``mean1`` (the
   paper's mean readout, T=1), ``mean4`` (T=4), ``edges`` (one token per edge, at most ``--edge-tokens``) and ``query``
   (``--query-tokens`` question-queried pools); for each, ``<design>-soft``, the same number of tokens trained on empty
   graphs (a learned soft prompt; for ``edges`` the mean readout with the cap's worth of tokens, since an empty graph has
   no edges), and ``<design>-shuffled``, the design's trained checkpoint tested with each test question given another
   question's graph from the same conversation (no training); ``<design>-centered`` for ``mean1`` and ``edges``, the
   design with the reference-centered projector (``model.graph_center: reference``), controlled by the design's soft
   prompt and by its own ``-centered-shuffled`` test; ``lora`` (LoRA r=8, no graph) and ``lora+<design>``
   (``--lora-readout``) with its ``lora+<design>-shuffled`` test; ``text`` (the graph's facts in the prompt, no training); ``none`` (no graph, no training).
   Local graphs carry attribute edges (``graph.attribute_edges``; ``--no-attribute-edges`` for the paper's). Trained arms
   run ``--steps`` optimizer steps (seeded, ``deterministic=True``), validate on the validation conversation every
   ``steps / --val-checks`` steps, keep the best checkpoint by ``--monitor`` (the answer-span loss by default) and the last,
   and are tested with the best. Nothing is chosen on the test conversations.
3. **Report.** Per arm: the answer-span loss (the answer field's tokens alone, primary), the whole-target loss,
   valid-JSON rate, F1, BLEU-1 and exact match (mean ± std over seeds), F1 per category, the graph tokens' mean pairwise
   cosine and between-question variance ratio on the test questions; paired bootstrap 95% intervals over test
   questions (per-question values averaged over the seeds both arms ran) of each design against its soft prompt, its shuffled graphs and
   no graph, of each centered design against the design's soft prompt, its own shuffled graphs, the plain design and
   no graph, of LoRA + design against LoRA and its shuffled graphs, and of the text path against no graph, on answer-span loss and on F1.
   Written to ``results.json``, ``results.md`` and PNGs (``loss_curves.png``, ``f1.png``, ``f1_per_category.png``) in ``--out``.

Staging (``--variants`` and the resume make rounds): the screening round is one seed of every arm (the default); then
``--seeds 3 --seeded <best design> <best design>-soft lora+<best design> --lora-readout <best design>`` into the same
``--out`` adds seeds 1 and 2 of those arms (and of their shuffled tests) and rebuilds the report over every finished run.
Rounds whose arms have different seed counts are reported together with ``--report-only``: the widest plan's runs that
exist are reported, the others named as not run, and nothing trains. Where both arms of a comparison have several
seeds, the report also gives each seed's difference and a t interval over the seeds.

Split: ``--test-count`` (2) test conversations, one validation conversation, the rest train (seven LoCoMo
conversations: train on four), every question of the test conversations (``--max-test-questions`` caps them);
``--max-context-tokens`` 600 (the paper's budget; 128 to see what the tokens carry when the text cannot).

Layout of ``--out``: ``data/`` (staged cases, data-prep output, ``trajectories/`` with the split, ``split.json``),
``runs/<variant>-seed<k>/`` (``checkpoints/best-*.ckpt`` and ``last.ckpt``: trainable parameters only, for
``export``; ``logs/version_<n>/`` CSV metrics, a version per call; ``result.json`` with per-question predictions).
A run whose ``result.json`` exists is skipped, so a killed experiment resumes at the run it was in; a run killed in
training or in its test resumes from its ``last.ckpt`` (its last validation; after the last one it goes straight to
its test), keeping the answers it saved, two predict batches at a time, in ``answers.partial.json``. Settings that
change the data or the runs are recorded in ``settings.json``; rerunning with other ones into the same ``--out`` is
refused. ``--max-f1-questions`` may change: the finished runs then answer the questions the new sample adds (a larger
sample holds a smaller one) with the checkpoint each was tested with, saving answers as they come
(``answers.partial.json``), and drop answers outside it; nothing trains again.

Measured speeds (SmolLM2-135M in float32, one torch thread, 2 shared cores, before the prefix cache): a training step of
one example of about 500 tokens 3.9 s; a schema-constrained answer 2.3 s per question in batches of 8; building one
LoCoMo conversation's memory (about 600 turns) 73 s; ``--threads 1`` because two threads ran 8x slower on the shared
machine.

Bad input (no folder, no cases, too few conversations for the split, an unknown arm) is one line on stderr and exit 2.
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

from bootstrap import paired_bootstrap, seed_interval  # noqa: E402
from machine import machine_info  # noqa: E402

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM  # noqa: E402
from qgmem_train.errors import InputError, ModelUnavailableError  # noqa: E402
from qgmem_train.fileio import atomic_output, write_json_atomic  # noqa: E402
from qgmem_train.memory.types import Session  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "convomem" / "test_cases"
SPLITS = ("train", "validation", "test")
METRICS = ("test_answer_loss", "test_loss", "json_valid", "f1", "bleu1", "exact_match")
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
    graph_readout: str = "mean"
    text_path: bool = False
    lora_r: int = 0
    graph_center: str = "none"
    """The projector's centering (``model.graph_center``)."""
    empty_graphs: bool = False
    """Train and evaluate on empty graphs (the learned soft-prompt control)."""
    shuffled_of: str | None = None
    """Test the checkpoint of this arm (same seed) with each test question given another question's graph; no training."""

    @property
    def trained(self) -> bool:
        """Whether the variant has trainable parameters (else it is only validated and tested)."""
        return self.shuffled_of is None and (self.graph_tokens > 0 or self.lora_r > 0)


GRAPH_ARMS = ("mean1", "mean4", "edges", "query")
"""The trained graph designs; each has a same-size soft prompt (``<arm>-soft``) and a shuffled-graph test (``<arm>-shuffled``)."""
CENTERED_ARMS = ("mean1", "edges")
"""The designs also run with the reference-centered projector (``<arm>-centered``, tested shuffled as ``<arm>-centered-shuffled``)."""


def variants(edge_tokens: int = 10, query_tokens: int = 4, lora_readout: str = "edges") -> dict[str, Variant]:
    """Every arm of the experiment, by key, in run order (a shuffled-graph arm after the arm whose checkpoint it tests).

    The soft prompt of the ``edges`` readout is the mean readout with ``edge_tokens`` tokens on empty graphs: per-edge
    tokens of an empty graph are none at all, so its same-size prompt is the cap's worth of learned tokens.
    """
    designs = {
        "mean1": Variant("mean1", "graph token T=1 (mean readout, the paper's)", graph_tokens=1),
        "mean4": Variant("mean4", "graph tokens T=4 (mean readout)", graph_tokens=4),
        "edges": Variant("edges", f"edge tokens, at most {edge_tokens} (edges readout)", graph_tokens=edge_tokens, graph_readout="edges"),
        "query": Variant("query", f"query tokens T={query_tokens} (query readout)", graph_tokens=query_tokens, graph_readout="query"),
    }
    arms: dict[str, Variant] = {}
    for key, design in designs.items():
        soft_readout = "mean" if design.graph_readout == "edges" else design.graph_readout
        arms[key] = design
        arms[f"{key}-soft"] = Variant(f"{key}-soft", f"soft prompt T={design.graph_tokens} for {key} (empty graphs)",
                                      graph_tokens=design.graph_tokens, graph_readout=soft_readout, empty_graphs=True)  # fmt: skip
        arms[f"{key}-shuffled"] = replace(design, key=f"{key}-shuffled", name=f"{design.name}, shuffled test graphs", shuffled_of=key)
        if key in CENTERED_ARMS:
            centered = replace(design, key=f"{key}-centered", name=f"{design.name}, reference-centered", graph_center="reference")
            arms[centered.key] = centered
            arms[f"{centered.key}-shuffled"] = replace(centered, key=f"{centered.key}-shuffled", name=f"{centered.name}, shuffled test graphs",
                                                       shuffled_of=centered.key)  # fmt: skip
    lora_design = designs[lora_readout]
    arms["lora"] = Variant("lora", "LoRA r=8, no graph", lora_r=8)
    lora_graph = arms[f"lora+{lora_readout}"] = replace(lora_design, key=f"lora+{lora_readout}", name=f"LoRA r=8 + {lora_design.name}", lora_r=8)
    arms[f"{lora_graph.key}-shuffled"] = replace(lora_graph, key=f"{lora_graph.key}-shuffled", name=f"{lora_graph.name}, shuffled test graphs",
                                                 shuffled_of=lora_graph.key)  # fmt: skip
    arms["text"] = Variant("text", "text path: graph facts in the prompt, no training", text_path=True)
    arms["none"] = Variant("none", "no graph, no training")
    return arms


def shuffled_graphs(examples: list[Any], seed: int) -> list[Any]:
    """Each example with the local graph of another example of the same case (conversation), never its own.

    Within a case the examples are put in a seeded random order and each takes the graph of the next one (the last
    the first's): a derangement by position. A case with a single example has no other graph to give: refused.
    """
    by_case: dict[str, list[int]] = defaultdict(list)
    for i, example in enumerate(examples):
        by_case[example.case_id].append(i)
    out = list(examples)
    for case_id, members in sorted(by_case.items()):
        if len(members) < 2:
            raise InputError(case_id, "one test question only: no other question's graph to shuffle in")
        order = list(members)
        random.Random(f"shuffle:{seed}:{case_id}").shuffle(order)
        for i, j in zip(order, order[1:] + order[:1]):
            out[i] = replace(examples[i], graph=examples[j].graph)
    return out


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


def split_conversations(
    names: list[str], seed: int, test: list[str] | None = None, validation: str | None = None, test_count: int = 1
) -> dict[str, list[str]]:
    """``test_count`` test conversations and one validation conversation (named, else drawn with ``seed``), every other one train.

    A conversation is in exactly one split; the split needs at least one train conversation.
    """
    names = sorted(set(names))
    count = len(test) if test else test_count
    if len(names) < count + 2:
        raise InputError(
            "--data", f"{len(names)} conversation(s) found ({', '.join(names) or 'none'}); the split needs at least {count + 2} "
            f"(train, validation, {count} test)",
        )  # fmt: skip
    for option, name in [("--test-conversation", t) for t in test or []] + [("--validation-conversation", validation)]:
        if name is not None and name not in names:
            raise InputError(option, f"{name!r} is not a conversation here (found: {', '.join(names)})")
    if test and validation in test:
        raise InputError("--validation-conversation", "must differ from --test-conversation")
    pool = [n for n in names if n not in (test or []) and n != validation]
    random.Random(f"split:{seed}").shuffle(pool)
    tests = sorted(test) if test else sorted(pool.pop(0) for _ in range(count))
    validation = validation or pool.pop(0)
    return {"train": sorted(pool), "validation": [validation], "test": tests}


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
    data_dir = out / "data"
    summary_file = data_dir / "split.json"
    if summary_file.exists() and (data_dir / "trajectories").exists():
        log.info("[data] reusing %s", data_dir / "trajectories")
        return json.loads(summary_file.read_text())

    started = time.perf_counter()
    conversations = find_conversations(args.data)
    by_name = {c.name: c for c in conversations}
    split = split_conversations(list(by_name), args.split_seed, args.test_conversation, args.validation_conversation, args.test_count)
    from data_prep.config import load_data_prep_config  # the data checks above come before the model libraries load
    from data_prep.merge import merge
    from data_prep.run import run_shard
    from qgmem_train.model.trajectory import read_trajectory_dataset, write_trajectory_dataset

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
        f"  graph:\n    attribute_edges: {str(args.attribute_edges).lower()}\n"
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


def answered_subset(examples: list[Any], limit: int | None, seed: int) -> list[Any]:
    """The test questions whose answers are generated and scored: all of them, or a seeded sample of ``limit`` in test order.

    Losses are computed on every test question; generation costs far more (seconds an answer on 2 cores), hence the cap.
    The sample is the last ``limit`` of one seeded shuffle, so a larger one holds a smaller one and raising the cap
    only answers the questions added. (The last, not the first: a shuffle's first draws are the draws of
    ``random.sample`` with the same seed, which drew the samples of earlier runs, and those land at its end, so runs
    answered on such a sample keep most of their answers: 50 of 60 in a sample of 150 of 300.)
    """
    if limit is None or limit >= len(examples):
        return list(examples)
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    chosen = set(order[-limit:])
    return [ex for i, ex in enumerate(examples) if i in chosen]


ANSWER_BATCHES = 2
"""Predict batches per chunk of answers saved as they come (:func:`answer_questions`): a chunk of whole batches makes
the same batches as one call over every question, so saving (and resuming) changes no answer."""


def answer_questions(
    trainer: Any, model: Any, data: Any, examples: list[Any], ckpt: str | None, partial: Path, chunk: int
) -> dict[str, dict[str, Any]]:
    """Answers (with their F1, BLEU-1 and EM) of ``examples`` by ``model`` with the weights of ``ckpt`` (its own when None), by
    question id; written to ``partial`` after every ``chunk`` questions (a multiple of the predict batch), whose answers a
    rerun does not generate again (an answer costs seconds on 2 cores)."""
    answers: dict[str, dict[str, Any]] = json.loads(partial.read_text()) if partial.exists() else {}
    todo = [ex for ex in examples if ex.question_id not in answers]
    if answers:
        log.info("    %d answer(s) saved before the stop; answering the other %d", len(examples) - len(todo), len(todo))
    tested = data.splits["test"]
    try:
        for start in range(0, len(todo), chunk):
            data.splits["test"] = todo[start : start + chunk]
            answers.update((r["question_id"], r) for batch in trainer.predict(model, datamodule=data, ckpt_path=ckpt) for r in batch)
            write_json_atomic(partial, answers)
            log.info("    answered %d of %d", min(start + chunk, len(todo)), len(todo))
    finally:
        data.splits["test"] = tested
    return answers


def load_trained_weights(model: Any, ckpt: str) -> None:
    """The trainable parameters of the experiment checkpoint ``ckpt`` in ``model``, checked as Lightning's own load checks them."""
    import torch

    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    model.on_load_checkpoint(checkpoint)
    model.load_state_dict(checkpoint["state_dict"], strict=False)


def answer_scores(records: list[dict[str, Any]]) -> dict[str, float]:
    """Valid-JSON rate, F1, BLEU-1 and exact match over the answered records."""
    answered = [r for r in records if "f1" in r]
    return {key: statistics.fmean(float(r[field]) for r in answered) for key, field in
            (("json_valid", "valid_json"), ("f1", "f1"), ("bleu1", "bleu1"), ("exact_match", "exact_match"))}  # fmt: skip


def per_question_losses(model: Any, data: Any) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Whole-target and answer-span loss per test question id, and the graph-token diagnostics of the same pass, with the
    model's current weights (one pass over the test questions serves both)."""
    import torch

    from qgmem_train.graph.diagnostics import graph_token_diagnostics

    model.eval()
    out: dict[str, dict[str, float]] = {}
    tokens: list[torch.Tensor] = []
    loader = data.test_dataloader()
    every = max(1, len(loader) // 10)
    with torch.no_grad():
        for done, batch in enumerate(loader, 1):
            graph_embeds = model.graph_embeddings(batch["graph"])
            if graph_embeds is not None:
                tokens += [t.cpu() for t in graph_embeds.per_example()]
            whole, answer = model.evaluation_losses(batch, graph_embeds)
            for example, w, a in zip(batch["examples"], whole.tolist(), answer.tolist()):
                out[example.question_id] = {"loss": w, "answer_loss": a}
            if done % every == 0 or done == len(loader):
                log.info("    losses of %d of %d test questions", len(out), len(data.splits["test"]))
    return out, {f"graph_token_{name}": value for name, value in graph_token_diagnostics(tokens).items()}


WARMUP_FRACTION = 0.1
"""Share of a trained arm's steps spent warming up to the peak learning rate."""


def build_module(args: argparse.Namespace, variant: Variant, feature_dim: int, **overrides: Any) -> Any:
    """The arm's ``GraphAugmentedLM`` over the frozen ``args.llm`` (float32), with the experiment's encoder, schedule and
    context; ``overrides`` are further module settings."""
    from qgmem_train.model.module import GraphAugmentedLM

    return GraphAugmentedLM(
        feature_dim=feature_dim, llm=args.llm, dtype="float32", graph_tokens=variant.graph_tokens,
        graph_readout=variant.graph_readout, text_path=variant.text_path,
        gnn_hidden=args.gnn_hidden, gnn_layers=2, gnn_heads=4, projector_hidden=2 * args.gnn_hidden, lora_r=variant.lora_r,
        learning_rate=args.lr, weight_decay=0.0, warmup_fraction=WARMUP_FRACTION, max_context_tokens=args.max_context_tokens,
        max_new_tokens=args.max_new_tokens, val_generate=False, graph_center=variant.graph_center, **overrides,
    )  # fmt: skip


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
    write_json_atomic(run_dir / "result.json", result)
    (run_dir / "answers.partial.json").unlink(missing_ok=True)
    return result


def answered_ids(result: dict[str, Any]) -> set[str]:
    """The test questions a finished run has answers for."""
    return {r["question_id"] for r in result["predictions"] if "f1" in r}


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
    write_json_atomic(run_dir / "result.json", result)
    (run_dir / "answers.partial.json").unlink(missing_ok=True)
    return result


# ---------------------------------------------------------------------------------------------- report


def run_relative(recorded: str) -> Path:
    """A path a run recorded (absolute, in the ``--out`` it ran in) from its ``runs/`` folder on: where it lies in
    ``--out`` wherever the folder has moved since."""
    parts = Path(recorded).parts
    if "runs" not in parts:
        raise ValueError(f"{recorded}: not under a runs/ folder of an experiment")
    return Path(*parts[len(parts) - 1 - parts[::-1].index("runs") :])


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def per_question(runs: list[dict[str, Any]], field: str) -> dict[str, float]:
    """``field`` (``f1``, ``answer_loss``) per test question id, averaged over the runs (seeds)."""
    scores: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for record in run["predictions"]:
            if field in record:  # answers are scored on a subset of the test questions (--max-f1-questions)
                scores[record["question_id"]].append(float(record[field]))
    return {qid: statistics.fmean(v) for qid, v in scores.items()}


def comparisons(arms: dict[str, Variant]) -> list[tuple[str, str]]:
    """``(arm, control)`` pairs the report bootstraps: each graph design against its soft prompt, its shuffled graphs and no
    graph; LoRA + a design against LoRA alone and its shuffled graphs; the text path against no graph."""
    pairs = [(key, f"{key}{suffix}") for key in GRAPH_ARMS for suffix in ("-soft", "-shuffled")]
    pairs += [(key, "none") for key in GRAPH_ARMS]
    pairs += [(f"{key}-centered", control) for key in CENTERED_ARMS for control in (f"{key}-soft", f"{key}-centered-shuffled", key, "none")]
    pairs += [(key, control) for key in arms if key.startswith("lora+") and arms[key].trained for control in ("lora", f"{key}-shuffled")]
    return pairs + [("text", "none")]


def summarize(runs: dict[str, list[dict[str, Any]]], questions: dict[str, dict[str, str]], args: argparse.Namespace) -> dict[str, Any]:
    """Per-variant means ± std over seeds, per-category F1, graph-token diagnostics, and the paired bootstraps of :func:`comparisons`
    (F1, and answer-span loss) over the seeds both arms ran (a shuffled test of seed 0 is not paired with seed 1's
    training), also seed by seed where both ran several."""
    out: dict[str, Any] = {"variants": {}, "bootstrap": {}}
    for key, done in runs.items():
        if not done:
            continue
        row: dict[str, Any] = {"name": done[0]["name"], "seeds": [r["seed"] for r in done], "steps": done[0]["steps"]}
        for metric in METRICS:
            mean, std = mean_std([r[metric] for r in done])
            row[metric] = {"mean": mean, "std": std}
        by_category: dict[str, list[float]] = defaultdict(list)
        for qid, f1 in per_question(done, "f1").items():
            by_category[questions[qid]["category"]].append(f1)
        row["f1_per_category"] = {c: {"mean": statistics.fmean(v), "questions": len(v)} for c, v in sorted(by_category.items())}
        row["runs"] = [{k: v for k, v in r.items() if k not in ("predictions",)} for r in done]
        for name in ("graph_token_cosine", "graph_token_between_variance_ratio"):
            values = [r[name] for r in done if r.get(name) is not None]
            if values:
                row[name] = statistics.fmean(values)
        out["variants"][key] = row
    out["bootstrap_answer_loss"], out["seeds"], out["seeds_answer_loss"] = {}, {}, {}
    for arm, control in comparisons(variants(args.edge_tokens, args.query_tokens, args.lora_readout)):
        if runs.get(arm) and runs.get(control):
            pair = f"{arm} - {control}"
            common = sorted({r["seed"] for r in runs[arm]} & {r["seed"] for r in runs[control]})
            paired = {k: [r for r in runs[k] if r["seed"] in common] or runs[k] for k in (arm, control)}
            for key, seeds_key, field, better, worse in (("bootstrap", "seeds", "f1", arm, control),
                                                          ("bootstrap_answer_loss", "seeds_answer_loss", "answer_loss", control, arm)):  # fmt: skip
                boot = paired_bootstrap(
                    per_question(paired[better], field), per_question(paired[worse], field), args.bootstrap_resamples, args.bootstrap_seed
                )
                out[key][pair] = {**boot, "training_seeds": common or None}
                seeded = per_seed_differences(runs[better], runs[worse], field, args)
                if seeded is not None:
                    out[seeds_key][pair] = seeded
    return out


def per_seed_differences(first: list[dict[str, Any]], second: list[dict[str, Any]], field: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """``first - second`` in ``field`` seed by seed (each a question bootstrap) and over the seeds both have (a t interval),
    or None under two such seeds: a difference seen in one training run may not come back in the next."""
    by_seed = {r["seed"]: r for r in second}
    pairs = [(r, by_seed[r["seed"]]) for r in sorted(first, key=lambda r: r["seed"]) if r["seed"] in by_seed]
    if len(pairs) < 2:
        return None
    rows = [
        {"training_seed": a["seed"], **paired_bootstrap(per_question([a], field), per_question([b], field), args.bootstrap_resamples, args.bootstrap_seed)}
        for a, b in pairs
    ]
    return {"per_seed": rows, **seed_interval([row["mean_difference"] for row in rows])}


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
        f"(10% warm-up, cosine), {s['monitor']} every {math.ceil(s['steps'] / s['val_checks'])} steps on the validation conversation "
        f"(best checkpoint tested); context {s['max_context_tokens']} tokens, {s['max_new_tokens']} new tokens, schema-constrained; "
        f"local graphs {'with' if s['attribute_edges'] else 'without'} attribute edges. Losses on every test question; "
        + ("answers (valid JSON, F1, BLEU-1, EM) on every one." if s.get("max_f1_questions") is None else
           f"answers (valid JSON, F1, BLEU-1, EM) on a seeded sample of {s['max_f1_questions']} of them (split seed, test order)."), "",
        "## Test conversations", "",
        "| variant | seeds | steps | answer loss | test loss | valid JSON | F1 | BLEU-1 | EM | token cosine | between-question variance |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in variants_.values():
        diag = [f"{row[k]:{spec}}" if k in row else "" for k, spec in (("graph_token_cosine", ".6f"), ("graph_token_between_variance_ratio", ".1e"))]
        lines.append(
            f"| {row['name']} | {len(row['seeds'])} | {row['steps']} | {fmt(row['test_answer_loss'])} | {fmt(row['test_loss'])} | "
            f"{fmt(row['json_valid'])} | {fmt(row['f1'])} | {fmt(row['bleu1'])} | {fmt(row['exact_match'])} | {diag[0]} | {diag[1]} |"
        )
    lines += ["", "Mean ± sample std over seeds (no ± for one seed). Answer loss: the answer field's tokens alone; test loss: the whole "
              "target. Token cosine and between-question variance: the graph tokens of the test questions (`qgmem_train/graph/diagnostics.py`)."]  # fmt: skip
    if result.get("not_run"):
        lines += ["", f"Not run (--report-only): {'; '.join(result['not_run'])}."]
    for title, key, unit in (("answer-span loss (control − arm: above 0, the arm is better)", "bootstrap_answer_loss", "answer loss"),
                             ("F1 (arm − control)", "bootstrap", "F1")):  # fmt: skip
        boot = result["summary"].get(key) or {}
        if not boot:
            continue
        lines += ["", f"## Paired bootstrap of the {title}", "",
                  "| arm − control | seeds | questions | mean | 95% interval | resamples above 0 |", "|---|---|---|---|---|---|"]  # fmt: skip
        for pair, b in boot.items():
            seeds = ", ".join(map(str, b.get("training_seeds") or [])) or "all"
            lines.append(
                f"| {pair.replace(' - ', ' − ')} | {seeds} | {b['questions']} | {b['mean_difference']:+.4f} | "
                f"[{b['ci95'][0]:+.4f}, {b['ci95'][1]:+.4f}] | {b['share_of_resamples_above_0']:.3f} |"
            )
        lines += ["", f"Per-question {unit} averaged over the seeds both arms ran; {next(iter(boot.values()))['resamples']} resamples of the "
                  f"test questions, seed {s['bootstrap_seed']}."]  # fmt: skip
    for title, key in (("answer-span loss (control − arm)", "seeds_answer_loss"), ("F1 (arm − control)", "seeds")):
        seeded = result["summary"].get(key) or {}
        if not seeded:
            continue
        lines += ["", f"## Seed by seed: the {title}", "",
                  "| arm − control | seeds | difference per seed | mean ± std over seeds | 95% t interval over seeds |", "|---|---|---|---|---|"]  # fmt: skip
        for pair, b in seeded.items():
            seeds = ", ".join(str(r["training_seed"]) for r in b["per_seed"])
            differences = ", ".join(f"{r['mean_difference']:+.4f}" for r in b["per_seed"])
            lines.append(
                f"| {pair.replace(' - ', ' − ')} | {seeds} | {differences} | {b['mean']:+.4f} ± {b['std']:.4f} | "
                f"[{b['ci95'][0]:+.4f}, {b['ci95'][1]:+.4f}] |"
            )
        lines += ["", "Each seed's difference pairs the two arms' runs of that seed (a shuffled-graph test: the checkpoint it tests); "
                  "the t interval treats the seeds as independent runs, and is what a claim about the design rests on."]  # fmt: skip
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
            ckpt = f"`{run_relative(r['checkpoint_best'])}`" if r["checkpoint_best"] else "none (nothing trained)"
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
    reference = variants_.get("none", {}).get("runs", [{}])[0].get("best_val_loss")
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
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1, label="validation, no graph")
        ax.set_title(variants_[key]["name"], fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel(f"loss ({result['settings']['monitor']})")
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
    ax.set_xticks(range(len(names)), list(variants_), rotation=60, fontsize=6)
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
    p.add_argument("--variants", nargs="+", default=None, metavar="ARM",
                   help=f"arms to run (default: all): {', '.join(variants())}; lora+<design> follows --lora-readout")
    p.add_argument("--report-only", action="store_true", help="report the runs already in --out and run none (missing ones are named)")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 of the arms named by --seeded")
    p.add_argument("--seeded", nargs="*", default=[], metavar="ARM", help="arms run with --seeds seeds (with their -shuffled tests)")
    p.add_argument("--other-seeds", type=int, default=1, help="seeds 0..N-1 of every other arm")
    p.add_argument("--edge-tokens", type=int, default=10, help="cap of the edges readout (k), and its soft prompt's size")
    p.add_argument("--query-tokens", type=int, default=4, help="T of the query readout and its soft prompt")
    p.add_argument("--lora-readout", choices=GRAPH_ARMS, default="edges", help="the graph design of the LoRA + graph arm")
    p.add_argument("--monitor", choices=("val/answer_loss", "val/loss"), default="val/answer_loss", help="validation loss that picks the checkpoint")
    p.add_argument("--no-attribute-edges", dest="attribute_edges", action="store_false", help="local graphs of one edge per unit (the paper's)")
    p.add_argument("--test-count", type=int, default=2, help="test conversations (one validation, the rest train)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per trained run")
    p.add_argument("--batch-size", type=int, default=1, help="training examples per step")
    p.add_argument("--eval-batch-size", type=int, default=8, help="examples per validation/test/predict batch")
    p.add_argument("--val-checks", type=int, default=3, help="validation-loss checks per trained run (model selection, curves)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of every trained variant")
    p.add_argument("--gnn-hidden", type=int, default=256, help="graph encoder width (projector: twice this)")
    p.add_argument("--max-context-tokens", type=int, default=600, help="serialized working memory kept in the prompt (the paper's ~600; 128 too)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="generation budget (answer strings capped at (N-24)//2 characters)")
    p.add_argument("--max-train-questions", type=int, default=300, help="train questions over all train conversations")
    p.add_argument("--max-val-questions", type=int, default=12, help="validation questions")
    p.add_argument("--max-test-questions", type=int, default=None, help="test questions (default: every question of the test conversations)")
    p.add_argument("--max-f1-questions", type=int, default=None,
                   help="answer (F1, BLEU-1, EM) a seeded sample of this many test questions (default: every one); losses use all")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the conversation split and the question samples")
    p.add_argument("--test-conversation", nargs="+", help="name the test conversations (e.g. dataset_2 dataset_6) instead of drawing them")
    p.add_argument("--validation-conversation", help="name the validation conversation instead of drawing it")
    p.add_argument("--sentence-vectors", action="store_true", help="data prep also embeds every sentence of a unit (about 2x slower)")
    p.add_argument("--bootstrap-resamples", type=int, default=2000)
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: on a shared 2-core machine, 2 threads ran 8x slower)")
    p.add_argument("--llm", default=BUNDLED_LLM, help="frozen backbone of the runs")
    p.add_argument("--embedder", default=BUNDLED_EMBEDDER, help="retrieval and graph-feature embedder")
    return p


RUN_SETTINGS = (
    "steps", "batch_size", "val_checks", "lr", "gnn_hidden", "edge_tokens", "query_tokens", "monitor",
    "max_context_tokens", "max_new_tokens", "llm",
)  # fmt: skip
"""Settings that change a run's result: rerunning into the same --out with others is refused (``--lora-readout`` is not
one: it names its arm, ``lora+<design>``, so rounds with different ones share a folder)."""
ANSWER_SETTINGS = ("max_f1_questions",)
"""Settings recorded but free to change: another answer sample extends (or trims) the answers of the finished runs."""
DATA_SETTINGS = (
    "data", "max_train_questions", "max_val_questions", "max_test_questions", "split_seed", "test_conversation",
    "validation_conversation", "sentence_vectors", "embedder", "attribute_edges", "test_count",
)  # fmt: skip
"""Settings that change the data."""


def check_settings(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Record the settings in ``out/settings.json``, refusing to mix runs made with other ones."""
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k in RUN_SETTINGS + DATA_SETTINGS + ANSWER_SETTINGS}
    file = out / "settings.json"
    if file.exists():
        before = json.loads(file.read_text())
        changed = sorted(k for k in settings if k not in ANSWER_SETTINGS and before.get(k) != settings[k])
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
    for name in ("steps", "seeds", "other_seeds", "val_checks", "batch_size", "eval_batch_size", "threads", "edge_tokens", "query_tokens", "test_count"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", "must be at least 1")
    arms = variants(args.edge_tokens, args.query_tokens, args.lora_readout)
    args.variants = args.variants or list(arms)
    unknown = [k for k in args.variants + args.seeded if k not in arms]
    if unknown:
        raise InputError("--variants", f"unknown arm(s) {', '.join(unknown)} (known: {', '.join(arms)})")
    for key in args.variants:
        source = arms[key].shuffled_of
        if source is not None and source not in args.variants:
            raise InputError("--variants", f"{key} tests the checkpoint of {source}: run {source} too")
    import torch

    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    if args.report_only and not (out / "data" / "split.json").exists():
        raise InputError(str(out), "no data prep here to report on; run without --report-only first")
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    settings = check_settings(args, out)
    data = prepare_data(args, out)  # bad data is refused here, before Lightning's import
    import lightning  # noqa: F401  (sets its own log level on import; quieted below)

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # the stage lines say what it would

    def seeds_of(key: str) -> int:
        return args.seeds if key in args.seeded or arms[key].shuffled_of in args.seeded else args.other_seeds

    order = [k for k in arms if k in args.variants]  # run order: a shuffled-graph arm after its source
    plan = [(arms[k], seed) for k in order for seed in range(seeds_of(k))]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in args.variants}
    not_run: list[str] = []
    for number, (variant, seed) in enumerate(plan, 1):
        run_dir = out / "runs" / f"{variant.key}-seed{seed}"
        result_file = run_dir / "result.json"
        if result_file.exists():
            log.info("[run %d/%d] %s, seed %d: done before, reusing %s", number, len(plan), variant.name, seed, result_file)
            done = json.loads(result_file.read_text())
            wanted = set(answered_subset([r["question_id"] for r in done["predictions"]], args.max_f1_questions, args.split_seed))
            if answered_ids(done) != wanted:
                if args.report_only:
                    log.info("  its answers are not the sample of --max-f1-questions %s; reported as they are", args.max_f1_questions)
                else:
                    done = extend_answers(args, variant, seed, out / "data" / "trajectories", run_dir, done, wanted)
            runs[variant.key].append(done)
            continue
        if args.report_only:
            log.info("[run %d/%d] %s, seed %d: not run (--report-only)", number, len(plan), variant.name, seed)
            not_run.append(f"{variant.name}, seed {seed}")
            continue
        log.info("[run %d/%d] %s, seed %d", number, len(plan), variant.name, seed)
        source = None
        if variant.shuffled_of is not None:
            source = next((r for r in runs[variant.shuffled_of] if r["seed"] == seed), None)
            if source is None:
                log.info("[run %d/%d] %s, seed %d: no checkpoint of %s, seed %d; skipped", number, len(plan), variant.name, seed, variant.shuffled_of, seed)
                continue
            checkpoint = out / run_relative(source["checkpoint_best"])
            if not checkpoint.is_file():
                trained = out / "runs" / f"{variant.shuffled_of}-seed{seed}" / "result.json"
                raise InputError(str(checkpoint), f"the checkpoint {variant.key} tests is gone; remove {trained} to train {variant.shuffled_of} again")
        result = run_variant(args, variant, seed, out / "data" / "trajectories", run_dir, source)
        log.info(
            "[run %d/%d] done in %.0f s: test loss %.4f, valid JSON %.3f, F1 %.3f, BLEU-1 %.3f, EM %.3f", number, len(plan),
            result["wall_s"], result["test_loss"], result["json_valid"], result["f1"], result["bleu1"], result["exact_match"],
        )  # fmt: skip
        runs[variant.key].append(result)

    result = {
        "command": shlex.join(["python", "bench/graph_token_experiment.py", *argv]),
        "git": git_state(),
        "machine": machine,
        "settings": {**settings, "variants": args.variants, "seeds": args.seeds, "seeded": args.seeded, "other_seeds": args.other_seeds,
                     "eval_batch_size": args.eval_batch_size, "bootstrap_resamples": args.bootstrap_resamples,
                     "bootstrap_seed": args.bootstrap_seed},  # fmt: skip
        "out": str(out),
        "data": {k: v for k, v in data.items() if k != "questions"},
        "summary": summarize(runs, data["questions"], args),
        "not_run": not_run,
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
