"""Paper-pure versus ours: the paper config turns every project addition off, and each addition's switch works."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qgmem_train.config import PipelineConfig, RetrievalConfig, load_pipeline_config, read_yaml
from qgmem_train.memory.store import ENTITY, AttributeIndex, NamespaceMemory
from qgmem_train.memory.types import MemoryUnit, TimeSpan, Turn
from qgmem_train.retrieval.activation import activate
from qgmem_train.retrieval.intent import QueryIntent

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ADDITIONS = {
    ("construction", "sentence_vectors"): False,
    ("construction", "max_trace_size"): None,
    ("retrieval", "sentence_vectors"): False,
    ("retrieval", "lexical_context_turns"): 0,
    ("retrieval", "subject_entities"): False,
    ("retrieval", "attr_tiebreak"): False,
    ("retrieval", "utterance_day_fallback"): False,
}
"""Each project addition and its paper (off) value."""


def _value(cfg: PipelineConfig, group: str, name: str):
    return getattr(getattr(cfg, group), name)


def test_paper_config_turns_every_addition_off() -> None:
    paper = load_pipeline_config(CONFIGS / "qwen3-8b.yaml")
    assert {key: _value(paper, *key) for key in ADDITIONS} == ADDITIONS
    assert paper.retrieval.rerank_mode == "replace" and paper.retrieval.approximate is False
    assert paper.retrieval.channels == ["bm25", "dense", "attr"]  # no graph channel (not in the paper)


def test_our_defaults_keep_every_addition_on() -> None:
    assert all(_value(PipelineConfig(), *key) != off for key, off in ADDITIONS.items())


def test_plus_config_is_the_paper_config_with_only_additions_changed() -> None:
    paper, plus = load_pipeline_config(CONFIGS / "qwen3-8b.yaml"), load_pipeline_config(CONFIGS / "qwen3-8b-plus.yaml")
    changed = {
        (group, name)
        for group in ("models", "construction", "retrieval", "generation")
        for name in (f.name for f in dataclasses.fields(getattr(paper, group)))
        if _value(paper, group, name) != _value(plus, group, name)
    }
    assert changed and changed <= set(ADDITIONS)
    paper_raw, plus_raw = read_yaml(CONFIGS / "qwen3-8b.yaml"), read_yaml(CONFIGS / "qwen3-8b-plus.yaml")
    assert paper_raw["model"] == plus_raw["model"] and paper_raw["data"] == plus_raw["data"]
    assert plus_raw["trainer"]["default_root_dir"] != paper_raw["trainer"]["default_root_dir"]
    assert plus_raw["checkpoint"]["dirpath"].startswith(plus_raw["trainer"]["default_root_dir"])


class OneHotEmbedder:
    """Each distinct text its own unit vector (texts met first get the first axes): equal texts match, others are orthogonal."""

    model_id = "one-hot"

    def __init__(self, dim: int = 32) -> None:
        self.dim = dim
        self.axis: dict[str, int] = {}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            vectors[row, self.axis.setdefault(text, len(self.axis))] = 1.0
        return vectors


def make_memory(units: list[MemoryUnit], fact_embeddings: np.ndarray, embedder: OneHotEmbedder, **extra) -> NamespaceMemory:
    """A namespace of ``units`` whose entities are embedded with ``embedder``; no traces."""
    rows = [(row, entity) for row, unit in enumerate(units) for entity in unit.entities]
    texts = [entity for _, entity in rows]
    return NamespaceMemory(
        namespace="switches", units=units, fact_embeddings=np.asarray(fact_embeddings, np.float32),
        attributes=AttributeIndex(np.array([r for r, _ in rows], np.int64), np.full(len(rows), ENTITY, np.int8), texts,
                                  embedder.encode(texts).reshape(len(rows), embedder.dim)),
        traces=[], trace_of={}, turns={t: Turn(t, u.subject, u.fact_text) for u in units for t in u.source_turn_ids},
        turn_time={t: u.utterance_time for u in units for t in u.source_turn_ids}, embedder_id=embedder.model_id, **extra,
    )


def unit(row: int, text: str, *, subject: str = "Alex", entities: Sequence[str] = (), day: str | None = "2023-06-10",
         fact_day: str | None = None) -> MemoryUnit:
    return MemoryUnit(id=f"u{row}", session_id="s1", fact_text=text, subject=subject, predicate="said", object="it",
                      source_turn_ids=[f"D1:{row}"], source_text=text, utterance_time=day, serial=row,
                      fact_time=[TimeSpan(fact_day, fact_day)] if fact_day else [], entities=list(entities))


def ranked(memory: NamespaceMemory, embedder: OneHotEmbedder, channel: str, intent: QueryIntent, query_vector: np.ndarray,
           question: str = "question", **settings) -> list[str]:
    """Unit ids of one channel's ranking, with a given intent and query vectors (question, then entities)."""
    vectors = np.vstack([query_vector, embedder.encode(intent.entities).reshape(-1, embedder.dim)])
    cfg = RetrievalConfig(channels=[channel] if channel != "attr" else ["bm25", "attr"], **settings)
    wm = activate(question, None, memory, cfg=cfg, llm=None, embedder=embedder, reranker=None, intent=intent, query_vectors=vectors)
    return wm.channels[channel]


