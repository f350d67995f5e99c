"""Answer quality of a benchmark: answer its questions on the text or the graph path, judge them R times, summarise.

Each benchmark and question type has the paper's judge prompt: LoCoMo and FactConsolidation use the LoCoMo
judge; LongMemEval picks its temporal, knowledge-update, preference or abstention prompt by question type; BEAM
scores rubric nuggets and event ordering (:mod:`qgmem_train.eval.beam_scoring`) and macro-averages its ten abilities. Each repeat gives one
accuracy over all questions; the report is their mean and (population) std, as in the paper.

Beside the judge, every answer gets the deterministic metrics LoCoMo and Mem0 report (token F1, BLEU-1,
exact match against the reference, :func:`qgmem_train.metrics.answers.answer_scores`), per question, per
type and overall. A question without an answer (its output was dropped) scores 0 on all three, as in
LoCoMo, and stays in every mean.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from qgmem_train.benchmarks.loaders import BenchmarkQuestion, group_by_conversation
from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.eval.beam_scoring import EVENT_ORDERING, event_ordering_score, nugget_scores
from qgmem_train.eval.judge import JudgeItem, judge
from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.prompts import (
    LONGMEMEVAL_ABSTENTION_JUDGE,
    LONGMEMEVAL_JUDGE,
    LONGMEMEVAL_KNOWLEDGE_UPDATE_JUDGE,
    LONGMEMEVAL_PREFERENCE_JUDGE,
    LONGMEMEVAL_TEMPORAL_JUDGE,
    PromptTemplate,
)
from qgmem_train.llm.structured import ParseStats
from qgmem_train.metrics.answers import answer_scores

YES_NO_MAX_NEW_TOKENS = 8
ANSWER_METRICS = ("f1", "bleu1", "exact_match")
_YES_NO = re.compile(r"\b(yes|no)\b", re.I)
LONGMEMEVAL_PROMPTS: dict[str, PromptTemplate] = {
    "temporal-reasoning": LONGMEMEVAL_TEMPORAL_JUDGE,
    "knowledge-update": LONGMEMEVAL_KNOWLEDGE_UPDATE_JUDGE,
    "single-session-preference": LONGMEMEVAL_PREFERENCE_JUDGE,
    "abstention": LONGMEMEVAL_ABSTENTION_JUDGE,
}


@dataclass
class AnswerVariant:
    """What an evaluation run changes in the pipeline (the ablations vary these over the same questions)."""

    name: str = "full"
    reranker: str | None = None
    """Reranker kind (llm, cross, none); None: ``models.reranker``."""
    channels: list[str] | None = None
    """Retrieval channels; None: ``retrieval.channels``."""
    traces: bool = True
    """Serialize evidence clusters with their trajectories; False: every unit as a plain fact."""
    store: str | Path | None = None
    """Store to read; None: the run's ``--store``."""
    model: Path | None = None
    """Exported model folder (graph-token path); None: the configured LLM on the text path."""


@dataclass
class AnsweredQuestion:
    """One question's answer, its working memory and its online cost."""

    question: BenchmarkQuestion
    prediction: str
    reasoning_path: str
    working_memory: list[str]
    context_tokens: int
    online_tokens: int
    seconds: float
    path: str = "text"
    scores: list[float] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def text_scores(a: AnsweredQuestion) -> dict[str, float]:
    """Token F1, BLEU-1 and exact match of an answer against its reference; all 0 when no answer was produced."""
    if not a.prediction.strip():
        return dict.fromkeys(ANSWER_METRICS, 0.0)
    return answer_scores(a.prediction, a.question.reference)


def parse_yes_no(text: str) -> bool | None:
    """The first yes/no word of a judge reply (True for yes), None when it has neither."""
    match = _YES_NO.search(text)
    return None if match is None else match[1].lower() == "yes"


def longmemeval_prompt(qtype: str) -> PromptTemplate:
    """The LongMemEval judge prompt of a question type (the generic one for the other types)."""
    return LONGMEMEVAL_PROMPTS.get(qtype, LONGMEMEVAL_JUDGE)


