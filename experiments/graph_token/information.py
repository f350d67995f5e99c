"""Step 0 of the graph-token study: does the local graph hold the answer? No graph training.

    python -m experiments.graph_token.information --out out/graph_token     # over the study's prepared data

On the study's test questions (its data stage, :func:`experiments.graph_token.data.prepare_data`, run here when
missing): the share of gold answers whose words appear in the local graph's node and edge labels (and, for
reference, in the memory context), and the frozen LLM's answer-span loss under four prompts, no graph tokens:
(i) the question only, (ii) the question and the graph's triples as text, (iii) the question and the memory context,
(iv) the context and the triples. The step passes when (ii) is below (i) with a paired-bootstrap 95% interval
excluding 0: if the graph's own words do not make the answer likelier to the LLM, no token made from the graph can.
Results go to ``<out>/information/`` (``losses-<prompt>.json`` per prompt, kept, so a killed run resumes at the next
prompt; ``results.json`` and ``results.md``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.machine import machine_info
from experiments.common import commit_text, git_state, machine_text, paired_bootstrap
from experiments.graph_token.arms import variants
from experiments.graph_token.cli import parser as study_parser
from experiments.graph_token.steps import question_sample, run_step, saved_or_computed, step_folder
from qgmem_train.metrics.answers import normalize_answer

log = logging.getLogger("experiments.graph_token.information")


@dataclass(frozen=True)
class Prompt:
    """One of step 0's prompts: whether the memory context stays and whether the graph's triples follow as text."""

    key: str
    name: str
    context: bool
    triples: bool


PROMPTS = (
    Prompt("question", "(i) question only", context=False, triples=False),
    Prompt("triples", "(ii) question + the graph's triples as text", context=False, triples=True),
    Prompt("context", "(iii) question + memory context", context=True, triples=False),
    Prompt("context+triples", "(iv) memory context + triples", context=True, triples=True),
)
COMPARISONS = (
    ("question", "triples", "the graph's triples alone (the step's test)"),
    ("context", "context+triples", "the triples on top of the context"),
    ("question", "context", "the context alone"),
)
"""(control, treatment, what the difference measures): loss of the control minus loss of the treatment, so above 0 means
the treatment makes the answer likelier."""


def words(text: str) -> set[str]:
    """The answer metrics' normalised tokens of ``text`` (lower case, no punctuation or articles)."""
    return set(normalize_answer(text).split())


def label_words(graph: Any) -> set[str]:
    """Every word of a local graph's node and edge labels."""
    return set().union(*(words(label) for label in [*graph.node_labels, *graph.edge_labels])) if graph.num_nodes else set()


def coverage(examples: list[Any]) -> dict[str, Any]:
    """How much of each gold answer the graph's labels and the memory context hold: the share of answers all of whose
    words appear there, and the mean share of an answer's words that do."""
    rows = {"graph": [], "context": []}
    for example in examples:
        answer = words(example.answer)
        if not answer:
            continue
        for where, vocabulary in (("graph", label_words(example.graph)), ("context", words(example.context))):
            rows[where].append(len(answer & vocabulary) / len(answer))
    return {
        where: {"answers": len(shares), "all_words": sum(s == 1.0 for s in shares) / max(1, len(shares)),
                "mean_word_share": sum(shares) / max(1, len(shares))}
        for where, shares in rows.items()
    }  # fmt: skip


