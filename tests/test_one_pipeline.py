"""One walk of a question (:mod:`qgmem_train.pipeline`), four callers: the predictor, ``eval``, ``serve`` and data prep
give the same questions the same working memory and the same answer. The real SmolLM2 answers and MiniLM embeds; one
question per namespace, so that no caller batches another question beside it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from data_prep.config import load_data_prep_config
from data_prep.convomem import case_namespace, discover_cases, load_case
from data_prep.pipeline import run_case
from qgmem_train.benchmarks.loaders import BenchmarkQuestion
from qgmem_train.eval.answer_quality import AnswerVariant, answer_text_path
from qgmem_train.llm.structured import ParseStats
from qgmem_train.memory.store import MemoryStore
from qgmem_train.pipeline import PipelineModels
from qgmem_train.predictor import QGMemPredictor
from qgmem_train.serve.service import MemoryService
from tests.test_data_prep_run import make_config

pytestmark = pytest.mark.slow
CATEGORIES = ("category_2_temporal", "category_4_multi_session")


def test_predictor_eval_serve_and_data_prep_give_the_same_working_memory_and_answer(tmp_path: Path, smollm2, minilm) -> None:
    cfg, pipeline = load_data_prep_config(make_config(tmp_path, "same"))
    cfg.target = "judge_correct"
    pipeline.generation.max_new_tokens = 48
    models = PipelineModels.built(pipeline, llm=smollm2, embedder=minilm, reranker=None, intent=cfg.intent)
    root = Path(cfg.source)
    refs = discover_cases(root, list(CATEGORIES))
    cases = [load_case(root, refs[category][0], max_questions=1, max_sessions=1) for category in CATEGORIES]
    store_path = tmp_path / "store"
    with MemoryStore.open(store_path, create=True) as store:
        records = [run_case(case, store, models, cfg, pipeline) for case in cases]
    asked = [(case_namespace(case.ref.case_id), case.questions[0]) for case in cases]

    through: dict[str, list[tuple[list[str], str | None]]] = {}
    through["data prep"] = [([u["id"] for u in r["questions"][0]["units"]], r["questions"][0]["answer"]) for r in records]

    predictor = QGMemPredictor(None, models)
    through["predictor"] = []
    for namespace, q in asked:
        with predictor.memory(namespace, store_path) as memory:
            result = memory.ask(q.question)
        through["predictor"].append(([u.id for u in result.units], result.answer))

    questions = [BenchmarkQuestion(f"q{i}", namespace, q.question, "convomem", q.answer, None) for i, (namespace, q) in enumerate(asked)]
    answered = answer_text_path(questions, store_path, pipeline, AnswerVariant(), intent_mode=cfg.intent, llm=smollm2, stats=ParseStats())
    through["eval"] = [(a.working_memory, a.prediction or None) for a in answered]

    service = MemoryService(predictor, store_path)
    try:
        served = [asyncio.run(service.ask(namespace, q.question, None)) for namespace, q in asked]
    finally:
        service.close()
    through["serve"] = [([u.id for u in result.units], result.answer) for result in served]

    assert all(units for units, _ in through["predictor"]) and any(answer for _, answer in through["predictor"])
    for caller, results in through.items():
        assert results == through["predictor"], caller