def judge_yes_no(
    llm: ChatLLM, items: Sequence[tuple[PromptTemplate, JudgeItem]], *, repeats: int, stats: ParseStats | None = None
) -> list[tuple[list[float], list[str]]]:
    """Judge with yes/no prompts ``repeats`` times; a reply with neither word counts as no (and as dropped in ``stats``)."""
    chats = [t.render(question=i.question, answer=i.reference, response=i.prediction) for t, i in items]
    results: list[tuple[list[float], list[str]]] = [([], []) for _ in items]
    for _ in range(repeats):
        replies = llm.generate(chats, max_new_tokens=YES_NO_MAX_NEW_TOKENS)
        for (scores, reasons), reply in zip(results, replies):
            verdict = parse_yes_no(reply)
            if stats is not None:
                stats.requested += 1
                stats.valid += verdict is not None
                stats.dropped += verdict is None
            scores.append(1.0 if verdict else 0.0)
            reasons.append(reply.strip()[:200])
    return results


def judge_answers(
    benchmark: str, llm: ChatLLM, answered: Sequence[AnsweredQuestion], *, repeats: int, stats: ParseStats | None = None
) -> None:
    """Fill ``scores`` (one per repeat, in [0, 1]) and ``reasons`` of every answered question.

    A question without an answer (the answering output was dropped) scores 0 without a judge call.
    """
    if repeats < 1:
        raise InputError("--repeats", "must be at least 1")
    for a in answered:
        if not a.prediction.strip():
            a.scores, a.reasons = [0.0] * repeats, ["no answer (answering output dropped)"]
    answered = [a for a in answered if a.prediction.strip()]
    if not answered:
        return
    if benchmark == "longmemeval":
        items = [(longmemeval_prompt(a.question.qtype), JudgeItem(a.question.question, a.question.reference, a.prediction)) for a in answered]
        for a, (scores, reasons) in zip(answered, judge_yes_no(llm, items, repeats=repeats, stats=stats)):
            a.scores, a.reasons = scores, reasons
    elif benchmark == "beam":
        for a in tqdm(answered, desc="judge nuggets", unit="q", leave=False):
            if a.question.qtype == EVENT_ORDERING:
                a.scores = [event_ordering_score(a.question.nuggets, a.prediction)] * repeats
                a.reasons = ["Kendall tau_b of the reference items' order in the answer"]
            else:
                a.scores, a.reasons = nugget_scores(llm, a.question.question, a.question.nuggets, a.prediction, repeats=repeats, stats=stats)
    else:
        verdicts = judge(llm, [JudgeItem(a.question.question, a.question.reference, a.prediction) for a in answered], repeats=repeats, stats=stats)
        for a, verdict in zip(answered, verdicts):
            a.scores = [float(j) for j in verdict.judgments]
            a.reasons = verdict.reasons