def test_dense_channel_ignores_sentence_vectors_when_the_retrieval_switch_is_off() -> None:
    embedder = OneHotEmbedder(dim=3)
    units = [unit(0, "Alex went hiking. Then Alex cooked pasta."), unit(1, "Alex cooks often.")]
    facts = np.array([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]])
    sentences = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], np.float32)
    memory = make_memory(units, facts, embedder, sentence_embeddings=sentences, sentence_unit=np.array([0, 0]))
    query = np.array([0.0, 1.0, 0.0], np.float32)
    assert ranked(memory, embedder, "dense", QueryIntent(), query) == ["u0", "u1"]
    assert ranked(memory, embedder, "dense", QueryIntent(), query, sentence_vectors=False) == ["u1", "u0"]


def test_subject_entities_switch() -> None:
    embedder = OneHotEmbedder()
    memory = make_memory([unit(0, "She moved.", subject="Alex"), unit(1, "Maria paints.", subject="Maria", entities=["painting"])],
                         np.eye(2, 32), embedder)
    intent = QueryIntent(entities=["Alex"])
    assert ranked(memory, embedder, "attr", intent, np.zeros(32, np.float32)) == ["u0"]
    assert ranked(memory, embedder, "attr", intent, np.zeros(32, np.float32), subject_entities=False) == []


def test_attribute_ties_break_by_bm25_or_by_unit_order() -> None:
    embedder = OneHotEmbedder()
    units = [unit(0, "Alex likes tea.", entities=["Alex"]), unit(1, "Alex moved to Denver.", entities=["Alex"]),
             *(unit(row, text, subject="Maria") for row, text in enumerate(["Maria sings.", "Maria swims.", "Maria reads."], start=2))]
    memory = make_memory(units, np.eye(5, 32), embedder)
    intent, query = QueryIntent(entities=["Alex"]), np.zeros(32, np.float32)
    question = "When did Alex move to Denver?"
    assert ranked(memory, embedder, "attr", intent, query, question) == ["u1", "u0"]
    assert ranked(memory, embedder, "attr", intent, query, question, attr_tiebreak=False) == ["u0", "u1"]


def test_utterance_day_fallback_switch() -> None:
    embedder = OneHotEmbedder()
    units = [unit(0, "Alex ran a race.", day="2023-06-10"), unit(1, "Alex swam.", day="2023-01-02", fact_day="2023-06-10")]
    memory = make_memory(units, np.eye(2, 32), embedder)
    intent, query = QueryIntent(fact_times=[TimeSpan("2023-06-10", "2023-06-10")]), np.zeros(32, np.float32)
    assert ranked(memory, embedder, "attr", intent, query) == ["u0", "u1"]
    assert ranked(memory, embedder, "attr", intent, query, utterance_day_fallback=False) == ["u1"]

