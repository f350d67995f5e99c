"""Step 0 of the graph-token study: does the local graph hold the answer? No graph training.

    python -m experiments.graph_token.information --out out/graph_token     # over the study's prepared data

On the study's test questions (its data stage, :func:`experiments.graph_token.data.prepare_data`, run here when
missing): the share of gold answers whose words appear in the local graph's node and edge labels (and, for
reference, in the memory context), and the frozen LLM's answer-span loss under seven prompts, no graph tokens:
(i) the question only, (ii) the question and the graph's triples as text, (iii) the question and the memory context,
(iv) the context and the triples; two controls in the context's place, (v) the benchmark's gold evidence turns (the
oracle: does this LLM use text that holds the evidence?) and (vi) one line stating the gold answer (the harness's
positive control); and (vii) the triples of a graph built from the units citing the evidence turns (does a graph of the
units that hold the evidence keep what answers need?). The step passes when (ii) is below (i) with a paired-bootstrap
95% interval excluding 0: if the graph's own words do not make the answer likelier to the LLM, no token made from the
graph can. When neither (ii) nor (iii) helps, (v) tells a graph without usable information (the evidence helps) from an
LLM too small to use any memory text (it does not); (ii) and (iii) are also split by whether the graph (the context)
holds half the answer's words.
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

from qgmem_train.reports import commit_text, git_state, machine_info, machine_text, paired_bootstrap, portable
from experiments.graph_token.arms import variants
from experiments.graph_token.cli import parser as study_parser
from experiments.graph_token.data import RETRIEVAL_K
from experiments.graph_token.steps import llm_instrument, part_settings, question_sample, run_step, saved_or_computed, step_folder
from qgmem_train.errors import InputError
from qgmem_train.fileio import write_json_atomic
from qgmem_train.metrics.answers import normalize_answer

log = logging.getLogger("experiments.graph_token.information")


@dataclass(frozen=True)
class Prompt:
    """One of step 0's prompts: what its memory-context slot holds and whether the graph's triples follow as text."""

    key: str
    name: str
    slot: str
    """``nothing``, ``memory`` (the retrieved memory context), ``evidence`` (the benchmark's gold evidence turns of the
    question: the oracle) or ``answer`` (one line stating the gold answer: the harness's positive control)."""
    triples: bool
    memory: str = "retrieved"
    """The working memory whose graph (and, with the ``memory`` slot, whose context) the prompt reads: ``retrieved`` (the
    data prep's), ``evidence`` (a graph of the units citing the gold evidence turns alone) or ``oracle`` (those units
    first, filled to the same k with retrieved ones: retrieval made perfect; :mod:`experiments.graph_token.dated`)."""


PROMPTS = (
    Prompt("question", "(i) question only", slot="nothing", triples=False),
    Prompt("triples", "(ii) question + the graph's triples as text", slot="nothing", triples=True),
    Prompt("context", "(iii) question + memory context", slot="memory", triples=False),
    Prompt("context+triples", "(iv) memory context + triples", slot="memory", triples=True),
    Prompt("evidence", "(v) question + the gold evidence turns (oracle)", slot="evidence", triples=False),
    Prompt("answer", "(vi) question + a line stating the gold answer (positive control)", slot="answer", triples=False),
    Prompt("evidence-graph", "(vii) question + the triples of a graph built from the evidence turns' units", slot="nothing", triples=True,
           memory="evidence"),
    Prompt("triples-oracle", "(ii-oracle) question + the oracle working memory's triples", slot="nothing", triples=True, memory="oracle"),
    Prompt("context-oracle", "(iii-oracle) question + the oracle working memory's context", slot="memory", triples=False, memory="oracle"),
    Prompt("context+triples-oracle", "(iv-oracle) the oracle context + its triples", slot="memory", triples=True, memory="oracle"),
)
REQUIRED_PROMPTS = ("question", "triples", "context")
REQUIRED_COMPARISONS = (("question", "triples"), ("question", "context"))
"""The step's test and its reading of the context: the prompts every run measures (``--prompts`` may leave the others out),
unless it measures the oracle test alone (:data:`ORACLE_PROMPTS`)."""
ORACLE_PROMPTS = ("question", "triples-oracle")
"""The step's test under oracle retrieval: enough for a run that measures a graph representation there (:func:`oracle_verdict`)."""
COMPARISONS = (
    ("question", "triples", "the graph's triples alone (the step's test)"),
    ("context", "context+triples", "the triples on top of the context"),
    ("question", "context", "the context alone"),
    ("question", "evidence", "the gold evidence turns (the oracle: does this LLM use text holding the evidence?)"),
    ("question", "answer", "a line stating the gold answer (the harness's positive control)"),
    ("question", "evidence-graph", "the triples of a graph built from the evidence turns' units (does such a graph hold what answers need?)"),
    ("evidence-graph", "evidence", "the evidence turns against their graph's triples (what building the graph drops)"),
    ("question", "triples-oracle", "the oracle working memory's triples alone (the step's test under oracle retrieval)"),
    ("question", "context-oracle", "the oracle context alone"),
    ("context", "context-oracle", "retrieval cost: the oracle working memory's context against the retrieved one's"),
    ("triples-oracle", "context-oracle", "representation cost: the oracle context against its own graph's triples"),
    ("context-oracle", "context+triples-oracle", "the oracle triples on top of the oracle context"),
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


def case_questions(out: Path, question_ids: set[str]) -> list[dict[str, Any]]:
    """The data prep's records (``<out>/data/prep/shards/*/cases/*.json``) of the questions ``question_ids``: each with its
    benchmark evidence turns (``evidence_texts``) and its working memory's units."""
    return [q for case in sorted((out / "data" / "prep" / "shards").glob("*/cases/*.json"))
            for q in json.loads(case.read_text())["questions"] if q["question_id"] in question_ids]  # fmt: skip


def evidence_recall(out: Path, question_ids: set[str], categories: dict[str, str] | None = None) -> dict[str, Any]:
    """Of the questions ``question_ids``, the share whose working memory holds a unit citing an evidence turn, in all and
    within each category of ``categories`` (question id → category)."""
    from data_prep.targets import cites

    found = {q["question_id"]: any(cites(u["source_text"], q["evidence_texts"]) for u in q["units"]) for q in case_questions(out, question_ids)}
    share = lambda ids: {"questions": len(ids), "share": sum(found[q] for q in ids) / max(1, len(ids))}  # noqa: E731
    groups = {category: [q for q in found if categories.get(q) == category] for category in sorted(set((categories or {}).values()))}
    return {**share(list(found)), "per_category": {category: share(ids) for category, ids in groups.items() if ids}}


def evidence_texts(out: Path, question_ids: set[str]) -> dict[str, list[str]]:
    """The gold evidence turns' text of each question of ``question_ids``, from the data prep's case records; a question
    without a record is one clear error (the evidence prompt would silently be the question alone)."""
    found = {q["question_id"]: list(q["evidence_texts"]) for q in case_questions(out, question_ids)}
    if missing := sorted(question_ids - set(found)):
        raise InputError(str(out / "data" / "prep" / "shards"), f"no case record holds question {missing[0]} ({len(missing)} missing)")
    return found


ANSWER_LINE = "The answer is: {answer}"
"""The answer control's context slot: one line stating the gold answer."""


def slot_examples(prompt: Prompt, examples: list[Any], evidence: dict[str, list[str]]) -> list[Any]:
    """``examples`` with their memory-context slot holding what ``prompt`` puts there (:attr:`Prompt.slot`); ``evidence`` maps a
    question id to its gold evidence turns (:func:`evidence_texts`), one a line in the slot."""
    slot = {
        "nothing": lambda ex: "",
        "memory": lambda ex: ex.context,
        "evidence": lambda ex: "\n".join(evidence[ex.question_id]),
        "answer": lambda ex: ANSWER_LINE.format(answer=" ".join(ex.answer.split())),
    }[prompt.slot]
    return [replace(ex, context=slot(ex)) for ex in examples]


def word_shares(example: Any) -> dict[str, float] | None:
    """The share of the gold answer's words that the graph's labels (``graph``) and the memory context (``context``)
    hold; None for an answer without words."""
    answer = words(example.answer)
    if not answer:
        return None
    return {where: len(answer & vocabulary) / len(answer) for where, vocabulary in
            (("graph", label_words(example.graph)), ("context", words(example.context)))}  # fmt: skip


def coverage(examples: list[Any]) -> dict[str, Any]:
    """How much of each gold answer the graph's labels and the memory context hold: the share of answers all of whose
    words appear there, and the mean share of an answer's words that do."""
    found = [shares for shares in map(word_shares, examples) if shares is not None]
    return {
        where: {"answers": len(found), "all_words": sum(s[where] == 1.0 for s in found) / max(1, len(found)),
                "mean_word_share": sum(s[where] for s in found) / max(1, len(found))}
        for where in ("graph", "context")
    }  # fmt: skip


COVERED_SHARE = 0.5
"""A question's graph (or context) covers its answer when it holds at least this share of the answer's words."""
BY_COVERAGE = (("graph", "question", "triples"), ("context", "question", "context"))
"""(where, control, treatment): each comparison split by whether ``where`` covers the answer (:data:`COVERED_SHARE`)."""


def by_coverage(examples: list[Any], answer_loss: dict[str, dict[str, float]], resamples: int, seed: int) -> list[dict[str, Any]]:
    """The step's test (question − triples) within the questions whose graph covers the answer and within the rest, and
    question − context split by the context's coverage alike: do the triples help where they hold the answer? From the
    losses already measured; answers without words are left out, as :func:`coverage` leaves them out."""
    shares = {ex.question_id: found for ex in examples if (found := word_shares(ex)) is not None}
    rows = []
    for where, control, treatment in BY_COVERAGE:
        if control not in answer_loss or treatment not in answer_loss:
            continue
        for holds in (True, False):
            ids = [q for q in answer_loss[treatment] if q in shares and (shares[q][where] >= COVERED_SHARE) == holds]
            boot = paired_bootstrap({q: answer_loss[control][q] for q in ids}, {q: answer_loss[treatment][q] for q in ids}, resamples, seed) if ids else {}
            rows.append({"where": where, "holds_half": holds, "control": control, "treatment": treatment, "questions": len(ids),
                         **{key: boot[key] for key in ("mean_difference", "ci95") if key in boot}})  # fmt: skip
    return rows


HARNESS_NATS = 1.0
"""The answer control passes when a line stating the gold answer lowers its loss by more than this (nats a token), with
the interval's low end above it: a wide margin, since the LLM need only copy."""


def harness_works(answer: dict[str, Any]) -> bool:
    """Whether the answer control (question − answer) clears :data:`HARNESS_NATS` with its whole interval."""
    return answer["ci95"][0] > HARNESS_NATS


def helps(comparison: dict[str, Any] | None) -> bool:
    """Whether a comparison's treatment makes the answer likelier: its difference and its interval's low end above 0."""
    return comparison is not None and comparison["mean_difference"] > 0 and comparison["ci95"][0] > 0


def step_verdict(comparisons: list[dict[str, Any]]) -> tuple[str, str | None]:
    """The step's verdict and a note on what it rests on, from the question-only comparisons: the harness's answer control
    (when run) first, then the triples (the step's test), the memory context, and the gold evidence turns (when run),
    which tell a graph without usable information from an LLM too small to use any memory text (the oracle working memory's
    context tells them apart alike when the evidence prompt was not run)."""
    against = {c["treatment"]: c for c in comparisons if c["control"] == "question"}
    answer, evidence = against.get("answer"), against.get("evidence") or against.get("context-oracle")
    if answer is not None and not harness_works(answer):
        return (f"undecided: the harness is broken (a line stating the gold answer does not lower its loss by {HARNESS_NATS:g} nats a token)",
                "With the answer itself in the context slot the loss should fall far below the question-only loss; until it "
                "does, no difference in this report can be read.")  # fmt: skip
    if helps(against["triples"]):
        return "passes: the graph's triples as text make the answer likelier than the question alone", None
    if helps(against["context"]):
        return "fails: no information in the graph the frozen LLM can use", None
    if evidence is None:
        return ("fails: neither the graph's triples nor the memory context make the answer likelier to this LLM",
                "The memory context does not make the answer likelier either (question − context above): this frozen LLM reads "
                "no useful information from any text here, so the step cannot tell a graph without the answer from an LLM too "
                "small to use it; run the evidence prompt (`--prompts ... evidence`) or repeat it with a larger LLM (`--llm`).")  # fmt: skip
    if helps(evidence):
        return ("fails: no information in the graph (or the working memory) the LLM can use",
                "The gold evidence turns make the answer likelier (question − evidence above): this LLM is able to use text "
                "that holds the answer's evidence, so the triples and the memory context fail for what they hold, not for the "
                "LLM's size.")  # fmt: skip
    return ("undecided: this LLM is too small to use any memory text (not even the gold evidence turns make the answer likelier)",
            "Neither the triples, the memory context nor the gold evidence turns make the answer likelier (question − evidence "
            f"above){', while the answer itself does' if answer is not None else ''}: the step cannot tell a graph without the answer "
            "from an LLM too small to use text; repeat it with a larger LLM (`--llm`).")  # fmt: skip


ORACLE_NATS = 0.25
"""Under oracle retrieval a graph representation passes when its triples beat the question alone (interval above 0) and
cost at most this many nats a token against the oracle context (the representation cost's mean)."""


def oracle_verdict(comparisons: list[dict[str, Any]]) -> tuple[bool, str] | None:
    """Whether the graph carries what the oracle working memory's text carries (:data:`ORACLE_NATS`), and why; None when
    the oracle prompts were not run. Without this run's oracle context, the representation cost is taken against the oracle
    context as stored (``<out>/information``'s)."""
    found = {(c["control"], c["treatment"]): c for c in comparisons}
    alone, cost = found.get(("question", "triples-oracle")), found.get(("triples-oracle", "context-oracle"))
    if cost is None and (stored := found.get(("context-oracle as prepared", "triples-oracle"))) is not None:
        cost = {**stored, "mean_difference": -stored["mean_difference"], "ci95": [-stored["ci95"][1], -stored["ci95"][0]]}
    if alone is None or cost is None:
        return None
    within = cost["mean_difference"] <= ORACLE_NATS
    if helps(alone) and within:
        return True, f"passes: its triples beat the question alone and come within {ORACLE_NATS} nats a token of the oracle context"
    why = [] if helps(alone) else ["its triples do not beat the question alone with an interval above 0"]
    why += [] if within else [f"they cost {cost['mean_difference']:.3f} nats a token against the oracle context (the bar is {ORACLE_NATS})"]
    return False, "fails: " + " and ".join(why)


def step_name(args: argparse.Namespace) -> str:
    """The step's folder: ``information`` for the graphs as prepared, else named after how they were rebuilt."""
    return "information" + ("-dated" if args.session_dates else "") + ("-time-edges" if args.time_edges else "") + (
        "-names" if args.speaker_names else "") + (f"-{args.graph_object}" if args.graph_object != "gist" else "") + (
        f"-cap{args.attribute_cap}" if args.attribute_cap else "") + ("" if args.attribute_edges else "-no-attribute-edges")  # fmt: skip


def graph_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The rebuilt graphs' ``graph.*`` options (:func:`~qgmem_train.graph.local_graph.graph_options`) from the command line."""
    from qgmem_train.config import GraphConfig
    from qgmem_train.graph.local_graph import graph_options

    return graph_options(GraphConfig(attribute_edges=args.attribute_edges, time_edges=args.time_edges, object=args.graph_object,
                                     object_words=args.object_words, attribute_cap=args.attribute_cap))  # fmt: skip


REBUILT_FOLDERS = {"retrieved": "trajectories", "evidence": "evidence-graph-trajectories", "oracle": "oracle-trajectories"}
"""Where :func:`rebuilt_data` writes each working memory's rebuilt test questions, in the step's folder."""


def rebuilt_data(args: argparse.Namespace, folder: Path, data_path: Path, memory: str = "retrieved") -> Path:
    """The prepared trajectories with the test questions' graphs rebuilt (:mod:`experiments.graph_token.dated`) from
    ``memory`` (:attr:`Prompt.memory`) in ``<folder>/<REBUILT_FOLDERS[memory]>`` (written once, read again on a rerun);
    the prepared ones when nothing is rebuilt."""
    if step_name(args) == "information" and memory == "retrieved":
        return data_path
    path = folder / REBUILT_FOLDERS[memory]
    if not path.exists():
        from experiments.graph_token.dated import dated_graphs, prep_store, session_dates, speaker_names
        from qgmem_train.trajectory import read_trajectory_dataset, write_trajectory_dataset

        splits = {name: list(part) for name, part in read_trajectory_dataset(data_path).items()}
        dates = session_dates(args.session_dates) if args.session_dates else None
        evidence = evidence_texts(args.out.resolve(), {ex.question_id for ex in splits["test"]}) if memory != "retrieved" else None
        speakers = speaker_names(args.out.resolve() / "data" / "source", args.session_dates) if args.speaker_names else None
        splits["test"] = dated_graphs(splits["test"], prep_store(args.out.resolve()), dates, max_edges=RETRIEVAL_K, graph=graph_settings(args),
                                      evidence=evidence, memory=memory, speakers=speakers)  # fmt: skip
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
        write_json_atomic(target, {**record, "reused_from": portable(str(source), args.out.resolve())})


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
    pairs = [(key, key, "the rebuilt graphs (or units) against the prepared ones") for key in ("triples", "context+triples", "triples-oracle", "context-oracle")]
    pairs += [("context-oracle", "triples-oracle", "representation cost against the oracle context as stored (no dates, no names)")]
    for before_key, key, what in pairs if rebuilt else ():
        before = prepared.get(f"{before_key} as prepared")
        if key in answer_loss and before is not None and set(before) == set(answer_loss[key]):
            found.append({"control": f"{before_key} as prepared", "treatment": key, "measures": what,
                          **paired_bootstrap(before, answer_loss[key], args.bootstrap_resamples, args.bootstrap_seed)})  # fmt: skip
    return found


LABELS = "each edge labelled with its unit's memory-context label"
"""How the triples are numbered (one scheme with the memory context since trajectory schema 2; before, edges were
numbered apart, so a reasoning path's label could name another triple): a saved part of the other numbering is remade."""


def graph_representation(args: argparse.Namespace, prompt: Prompt) -> str:
    """The graph whose triples ``prompt`` reads, as its part's settings name it (``none`` for a prompt without triples)."""
    if not prompt.triples:
        return "none"
    built = {"retrieved": "the working memory", "evidence": "the evidence turns' units", "oracle": "the oracle working memory"}[prompt.memory]
    dates = args.session_dates.name if args.session_dates else "as stored"
    options = graph_settings(args)
    return (f"built from {built}; attribute edges {'on' if args.attribute_edges else 'off'} (cap {options['attribute_cap'] or 'none'}, "
            f"no stop words or common targets); object {options['object_kind']} ({options['object_words']} words); session dates {dates}; "
            f"speakers {'named from ' + dates if args.speaker_names else 'as stored'}; time edges {'on' if args.time_edges else 'off'}; "
            f"{LABELS}")  # fmt: skip


def retrieval_arm(prompt: Prompt) -> str:
    """Which working memory ``prompt`` reads (:attr:`Prompt.memory`), or ``none`` when it reads none."""
    return prompt.memory if prompt.slot == "memory" or prompt.triples else "none"


def prompt_settings(args: argparse.Namespace, prompt: Prompt) -> dict[str, Any]:
    """What one prompt's losses depend on (a saved part is reused only under the same): the LLM with its quantization
    (:func:`~experiments.graph_token.steps.llm_instrument`), the context cut, the prepared data, the prompt,
    its graph representation, its retrieval arm and the question sample."""
    rebuilt = prompt.triples or prompt.memory != "retrieved"
    return {**part_settings(args, args.out.resolve()), "prompt": prompt.key, "graph": graph_representation(args, prompt),
            "retrieval": retrieval_arm(prompt), "units": units_text(args) if rebuilt else "as stored",
            "questions": args.step_questions, "split_seed": args.split_seed}  # fmt: skip


def units_text(args: argparse.Namespace) -> str:
    """How a rebuilt working memory's units differ from the store's: LoCoMo's session dates, its speakers' names."""
    changes = ([f"session dates of {args.session_dates.name}"] if args.session_dates else []) + (
        [f"speakers named from {args.session_dates.name}"] if args.speaker_names else [])  # fmt: skip
    return "; ".join(changes) or "as stored"


def prompt_losses(args: argparse.Namespace, prompt: Prompt, data_path: Path) -> dict[str, dict[str, float]]:
    """Whole-target and answer-span loss per test question under ``prompt`` with the frozen LLM and no graph tokens."""
    from experiments.graph_token.answering import per_question_losses
    from experiments.graph_token.training import arm_data_and_module

    variant = variants()["text" if prompt.triples else "none"]
    data, model = arm_data_and_module(args, variant, 0, data_path)
    test = question_sample(data.splits["test"], args.step_questions, args.split_seed)
    evidence = evidence_texts(args.out.resolve(), {ex.question_id for ex in test}) if prompt.slot == "evidence" else {}
    data.splits["test"] = slot_examples(prompt, test, evidence)
    model.load_backbone("cpu")
    losses, _ = per_question_losses(model, data)
    return losses


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Data (the study's, reused when there), the four prompts' losses (each saved as it ends), the report."""
    started = time.perf_counter()
    oracle_only = all(key in args.prompts for key in ORACLE_PROMPTS) and not any(key in args.prompts for key in REQUIRED_PROMPTS[1:])
    if not oracle_only and (missing := [key for key in REQUIRED_PROMPTS if key not in args.prompts]):
        raise InputError("--prompts", f"must include {', '.join(missing)} (the step's test and its context reading), or be {' '.join(ORACLE_PROMPTS)} (its test under oracle retrieval)")
    if args.speaker_names and not args.session_dates:
        raise InputError("--speaker-names", "needs LoCoMo's own file: pass it as --session-dates LOCOMO_JSON")
    folder, summary, prepared_path = step_folder(args, step_name(args))
    data_path = rebuilt_data(args, folder, prepared_path)
    from qgmem_train.trajectory import read_trajectory_dataset

    every = list(read_trajectory_dataset(data_path)["test"])
    test = question_sample(every, args.step_questions, args.split_seed)
    prepared = list(read_trajectory_dataset(prepared_path)["test"])
    losses: dict[str, dict[str, dict[str, float]]] = {}
    timings: dict[str, float] = {}
    reused: list[str] = []
    llm = llm_instrument(args.llm)
    for prompt in (p for p in PROMPTS if p.key in args.prompts):
        log.info("[%s] %s: the frozen LLM over %d test questions", prompt.key, prompt.name, len(test))
        reused_losses(args, prompt, folder, test)
        path = rebuilt_data(args, folder, prepared_path, prompt.memory) if prompt.memory != "retrieved" else data_path
        record = saved_or_computed(folder / f"losses-{prompt.key}.json", prompt.key, lambda: {"losses": prompt_losses(args, prompt, path)},
                                   prompt_settings(args, prompt))  # fmt: skip
        losses[prompt.key], timings[prompt.key] = record["losses"], record["wall_s"]
        reused += [prompt.key] if "reused_from" in record else []
    answer_loss = {key: {q: v["answer_loss"] for q, v in per_q.items()} for key, per_q in losses.items()}
    around = any(p.memory == "evidence" and p.key in args.prompts for p in PROMPTS)
    evidence_graphs = list(read_trajectory_dataset(rebuilt_data(args, folder, prepared_path, "evidence"))["test"]) if around else []
    sampled = question_sample(evidence_graphs, args.step_questions, args.split_seed)
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
    oracle = oracle_verdict(comparisons)
    verdict, note = step_verdict(comparisons) if not oracle_only else (f"under oracle retrieval only, the graph {oracle[1]}", None)
    found = {(c["control"], c["treatment"]): c for c in comparisons}
    return {
        "step": 0,
        "question": "does the local graph hold the answer?",
        "passed": oracle[0] if oracle_only else verdict.startswith("passes"),
        "verdict": verdict,
        "verdict_note": note,
        "oracle_passed": oracle[0] if oracle else None,
        "oracle_verdict": oracle[1] if oracle else None,
        "context_helps": helps(found[REQUIRED_COMPARISONS[1]]) if REQUIRED_COMPARISONS[1] in found else None,
        "evidence_helps": helps(found[("question", "evidence")]) if ("question", "evidence") in found else None,
        "harness_ok": harness_works(found[("question", "answer")]) if ("question", "answer") in found else None,
        "by_coverage": by_coverage(test, answer_loss, args.bootstrap_resamples, args.bootstrap_seed),
        "test_questions": len(test),
        "test_questions_total": len(every),
        "split": summary["split"],
        "coverage": coverage(test),
        "coverage_all": coverage(every),
        "coverage_prepared_graph": None if data_path == prepared_path else {
            "sample": coverage(question_sample(prepared, args.step_questions, args.split_seed))["graph"], "all": coverage(prepared)["graph"]},
        "coverage_evidence_graph": {"sample": coverage(sampled)["graph"], "all": coverage(evidence_graphs)["graph"],
                                    "sample_without_edges": sum(not ex.graph.num_edges for ex in sampled)} if around else None,
        "missing_words": missing_words(every),
        "missing_words_prepared_graph": None if data_path == prepared_path else missing_words(prepared),
        "evidence_recall": evidence_recall(args.out.resolve(), {ex.question_id for ex in every}, categories),
        "graphs": ("as prepared" if data_path == prepared_path else
                   f"rebuilt from the data prep's store{' with the session dates of ' + args.session_dates.name if args.session_dates else ''}, "
                   f"time edges {'on' if args.time_edges else 'off'}, speakers {'named from it' if args.speaker_names else 'as stored'}, "
                   f"object {args.graph_object}, attribute edges {'off' if not args.attribute_edges else 'capped at ' + str(args.attribute_cap) if args.attribute_cap else 'on'}; "
                   "the retrieved memory context as prepared"),
        "answer_loss": mean,
        "comparisons": comparisons,
        "prompts": {p.key: p.name for p in PROMPTS},
        "reused": reused,
        "not_run": [p.key for p in PROMPTS if p.key not in args.prompts],
        "wall_s": {"prompts": timings, "total": round(time.perf_counter() - started, 1)},
        "llm": llm, "max_context_tokens": args.max_context_tokens,
        "machine": machine_info(), "git": git_state(),
    }  # fmt: skip


def coverage_lines(result: dict[str, Any]) -> list[str]:
    """The coverage table (the loss pass's questions and every test question), why words are missing, evidence recall."""
    n, total = result["test_questions"], result["test_questions_total"]
    rows = [("graph", result["coverage"]["graph"], result["coverage_all"]["graph"])]
    if result.get("coverage_prepared_graph"):
        rows = [("graph, rebuilt", *rows[0][1:]), ("graph as prepared", result["coverage_prepared_graph"]["sample"], result["coverage_prepared_graph"]["all"])]
    if around := result.get("coverage_evidence_graph"):
        rows.append(("graph built from the evidence turns' units", around["sample"], around["all"]))
    rows.append(("context", result["coverage"]["context"], result["coverage_all"]["context"]))
    missing, recall, before = result["missing_words"], result["evidence_recall"], result.get("missing_words_prepared_graph")
    return [
        f"Graphs: {result.get('graphs', 'as prepared')}.", "",
        f"| where | all of an answer's words appear ({n} q) | mean share of its words ({n} q) | all words ({total} q) | mean share ({total} q) |",
        "|---|---|---|---|---|",
        *(f"| {where} | {a['all_words']:.3f} | {a['mean_word_share']:.3f} | {b['all_words']:.3f} | {b['mean_word_share']:.3f} |" for where, a, b in rows), "",
        *([f"No unit cites the evidence of {around['sample_without_edges']} of the {n} questions: their graph built from it has no edge.", ""]
          if around and around["sample_without_edges"] else []),
        f"Why answer words are missing from the graph, on all {total} test questions (a word counted once an answer):", "",
        "| kind of word | in answers | missing from the graph | of those, in the context |"
        + (" missing from the graph as prepared | of those, in the context |" if before else ""), "|---|---|---|---|" + ("---|---|" if before else ""),
        *(f"| {kind} | {m['answer_words']} | {m['missing_from_graph']} | {m['of_which_in_context']} |"
          + (f" {before[kind]['missing_from_graph']} | {before[kind]['of_which_in_context']} |" if before else "") for kind, m in missing.items()), "",
        f"The working memory holds an evidence turn of the question for {recall['share']:.3f} of the {recall['questions']} test questions "
        "(a word the context lacks is not in the working memory at all: retrieval, not the graph, lost it)"
        + (": " + ", ".join(f"{k} {v['share']:.3f} ({v['questions']} q)" for k, v in recall["per_category"].items()) if recall.get("per_category") else "")
        + ".", "",
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


def by_coverage_lines(result: dict[str, Any]) -> list[str]:
    """The step's test and the context's reading split by whether the graph (the context) covers the answer."""
    rows = result.get("by_coverage") or []
    cell = lambda r: f"{r['mean_difference']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]" if r["questions"] else "—"  # noqa: E731
    return [
        f"The same differences split by coverage: questions whose local graph (for question − triples) or memory context (for "
        f"question − context) holds at least {COVERED_SHARE:.0%} of the answer's words, and the rest:", "",
        "| control − treatment | split by | covered: questions | covered: difference [95%] | rest: questions | rest: difference [95%] |",
        "|---|---|---|---|---|---|",
        *(f"| {a['control']} − {a['treatment']} | {a['where']} | {a['questions']} | {cell(a)} | {b['questions']} | {cell(b)} |"
          for a, b in zip(rows[::2], rows[1::2])), "",
    ] if rows else []  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    """The step's report: the verdict, coverage, mean losses and the paired differences with their intervals."""
    lines = [
        "# Graph-token study, step 0: does the local graph hold the answer?", "",
        f"**{result['verdict']}.** {result['test_questions']} of the {result['test_questions_total']} test questions of {', '.join(result['split']['test'])} "
        f"(conversations the study never trains on), frozen {result['llm']}, no graph tokens, context cut to "
        f"{result['max_context_tokens']} tokens.", "",
        *([f"**Under oracle retrieval the graph {result['oracle_verdict']}.** Retrieval cost and representation cost below: the retrieved "
           "context against the oracle's (what retrieval loses) and the oracle's triples against its context (what the graph drops).", ""]
          if result.get("oracle_verdict") else []),
        *coverage_lines(result),
        "| prompt | answer-span loss (nats a token) | wall time (s) |", "|---|---|---|",
        *(f"| {result['prompts'][k]} | {v:.3f} | {result['wall_s']['prompts'][k]:.0f}{' (reused)' if k in result.get('reused', []) else ''} |"
          for k, v in result["answer_loss"].items()), "",
        "Loss of the control minus loss of the treatment (above 0: the treatment makes the answer likelier), paired bootstrap 95% interval over questions:", "",
        "| control | treatment | measures | difference | 95% interval |", "|---|---|---|---|---|",
        *(f"| {c['control']} | {c['treatment']} | {c['measures']} | {c['mean_difference']:+.3f} | [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] |"
          for c in result["comparisons"]), "",
        *category_lines(result),
        *by_coverage_lines(result),
        *([result["verdict_note"], ""] if result.get("verdict_note") else []),
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
    p.add_argument("--speaker-names", action="store_true",
                   help="rebuild the test graphs (and the oracle context) with the speakers' names of --session-dates' LoCoMo file (ConvoMem says User, Assistant)")
    p.add_argument("--graph-object", choices=("gist", "fact", "turn"), default="gist", help="graph.object of the rebuilt graphs")
    p.add_argument("--object-words", type=int, default=60, help="graph.object_words of the rebuilt graphs")
    p.add_argument("--attribute-cap", type=int, default=0, help="graph.attribute_cap of the rebuilt graphs (0: all)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run step 0 over ``--out`` (the study's output folder)."""
    args = parser().parse_args(argv)
    return run_step(args, step_name(args), run, markdown, ("step_questions", "eval_batch_size"))


if __name__ == "__main__":
    sys.exit(main())
