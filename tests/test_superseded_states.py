"""Superseded states: a trace's older members give way to its current one in the pool, the rerank document and MEMORY_CONTEXT."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from qgmem_train.answer.memory_context import serialize_working_memory
from qgmem_train.config import RetrievalConfig
from qgmem_train.memory.store import AttributeIndex, NamespaceMemory
from qgmem_train.memory.types import MemoryUnit, Trace, Turn
from qgmem_train.retrieval.activation import ActivationIndex, activate
from qgmem_train.retrieval.rerank import rerank_document

FACTS = [
    ("boston", "D1:1", "2023-01-10", "Alex", "lives in", "Boston", "Alex lives in Boston."),
    ("violin", "D1:2", "2023-01-10", "Maria", "plays", "the violin", "Maria plays the violin in an orchestra."),
    ("denver", "D2:1", "2023-06-10", "Alex", "lives in", "Denver", "Alex moved and now lives in Denver."),
]


def make_memory(embedder) -> NamespaceMemory:
    """Alex moved from Boston to Denver (one trace, Denver current), and an unrelated fact about Maria."""
    units = [
        MemoryUnit(id=uid, session_id=f"session_{tid[1]}", fact_text=text, subject=subject, predicate=predicate, object=obj,
                   source_turn_ids=[tid], source_text=f"{subject}: {text}", utterance_time=day, serial=row)
        for row, (uid, tid, day, subject, predicate, obj, text) in enumerate(FACTS)
    ]
    trace = Trace(id="trace:boston", relation_text="Alex lives in", member_ids=["boston", "denver"],
                  trajectory="Alex lived in Boston, then moved to Denver.", current_id="denver")
    dim = embedder.encode(["x"]).shape[1]
    return NamespaceMemory(
        namespace="alex", units=units, fact_embeddings=embedder.encode([u.fact_text for u in units]),
        attributes=AttributeIndex(np.zeros(0, np.int64), np.zeros(0, np.int8), [], np.zeros((0, dim), np.float32)),
        traces=[trace], trace_of={"boston": trace.id, "denver": trace.id},
        turns={u.source_turn_ids[0]: Turn(u.source_turn_ids[0], u.subject, u.fact_text) for u in units},
        turn_time={u.source_turn_ids[0]: u.utterance_time for u in units}, embedder_id=embedder.model_id,
    )


@pytest.fixture(scope="module")
def memory(minilm) -> NamespaceMemory:
    return make_memory(minilm)


class RecordingReranker:
    """Keeps the documents it is asked to score; scores them in the given order."""

    name = "recording"
    model_id = "recording"

    def __init__(self) -> None:
        self.documents: list[str] = []

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        self.documents += documents
        return np.linspace(1.0, 0.0, len(documents), dtype=np.float32)


def _activate(memory, embedder, question: str, reranker=None, **settings):
    cfg = RetrievalConfig(n=10, k=3, **settings)
    return activate(question, "2023-07-01", memory, cfg=cfg, llm=None, embedder=embedder, reranker=reranker)


def test_superseded_unit_leaves_the_pool_when_its_current_state_is_there(memory, minilm) -> None:
    kept = _activate(memory, minilm, "Where does Alex live?", drop_superseded=False)
    assert {"boston", "denver"} <= set(kept.fused)
    dropped = _activate(memory, minilm, "Where does Alex live?")
    assert "denver" in dropped.fused and "boston" not in dropped.fused
    assert "boston" not in [u.id for u in dropped.units] and "boston" not in dropped.reranked
    assert [uid for uid in kept.fused if uid != "boston"] == dropped.fused


def test_superseded_unit_stays_when_its_current_state_is_not_in_the_pool(memory, minilm) -> None:
    wm = _activate(memory, minilm, "Who was in Boston?", channels=["bm25"])
    assert wm.fused == ["boston"]


def test_rerank_document_marks_a_superseded_unit_and_names_its_current_state(memory, minilm) -> None:
    units = {u.id: u for u in memory.units}
    boston = rerank_document(units["boston"], "Alex lived in Boston, then moved to Denver.", current=units["denver"])
    assert "State: superseded by denver: Alex moved and now lives in Denver." in boston.splitlines()
    assert "State: current" in rerank_document(units["denver"], "...", current=units["denver"]).splitlines()
    assert "State" not in rerank_document(units["violin"])

    reranker = RecordingReranker()
    _activate(memory, minilm, "Where does Alex live?", reranker=reranker, drop_superseded=False)
    by_fact = {next(line for line in d.splitlines() if line.startswith("Fact: ")): d for d in reranker.documents}
    assert "State: superseded by denver: Alex moved and now lives in Denver." in by_fact["Fact: Alex lives in Boston."]
    assert "State: current" in by_fact["Fact: Alex moved and now lives in Denver."]
    assert "State" not in by_fact["Fact: Maria plays the violin in an orchestra."]
    index = ActivationIndex(memory, RetrievalConfig(), minilm)
    assert index.current_of(units["boston"]) is units["denver"] and index.current_of(units["violin"]) is None


def test_memory_context_marks_which_state_is_current(memory) -> None:
    units = {u.id: u for u in memory.units}
    context = serialize_working_memory([units["denver"], units["violin"], units["boston"]], memory)
    lines = context.text.splitlines()
    assert lines[1:3] == ["Cluster 1 (relation: Alex lives in)", "trajectory: Alex lived in Boston, then moved to Denver."]
    assert lines[3].startswith("[MU1] (utterance_time: 2023-01-10") and lines[3].endswith("Alex lives in Boston. [state: superseded by MU2]")
    assert lines[4].startswith("[MU2] (utterance_time: 2023-06-10") and lines[4].endswith("now lives in Denver. [state: current]")
    assert lines[6].startswith("[F1] Maria | plays") and "state" not in lines[6]
    alone = serialize_working_memory([units["boston"]], memory).text.splitlines()
    assert alone[3].endswith("Alex lives in Boston. [state: superseded]")
