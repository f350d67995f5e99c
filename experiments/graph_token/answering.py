"""Answering the test questions: which are answered (a seeded sample), answers saved as they come, their scores,
and the per-question losses and graph-token diagnostics of one pass."""

from __future__ import annotations

import json
import logging
import random
import statistics
from pathlib import Path
from typing import Any

from qgmem_train.fileio import write_json_atomic

log = logging.getLogger(__name__)


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


def answered_ids(result: dict[str, Any]) -> set[str]:
    """The test questions a finished run has answers for."""
    return {r["question_id"] for r in result["predictions"] if "f1" in r}
