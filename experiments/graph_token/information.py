"""Step 0 of the graph-token study: does the local graph hold the answer? No graph training.

    python -m experiments.graph_token.information --out out/graph_token     # over the study's prepared data

On the study's test questions (its data stage, :func:`experiments.graph_token.data.prepare_data`, run here when
missing): the share of gold answers whose words appear in the local graph's node and edge labels (and, for
reference, in the memory context), and the frozen LLM's answer-span loss under four prompts, no graph tokens:
(i) the question only, (ii) the question and the graph's triples as text, (iii) the question and the memory context,
(iv) the context and the triples. The step passes when (ii) is below (i) with a paired-bootstrap 95% interval
excluding 0: if the graph's own words do not make the answer likelier to the LLM, no token made from the graph can.
Results go to ``<out>/information/`` (``losses-<prompt>.json`` per prompt, kept, so a killed run resumes at the next
prompt; ``results.json`` and ``results.md``). Beside coverage, the report says why an answer's words are missing: their
kind (dates and times, numbers, names, other words), whether the context holds them, and how often the working memory
holds an evidence turn at all.

    ... --session-dates LOCOMO.json --time-edges      # the graphs rebuilt with the dates ConvoMem drops (dated.py)

rebuilds each test question's graph with LoCoMo's session dates and ``graph.time_edges`` into
``<out>/information-dated-time-edges/``; the prompts without the graph are reused from ``<out>/information/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.machine import machine_info
from experiments.common import commit_text, git_state, machine_text, paired_bootstrap
from experiments.graph_token.arms import variants
from experiments.graph_token.cli import parser as study_parser
from experiments.graph_token.data import RETRIEVAL_K
from experiments.graph_token.steps import question_sample, run_step, saved_or_computed, step_folder
from qgmem_train.errors import InputError
from qgmem_train.fileio import write_json_atomic
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
REQUIRED_PROMPTS = ("question", "triples", "context")
REQUIRED_COMPARISONS = (("question", "triples"), ("question", "context"))
"""The step's test and its reading of the context: the prompts every run measures (``--prompts`` may leave the others out)."""
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


MONTHS = {"january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"}
TIME_WORDS = MONTHS | {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "week", "weeks", "weekend",
                       "month", "months", "year", "years", "day", "days", "yesterday", "today", "tomorrow", "ago", "last", "next",
                       "before", "after", "morning", "afternoon", "evening", "night"}  # fmt: skip
NUMBER_WORDS = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "once", "twice"}
WORD_KINDS = ("date or time", "number", "name", "other")


def word_kind(word: str, answer: str) -> str:
    """What an answer's word is: a date or time word (a month, a weekday, a year, "week", "ago"), a number, a name
    (capitalised inside the answer), or another word."""
    if word in TIME_WORDS or re.fullmatch(r"(19|20)\d\d", word):
        return "date or time"
    if word in NUMBER_WORDS or re.fullmatch(r"\d+(st|nd|rd|th|s)?", word):
        return "number"
    if any(m[0].isupper() for m in re.findall(rf"\b{re.escape(word)}\b", answer, re.IGNORECASE)):
        return "name"
    return "other"


def missing_words(examples: list[Any]) -> dict[str, dict[str, int]]:
    """Per kind of answer word (:func:`word_kind`): how many the answers hold, how many the graph's labels miss, and how
    many of those the memory context holds (the graph could hold them; the others the working memory lacks)."""
    rows = {kind: {"answer_words": 0, "missing_from_graph": 0, "of_which_in_context": 0} for kind in WORD_KINDS}
    for example in examples:
        graph, context = label_words(example.graph), words(example.context)
        for word in words(example.answer):
            row = rows[word_kind(word, example.answer)]
            row["answer_words"] += 1
            row["missing_from_graph"] += word not in graph
            row["of_which_in_context"] += word not in graph and word in context
    return rows


def evidence_recall(out: Path, question_ids: set[str]) -> dict[str, Any]:
    """Of the questions ``question_ids``, the share whose working memory holds a unit citing an evidence turn, from the
    data prep's case records (``<out>/data/prep/shards/*/cases/*.json``)."""
    from data_prep.targets import cites

    found = [any(cites(u["source_text"], q["evidence_texts"]) for u in q["units"])
             for case in sorted((out / "data" / "prep" / "shards").glob("*/cases/*.json"))
             for q in json.loads(case.read_text())["questions"] if q["question_id"] in question_ids]  # fmt: skip
    return {"questions": len(found), "share": sum(found) / max(1, len(found))}


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