def prompt_losses(args: argparse.Namespace, prompt: Prompt, data_path: Path) -> dict[str, dict[str, float]]:
    """Whole-target and answer-span loss per test question under ``prompt`` with the frozen LLM and no graph tokens."""
    from experiments.graph_token.answering import per_question_losses
    from experiments.graph_token.training import arm_data_and_module

    variant = variants()["text" if prompt.triples else "none"]
    data, model = arm_data_and_module(args, variant, 0, data_path)
    test = question_sample(data.splits["test"], args.step_questions, args.split_seed)
    data.splits["test"] = test if prompt.context else [replace(ex, context="") for ex in test]
    model.load_backbone("cpu")
    losses, _ = per_question_losses(model, data)
    return losses


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Data (the study's, reused when there), the four prompts' losses (each saved as it ends), the report."""
    started = time.perf_counter()
    folder, summary, data_path = step_folder(args, "information")
    from qgmem_train.trajectory import read_trajectory_dataset

    every = list(read_trajectory_dataset(data_path)["test"])
    test = question_sample(every, args.step_questions, args.split_seed)
    losses: dict[str, dict[str, dict[str, float]]] = {}
    timings: dict[str, float] = {}
    for prompt in PROMPTS:
        log.info("[%s] %s: the frozen LLM over %d test questions", prompt.key, prompt.name, len(test))
        record = saved_or_computed(folder / f"losses-{prompt.key}.json", prompt.key, lambda: {"losses": prompt_losses(args, prompt, data_path)})
        losses[prompt.key], timings[prompt.key] = record["losses"], record["wall_s"]
    answer_loss = {key: {q: v["answer_loss"] for q, v in per_q.items()} for key, per_q in losses.items()}
    mean = {key: sum(v.values()) / len(v) for key, v in answer_loss.items()}
    comparisons = [
        {"control": control, "treatment": treatment, "measures": what,
         **paired_bootstrap(answer_loss[control], answer_loss[treatment], args.bootstrap_resamples, args.bootstrap_seed)}
        for control, treatment, what in COMPARISONS
    ]  # fmt: skip
    test_step, context_step = comparisons[0], comparisons[2]
    passed = test_step["mean_difference"] > 0 and test_step["ci95"][0] > 0
    context_helps = context_step["mean_difference"] > 0 and context_step["ci95"][0] > 0
    return {
        "step": 0,
        "question": "does the local graph hold the answer?",
        "passed": passed,
        "verdict": ("passes: the graph's triples as text make the answer likelier than the question alone" if passed
                    else "fails: no information in the graph the frozen LLM can use" if context_helps
                    else "fails: neither the graph's triples nor the memory context make the answer likelier to this LLM"),
        "context_helps": context_helps,
        "context_note": None if context_helps else (
            "The memory context does not make the answer likelier either (question − context above): this frozen LLM reads no "
            "useful information from any text here, so the step cannot tell a graph without the answer from an LLM too small "
            "to use it; repeat it with a larger LLM (`--llm`) before building on either reading."),
        "test_questions": len(test),
        "test_questions_total": len(every),
        "split": summary["split"],
        "coverage": coverage(test),
        "answer_loss": mean,
        "comparisons": comparisons,
        "prompts": {p.key: p.name for p in PROMPTS},
        "wall_s": {"prompts": timings, "total": round(time.perf_counter() - started, 1)},
        "llm": args.llm, "max_context_tokens": args.max_context_tokens,
        "machine": machine_info(), "git": git_state(),
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    """The step's report: the verdict, coverage, mean losses and the paired differences with their intervals."""
    cov = result["coverage"]
    lines = [
        "# Graph-token study, step 0: does the local graph hold the answer?", "",
        f"**{result['verdict']}.** {result['test_questions']} of the {result['test_questions_total']} test questions of {', '.join(result['split']['test'])} "
        f"(conversations the study never trains on), frozen {result['llm']}, no graph tokens, context cut to "
        f"{result['max_context_tokens']} tokens.", "",
        "| where | answers all of whose words appear | mean share of an answer's words |", "|---|---|---|",
        *(f"| {where} | {c['all_words']:.3f} | {c['mean_word_share']:.3f} |" for where, c in cov.items()), "",
        "| prompt | answer-span loss (nats a token) | wall time (s) |", "|---|---|---|",
        *(f"| {result['prompts'][k]} | {v:.3f} | {result['wall_s']['prompts'][k]:.0f} |" for k, v in result["answer_loss"].items()), "",
        "Loss of the control minus loss of the treatment (above 0: the treatment makes the answer likelier), paired bootstrap 95% interval over questions:", "",
        "| control | treatment | measures | difference | 95% interval |", "|---|---|---|---|---|",
        *(f"| {c['control']} | {c['treatment']} | {c['measures']} | {c['mean_difference']:+.3f} | [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] |"
          for c in result["comparisons"]), "",
        *([result["context_note"], ""] if result.get("context_note") else []),
        f"Commit: {commit_text(result['git'])}. Machine: {machine_text(result['machine'])}.", "",
    ]  # fmt: skip
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The study's command line (the same data settings, so the same prepared data), named for this step."""
    p = study_parser()
    p.prog, p.description = "python -m experiments.graph_token.information", __doc__.splitlines()[0]
    p.add_argument("--step-questions", type=int, default=None, help="a seeded sample of this many test questions (default: every one)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run step 0 over ``--out`` (the study's output folder)."""
    return run_step(parser().parse_args(argv), "information", run, markdown, ("step_questions", "eval_batch_size"))


if __name__ == "__main__":
    sys.exit(main())