def score_summary(benchmark: str, answered: Sequence[AnsweredQuestion]) -> dict[str, Any]:
    """judge_accuracy / judge_std over repeats (BEAM: macro over abilities), and the mean score per question type.

    Also ``f1``, ``bleu1``, ``exact_match`` (means over every question, a missing answer counting 0) and the
    same per type as ``<metric>/<type>``, beside ``judge_accuracy/<type>``.
    """
    if not answered:
        return {"judge_accuracy": 0.0, "judge_std": 0.0, "n_questions": 0, **dict.fromkeys(ANSWER_METRICS, 0.0)}
    repeats = len(answered[0].scores)
    by_type: dict[str, list[AnsweredQuestion]] = {}
    for a in answered:
        by_type.setdefault(a.question.qtype, []).append(a)

    def mean_at(group: Sequence[AnsweredQuestion], r: int) -> float:
        return statistics.fmean(a.scores[r] for a in group)

    if benchmark == "beam":
        per_repeat = [statistics.fmean(mean_at(g, r) for g in by_type.values()) for r in range(repeats)]
    else:
        per_repeat = [mean_at(answered, r) for r in range(repeats)]
    out: dict[str, Any] = {
        "judge_accuracy": round(statistics.fmean(per_repeat), 4),
        "judge_std": round(statistics.pstdev(per_repeat), 4),
        "n_questions": len(answered),
        "repeats": repeats,
        "judge_accuracy_per_repeat": [round(v, 4) for v in per_repeat],
    }
    text = {id(a): text_scores(a) for a in answered}
    for key in ANSWER_METRICS:
        out[key] = round(statistics.fmean(text[id(a)][key] for a in answered), 4)
    for qtype, group in sorted(by_type.items()):
        out[f"judge_accuracy/{qtype}"] = round(statistics.fmean(statistics.fmean(a.scores) for a in group), 4)
        for key in ANSWER_METRICS:
            out[f"{key}/{qtype}"] = round(statistics.fmean(text[id(a)][key] for a in group), 4)
        out[f"n_questions/{qtype}"] = len(group)
    if benchmark == "beam":
        nugget = [out[f"judge_accuracy/{t}"] for t in by_type if t != EVENT_ORDERING]
        out["beam_nugget_score"] = round(statistics.fmean(nugget), 4) if nugget else None
        out["beam_event_ordering_tau_b"] = out.get(f"judge_accuracy/{EVENT_ORDERING}")
    for key in ("context_tokens", "online_tokens", "seconds"):
        out[f"mean_{key}"] = round(statistics.fmean(getattr(a, key) for a in answered), 4)
    return out


def without_traces(memory: Any) -> Any:
    """The namespace memory with its traces removed: every unit serializes as a plain fact."""
    return dataclasses.replace(memory, traces=[], trace_of={})


def answer_text_path(
    questions: Sequence[BenchmarkQuestion],
    store_dir: str | Path,
    cfg: PipelineConfig,
    variant: AnswerVariant,
    *,
    intent_mode: str,
    llm: ChatLLM,
    stats: ParseStats,
) -> list[AnsweredQuestion]:
    """Activate and answer every question with the configured LLM on the text path (:mod:`qgmem_train.answer.text_path`).

    Per question: context tokens of MEMORY_CONTEXT; online tokens = intent and answer prompts plus their
    (re-serialized) outputs; seconds = its activation plus its share of the batched intent and answer calls.
    """
    from qgmem_train.answer.evidence import answer_evidence
    from qgmem_train.graph.local_graph import graph_options
    from qgmem_train.answer.text_path import answer_chats, chat_tokens, frozen_answer_chat
    from qgmem_train.llm.factory import build_embedder
    from qgmem_train.llm.prompts import QUERY_INTENT
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.retrieval.activation import ActivationIndex, activate, encode_queries
    from qgmem_train.retrieval.intent import INTENT_MAX_NEW_TOKENS, parse_intent_rules, parse_intents
    from qgmem_train.retrieval.rerank import build_reranker

    retrieval = dataclasses.replace(cfg.retrieval, channels=variant.channels or cfg.retrieval.channels)
    kind = variant.reranker or cfg.models.reranker
    embedder = build_embedder(cfg)
    reranker = build_reranker(cfg, kind, llm=llm if kind == "llm" and not cfg.models.reranker_model else None)
    by_conversation = group_by_conversation(questions)
    answered: list[AnsweredQuestion] = []
    progress = tqdm(total=len(questions), desc=f"answer ({variant.name})", unit="q")
    with MemoryStore.open(store_dir) as store:
        store.require_namespaces(by_conversation)
        for cid, items in by_conversation.items():
            memory = store.load_namespace(cid, embedder_id=embedder.model_id, sentences=retrieval.sentence_vectors)
            if not variant.traces:
                memory = without_traces(memory)
            index = ActivationIndex(memory, retrieval, embedder)
            pairs = [(q.question, q.question_time) for q in items]
            started = time.perf_counter()
            if intent_mode == "llm":
                budget = min(INTENT_MAX_NEW_TOKENS, cfg.generation.max_new_tokens)
                intents = parse_intents(pairs, llm, max_new_tokens=budget, stats=stats)
                intent_tokens = [chat_tokens(llm, QUERY_INTENT.render(query=q, question_time=t or "unknown"))
                                 + llm.count_tokens(json.dumps(i.as_dict())) for (q, t), i in zip(pairs, intents)]
            else:
                intents = [parse_intent_rules(*p) for p in pairs]
                intent_tokens = [0] * len(items)
            intent_share = (time.perf_counter() - started) / len(items)
            vectors = encode_queries(embedder, [q.question for q in items], intents)
            evidence, chats, units, seconds = [], [], [], []
            for q, intent, query_vectors in zip(items, intents, vectors):
                started = time.perf_counter()
                wm = activate(q.question, q.question_time, memory, cfg=retrieval, llm=llm, embedder=embedder, reranker=reranker,
                              index=index, intent=intent, query_vectors=query_vectors)
                evidence.append(answer_evidence(wm.units, memory, llm, max_edges=retrieval.k, **graph_options(cfg.graph)))
                chats.append(frozen_answer_chat(q.question, q.question_time, evidence[-1]))
                units.append([u.id for u in wm.units])
                seconds.append(time.perf_counter() - started + intent_share)
            outputs = []
            batch_size = max(1, cfg.generation.batch_size)
            for start in range(0, len(items), batch_size):
                batch = chats[start : start + batch_size]
                began = time.perf_counter()
                outputs += answer_chats(llm, batch, max_new_tokens=cfg.generation.max_new_tokens, stats=stats)
                share = (time.perf_counter() - began) / len(batch)
                for i in range(start, start + len(batch)):
                    seconds[i] += share
            for i, (q, output) in enumerate(zip(items, outputs)):
                generated = llm.count_tokens(output.model_dump_json()) if output is not None else 0
                answered.append(AnsweredQuestion(
                    q, output.answer if output else "", output.reasoning_path if output else "", units[i], evidence[i].context.n_tokens,
                    intent_tokens[i] + chat_tokens(llm, chats[i]) + generated, round(seconds[i], 4),
                ))  # fmt: skip
                progress.update()
    progress.close()
    return answered