def step_name(args: argparse.Namespace) -> str:
    """The step's folder: ``information`` for the graphs as prepared, else named after how they were rebuilt."""
    return "information" + ("-dated" if args.session_dates else "") + ("-time-edges" if args.time_edges else "")


def rebuilt_data(args: argparse.Namespace, folder: Path, data_path: Path) -> Path:
    """The prepared trajectories with the test questions' graphs rebuilt (:mod:`experiments.graph_token.dated`) in
    ``<folder>/trajectories`` (written once, read again on a rerun); the prepared ones when nothing is rebuilt."""
    if step_name(args) == "information":
        return data_path
    path = folder / "trajectories"
    if not path.exists():
        from experiments.graph_token.dated import dated_graphs, prep_store, session_dates
        from qgmem_train.trajectory import read_trajectory_dataset, write_trajectory_dataset

        splits = {name: list(part) for name, part in read_trajectory_dataset(data_path).items()}
        dates = session_dates(args.session_dates) if args.session_dates else None
        splits["test"] = dated_graphs(splits["test"], prep_store(args.out.resolve()), dates, max_edges=RETRIEVAL_K,
                                      attribute_edges=args.attribute_edges, time_edges=args.time_edges)  # fmt: skip
        write_trajectory_dataset(splits, path)
    return path


def reused_losses(args: argparse.Namespace, prompt: Prompt, folder: Path, test: list[Any]) -> None:
    """A prompt without the graph gives the same losses whatever the graph: copy them from ``<out>/information`` into
    ``folder`` when they are there for the same questions (a rebuilt-graph run then computes only the graph's prompts)."""
    source, target = args.out.resolve() / "information" / f"losses-{prompt.key}.json", folder / f"losses-{prompt.key}.json"
    if prompt.triples or source == target or target.exists() or not source.exists():
        return
    record = json.loads(source.read_text())
    if set(record["losses"]) == {ex.question_id for ex in test}:
        write_json_atomic(target, {**record, "reused_from": str(source)})


