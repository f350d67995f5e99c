"""One ConvoMem case through the frozen pipeline: build → activate → answer (text path) → judge.

Everything a trajectory needs is recorded per question (activated units with their source turns, the
serialized context, the local graph, the answer, verdicts, token counts), plus seconds per stage, so
that merge can pick targets without rerunning anything.

With ``target: gold`` the answer and judge stages are skipped: they decide nothing there (the target is
the gold answer with a reasoning path over the evidence units' labels). The record says so: ``stages``
lists the stages run, ``seconds`` has no answer/judge entry, and every question has ``answer`` and
``reasoning_path`` None, ``correct`` None (not judged) and no judgments.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from data_prep.config import DataPrepConfig
from data_prep.convomem import ConvoMemCase, case_namespace
from data_prep.targets import cites, gold_reasoning_path
from qgmem_train.answer.evidence import answer_evidence
from qgmem_train.graph.local_graph import graph_options
from qgmem_train.answer.text_path import answer_chats, chat_tokens, frozen_answer_chat
from qgmem_train.config import PipelineConfig
from qgmem_train.eval.judge import JudgeItem, judge
from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.embedder import Embedder
from qgmem_train.llm.schemas import AnswerOutput
from qgmem_train.llm.structured import ParseStats
from qgmem_train.memory.construct import build_conversation
from qgmem_train.memory.store import MemoryStore
from qgmem_train.retrieval.activation import ActivationIndex, activate
from qgmem_train.retrieval.rerank import Reranker

BUILD_STAGES = ("construction", "activation")
"""Stages every run goes through; the judge target adds ``answer`` and ``judge``."""


def stages_of(cfg: DataPrepConfig) -> list[str]:
    """The stages a run with ``cfg`` goes through (answer and judge only for the judge_correct target)."""
    return [*BUILD_STAGES, "answer", "judge"] if cfg.target == "judge_correct" else list(BUILD_STAGES)


@dataclass
class PipelineModels:
    """The frozen models shared by every case of a run."""

    llm: ChatLLM
    embedder: Embedder
    reranker: Reranker | None


def run_case(case: ConvoMemCase, store: MemoryStore, models: PipelineModels, cfg: DataPrepConfig, pipeline: PipelineConfig) -> dict[str, Any]:
    """Run every question of ``case`` and return its JSON-ready record (answered and judged for the judge target only)."""
    seconds: dict[str, float] = {}
    stages = stages_of(cfg)
    stats = ParseStats()
    namespace = case_namespace(case.ref.case_id)

    start = time.perf_counter()
    report = build_conversation(store, case.conversation, pipeline, models.embedder, namespace=namespace, llm=models.llm)
    memory = store.load_namespace(namespace)
    seconds["construction"] = time.perf_counter() - start

    start = time.perf_counter()
    index = ActivationIndex(memory, pipeline.retrieval, models.embedder)
    intent_llm = models.llm if cfg.intent == "llm" else None
    working = [
        activate(q.question, None, memory, cfg=pipeline.retrieval, llm=intent_llm, embedder=models.embedder, reranker=models.reranker, index=index)
        for q in case.questions
    ]
    evidence = [answer_evidence(wm.units, memory, models.llm, max_edges=pipeline.retrieval.k, **graph_options(pipeline.graph)) for wm in working]
    seconds["activation"] = time.perf_counter() - start

    chats = [frozen_answer_chat(q.question, None, e) for q, e in zip(case.questions, evidence)]
    answers: list[AnswerOutput | None] = [None] * len(chats)
    verdicts: list[Any] = [None] * len(chats)
    if "answer" in stages:
        start = time.perf_counter()
        answers = answer_chats(models.llm, chats, max_new_tokens=pipeline.generation.max_new_tokens, stats=stats)
        seconds["answer"] = time.perf_counter() - start

        start = time.perf_counter()
        judged = [i for i, a in enumerate(answers) if a is not None]
        items = [JudgeItem(case.questions[i].question, case.questions[i].answer, answers[i].answer) for i in judged]
        for i, verdict in zip(judged, judge(models.llm, items, repeats=cfg.judge_repeats, stats=stats)):
            verdicts[i] = verdict
        seconds["judge"] = time.perf_counter() - start

    questions = []
    for number, (q, wm, found, chat, ans, verdict) in enumerate(zip(case.questions, working, evidence, chats, answers, verdicts)):
        evidence_units = {u.id for u in wm.units if cites(u.source_text, q.evidence_texts)}
        questions.append(
            {
                "question_id": f"{case.ref.case_id}/q{number}",
                "question": q.question,
                "question_time": "",
                "gold_answer": q.answer,
                "evidence_texts": q.evidence_texts,
                "units": [
                    {"id": u.id, "fact_text": u.fact_text, "source_turn_ids": u.source_turn_ids, "source_text": u.source_text}
                    for u in wm.units
                ],
                "context": found.context.text,
                "context_tokens": found.context.n_tokens,
                "prompt_tokens": chat_tokens(models.llm, chat),
                "graph": dataclasses.asdict(found.graph),
                "answer": ans.answer if ans else None,
                "reasoning_path": ans.reasoning_path if ans else None,
                "gold_reasoning_path": gold_reasoning_path(found.context.labels, evidence_units),
                "judgments": verdict.judgments if verdict else [],
                "judge_reasons": verdict.reasons if verdict else [],
                "correct": bool(verdict and verdict.correct) if "judge" in stages else None,
            }
        )
    return {
        "case_id": case.ref.case_id,
        "category": case.ref.category,
        "namespace": namespace,
        "stages": stages,
        "build": {"units": report.units, "traces": report.traces, "dropped": report.dropped},
        "parse": stats.merge(ParseStats(**report.parse)).as_dict() if report.parse else stats.as_dict(),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "questions": questions,
    }