def answer_model_path(questions: Sequence[BenchmarkQuestion], store_dir: str | Path, variant: AnswerVariant, *, intent_mode: str) -> list[AnsweredQuestion]:
    """Answer through an exported model (``qgmem_train.predictor``): graph-token path, its own token and time accounting.

    The variant's reranker, when set, replaces the exported pipeline's.
    """
    from qgmem_train.predictor import QGMemPredictor

    predictor = QGMemPredictor.from_pretrained(variant.model, intent=intent_mode, models={"reranker": variant.reranker} if variant.reranker else None)
    answered = []
    by_conversation = group_by_conversation(questions)
    progress = tqdm(total=len(questions), desc=f"answer ({variant.name})", unit="q")
    for cid, items in by_conversation.items():
        with predictor.memory(cid, store_dir) as memory:
            for q in items:
                result = memory.ask(q.question, q.question_time)
                answered.append(AnsweredQuestion(
                    q, result.answer or "", result.reasoning_path or "", [u.id for u in result.units], result.tokens.get("context", 0),
                    result.tokens.get("prompt", 0) + result.tokens.get("generated", 0), round(result.seconds.get("total", 0.0), 4), result.path,
                ))  # fmt: skip
                progress.update()
    progress.close()
    return answered


def question_record(a: AnsweredQuestion) -> dict[str, Any]:
    """One line of the per-question JSONL."""
    q = a.question
    return {
        "id": q.id, "conversation": q.conversation_id, "type": q.qtype, "question": q.question, "question_time": q.question_time,
        "reference": q.reference, "prediction": a.prediction, "reasoning_path": a.reasoning_path, "path": a.path,
        "scores": a.scores, "score": statistics.fmean(a.scores) if a.scores else None, "judge_reasons": a.reasons,
        **text_scores(a),
        "working_memory": a.working_memory, "evidence": q.evidence,
        "context_tokens": a.context_tokens, "online_tokens": a.online_tokens, "seconds": a.seconds,
    }  # fmt: skip