def losses_of_prepared(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Answer-span loss per question of each prompt saved in ``<out>/information`` (the graphs as prepared)."""
    folder = args.out.resolve() / "information"
    return {f"{p.key} as prepared": {q: v["answer_loss"] for q, v in json.loads((folder / f"losses-{p.key}.json").read_text())["losses"].items()}
            for p in PROMPTS if (folder / f"losses-{p.key}.json").exists()}  # fmt: skip


def per_category(
    comparison: dict[str, Any], answer_loss: dict[str, dict[str, float]], prepared: dict[str, dict[str, float]], categories: dict[str, str],
    args: argparse.Namespace,
) -> dict[str, dict[str, Any]]:
    """The comparison's paired difference and interval within each question category (temporal, multi-session, ...)."""
    control = answer_loss.get(comparison["control"]) or prepared[comparison["control"]]
    treatment = answer_loss[comparison["treatment"]]
    found = {}
    for category in sorted({categories[q] for q in treatment}):
        ids = [q for q in treatment if categories[q] == category]
        boot = paired_bootstrap({q: control[q] for q in ids}, {q: treatment[q] for q in ids}, args.bootstrap_resamples, args.bootstrap_seed)
        found[category] = {key: boot[key] for key in ("questions", "mean_difference", "ci95")}
    return found


def rebuilt_against_prepared(args: argparse.Namespace, rebuilt: bool, answer_loss: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """With rebuilt graphs, each graph prompt's loss with the graphs as prepared (``<out>/information``'s, when there for
    the same questions) minus its loss with the rebuilt ones: above 0, the rebuilt graphs make the answer likelier."""
    found = []
    prepared = losses_of_prepared(args) if rebuilt else {}
    for key in ("triples", "context+triples") if rebuilt else ():
        before = prepared.get(f"{key} as prepared")
        if key in answer_loss and before is not None and set(before) == set(answer_loss[key]):
            found.append({"control": f"{key} as prepared", "treatment": key, "measures": "the rebuilt graphs against the prepared ones",
                          **paired_bootstrap(before, answer_loss[key], args.bootstrap_resamples, args.bootstrap_seed)})  # fmt: skip
    return found


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
    if missing := [key for key in REQUIRED_PROMPTS if key not in args.prompts]:
        raise InputError("--prompts", f"must include {', '.join(missing)} (the step's test and its context reading)")
    folder, summary, prepared_path = step_folder(args, step_name(args))
    data_path = rebuilt_data(args, folder, prepared_path)
    from qgmem_train.trajectory import read_trajectory_dataset

    every = list(read_trajectory_dataset(data_path)["test"])
    test = question_sample(every, args.step_questions, args.split_seed)
    prepared = list(read_trajectory_dataset(prepared_path)["test"])
    losses: dict[str, dict[str, dict[str, float]]] = {}
    timings: dict[str, float] = {}
    reused: list[str] = []
    for prompt in (p for p in PROMPTS if p.key in args.prompts):
        log.info("[%s] %s: the frozen LLM over %d test questions", prompt.key, prompt.name, len(test))
        reused_losses(args, prompt, folder, test)
        record = saved_or_computed(folder / f"losses-{prompt.key}.json", prompt.key, lambda: {"losses": prompt_losses(args, prompt, data_path)})
        losses[prompt.key], timings[prompt.key] = record["losses"], record["wall_s"]
        reused += [prompt.key] if "reused_from" in record else []
    answer_loss = {key: {q: v["answer_loss"] for q, v in per_q.items()} for key, per_q in losses.items()}
    mean = {key: sum(v.values()) / len(v) for key, v in answer_loss.items()}
    comparisons = [
        {"control": control, "treatment": treatment, "measures": what,
         **paired_bootstrap(answer_loss[control], answer_loss[treatment], args.bootstrap_resamples, args.bootstrap_seed)}
        for control, treatment, what in COMPARISONS if control in answer_loss and treatment in answer_loss
    ]  # fmt: skip
    comparisons += rebuilt_against_prepared(args, data_path != prepared_path, answer_loss)
    categories = {q: v["category"] for q, v in summary["questions"].items()}
    for comparison in comparisons:
        comparison["per_category"] = per_category(comparison, answer_loss, losses_of_prepared(args), categories, args)
    test_step, context_step = (next(c for c in comparisons if (c["control"], c["treatment"]) == pair) for pair in REQUIRED_COMPARISONS)
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
        "coverage_all": coverage(every),
        "coverage_prepared_graph": None if data_path == prepared_path else {
            "sample": coverage(question_sample(prepared, args.step_questions, args.split_seed))["graph"], "all": coverage(prepared)["graph"]},
        "missing_words": missing_words(every),
        "missing_words_prepared_graph": None if data_path == prepared_path else missing_words(prepared),
        "evidence_recall": evidence_recall(args.out.resolve(), {ex.question_id for ex in every}),
        "graphs": ("as prepared" if data_path == prepared_path else
                   f"rebuilt from the data prep's store{' with the session dates of ' + args.session_dates.name if args.session_dates else ''}, "
                   f"time edges {'on' if args.time_edges else 'off'}; the memory context as prepared"),
        "answer_loss": mean,
        "comparisons": comparisons,
        "prompts": {p.key: p.name for p in PROMPTS},
        "reused": reused,
        "not_run": [p.key for p in PROMPTS if p.key not in args.prompts],
        "wall_s": {"prompts": timings, "total": round(time.perf_counter() - started, 1)},
        "llm": args.llm, "max_context_tokens": args.max_context_tokens,
        "machine": machine_info(), "git": git_state(),
    }  # fmt: skip


def coverage_lines(result: dict[str, Any]) -> list[str]:
    """The coverage table (the loss pass's questions and every test question), why words are missing, evidence recall."""
    n, total = result["test_questions"], result["test_questions_total"]
    rows = [("graph", result["coverage"]["graph"], result["coverage_all"]["graph"])]
    if result.get("coverage_prepared_graph"):
        rows = [("graph, rebuilt", *rows[0][1:]), ("graph as prepared", result["coverage_prepared_graph"]["sample"], result["coverage_prepared_graph"]["all"])]
    rows.append(("context", result["coverage"]["context"], result["coverage_all"]["context"]))
    missing, recall, before = result["missing_words"], result["evidence_recall"], result.get("missing_words_prepared_graph")
    return [
        f"Graphs: {result.get('graphs', 'as prepared')}.", "",
        f"| where | all of an answer's words appear ({n} q) | mean share of its words ({n} q) | all words ({total} q) | mean share ({total} q) |",
        "|---|---|---|---|---|",
        *(f"| {where} | {a['all_words']:.3f} | {a['mean_word_share']:.3f} | {b['all_words']:.3f} | {b['mean_word_share']:.3f} |" for where, a, b in rows), "",
        f"Why answer words are missing from the graph, on all {total} test questions (a word counted once an answer):", "",
        "| kind of word | in answers | missing from the graph | of those, in the context |"
        + (" missing from the graph as prepared | of those, in the context |" if before else ""), "|---|---|---|---|" + ("---|---|" if before else ""),
        *(f"| {kind} | {m['answer_words']} | {m['missing_from_graph']} | {m['of_which_in_context']} |"
          + (f" {before[kind]['missing_from_graph']} | {before[kind]['of_which_in_context']} |" if before else "") for kind, m in missing.items()), "",
        f"The working memory holds an evidence turn of the question for {recall['share']:.3f} of the {recall['questions']} test questions "
        "(a word the context lacks is not in the working memory at all: retrieval, not the graph, lost it).", "",
    ]  # fmt: skip


def category_lines(result: dict[str, Any]) -> list[str]:
    """Each comparison's difference and interval within each question category (none in a report written before)."""
    rows = [c for c in result["comparisons"] if c.get("per_category")]
    if not rows:
        return []
    categories = list(rows[0]["per_category"])
    cell = lambda c: f"{c['mean_difference']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"  # noqa: E731
    return [
        "The same differences within each question category:", "",
        "| category | questions | " + " | ".join(f"{c['control']} − {c['treatment']}" for c in rows) + " |", "|---|---|" + "---|" * len(rows),
        *(f"| {k} | {rows[0]['per_category'][k]['questions']} | " + " | ".join(cell(c["per_category"][k]) for c in rows) + " |" for k in categories), "",
    ]  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    """The step's report: the verdict, coverage, mean losses and the paired differences with their intervals."""
    lines = [
        "# Graph-token study, step 0: does the local graph hold the answer?", "",
        f"**{result['verdict']}.** {result['test_questions']} of the {result['test_questions_total']} test questions of {', '.join(result['split']['test'])} "
        f"(conversations the study never trains on), frozen {result['llm']}, no graph tokens, context cut to "
        f"{result['max_context_tokens']} tokens.", "",
        *coverage_lines(result),
        "| prompt | answer-span loss (nats a token) | wall time (s) |", "|---|---|---|",
        *(f"| {result['prompts'][k]} | {v:.3f} | {result['wall_s']['prompts'][k]:.0f}{' (reused)' if k in result.get('reused', []) else ''} |"
          for k, v in result["answer_loss"].items()), "",
        "Loss of the control minus loss of the treatment (above 0: the treatment makes the answer likelier), paired bootstrap 95% interval over questions:", "",
        "| control | treatment | measures | difference | 95% interval |", "|---|---|---|---|---|",
        *(f"| {c['control']} | {c['treatment']} | {c['measures']} | {c['mean_difference']:+.3f} | [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] |"
          for c in result["comparisons"]), "",
        *category_lines(result),
        *([result["context_note"], ""] if result.get("context_note") else []),
        *([f"Not run (`--prompts`): {', '.join(result['prompts'][k] for k in result['not_run'])}.", ""] if result.get("not_run") else []),
        f"Commit: {commit_text(result['git'])}. Machine: {machine_text(result['machine'])}.", "",
    ]  # fmt: skip
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The study's command line (the same data settings, so the same prepared data), named for this step."""
    p = study_parser()
    p.prog, p.description = "python -m experiments.graph_token.information", __doc__.splitlines()[0]
    p.add_argument("--step-questions", type=int, default=None, help="a seeded sample of this many test questions (default: every one)")
    p.add_argument("--session-dates", type=Path, default=None, metavar="LOCOMO_JSON",
                   help="rebuild the test graphs with the session dates of LoCoMo's own file (ConvoMem's re-packed LoCoMo sessions have none)")
    p.add_argument("--prompts", nargs="+", choices=[p.key for p in PROMPTS], default=[p.key for p in PROMPTS],
                   help=f"the prompts to measure (at least {', '.join(REQUIRED_PROMPTS)}: the step's test and its context reading)")
    p.add_argument("--time-edges", action="store_true", help="rebuild the test graphs with graph.time_edges (the day said, the times named)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run step 0 over ``--out`` (the study's output folder)."""
    args = parser().parse_args(argv)
    return run_step(args, step_name(args), run, markdown, ("step_questions", "eval_batch_size"))


if __name__ == "__main__":
    sys.exit(main())
