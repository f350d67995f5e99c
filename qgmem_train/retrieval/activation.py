"""Working-memory activation (paper III-B, Algorithm 1): three channels, RRF, reranking, a budget of k units.

:class:`ActivationIndex` holds a namespace's search structures, built once and reused for every
question; :func:`activate` answers one question with a :class:`WorkingMemory` that keeps, besides the
k units, every channel's ranked list, the fused pool and the reranked pool, for evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from qgmem_train.config import RetrievalConfig
from qgmem_train.errors import InputError
from qgmem_train.llm.base import ChatLLM
from qgmem_train.memory.types import MemoryUnit
from qgmem_train.retrieval.attributes import AttributeScorer
from qgmem_train.retrieval.dense import DenseIndex
from qgmem_train.retrieval.fusion import reciprocal_rank_fusion
from qgmem_train.retrieval.intent import QueryIntent, parse_intent_rules, parse_intents
from qgmem_train.retrieval.lexical import BM25Index, tokenize
from qgmem_train.retrieval.ranking import top_n, top_positive
from qgmem_train.retrieval.rerank import Reranker, rerank_document

if TYPE_CHECKING:
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.memory.store import NamespaceMemory

CHANNELS = ("bm25", "dense", "attr")


def lexical_text(unit: MemoryUnit) -> str:
    """What BM25 indexes for a unit: its fact, its source dialogue when different, and its attributes."""
    parts = [unit.fact_text]
    if unit.source_text.strip() != unit.fact_text.strip():
        parts.append(unit.source_text)
    parts += unit.entities + unit.locations
    return " ".join(parts)


def check_channels(channels: Sequence[str]) -> list[str]:
    """The channels as a list, each one known; an unknown name is an :class:`InputError`."""
    unknown = [c for c in channels if c not in CHANNELS]
    if unknown or not channels:
        raise InputError("retrieval.channels", f"unknown or empty channels {list(channels)} (known: {', '.join(CHANNELS)})")
    return list(channels)


class ActivationIndex:
    """The search structures of one namespace: BM25, dense, attributes, and units by id."""

    def __init__(self, memory: NamespaceMemory, cfg: RetrievalConfig):
        self.memory = memory
        self.channels = check_channels(cfg.channels)
        units = memory.units
        self.bm25 = BM25Index([tokenize(lexical_text(u)) for u in units]) if "bm25" in self.channels else None
        self.dense = DenseIndex(memory.fact_embeddings, approximate=cfg.approximate)
        self.attributes = (
            AttributeScorer(units, memory.attributes, sem_threshold=cfg.sem_threshold) if "attr" in self.channels else None
        )
        self.trajectory = {t.id: t.trajectory for t in memory.traces}

    def trajectory_of(self, unit: MemoryUnit) -> str | None:
        """The trajectory of the unit's trace, if it belongs to one."""
        trace_id = self.memory.trace_of.get(unit.id)
        return self.trajectory.get(trace_id) if trace_id else None


@dataclass
class WorkingMemory:
    """The activated units (best first) and everything that led to them."""

    question: str
    question_time: str | None
    intent: QueryIntent
    units: list[MemoryUnit]
    scores: list[float]
    """Reranker score of each unit, or its RRF score without a reranker."""
    channels: dict[str, list[str]]
    """Unit ids of each channel's top n, best first."""
    fused: list[str]
    """The candidate pool in RRF order."""
    reranked: list[str]
    """The candidate pool in reranker order (the RRF order without a reranker)."""
    reranker: str
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per step: intent, embed, each channel, fusion, rerank."""


def activate(
    question: str,
    question_time: str | None,
    memory: NamespaceMemory,
    *,
    cfg: RetrievalConfig,
    llm: ChatLLM | None,
    embedder: Embedder,
    reranker: Reranker | None,
    index: ActivationIndex | None = None,
    intent: QueryIntent | None = None,
) -> WorkingMemory:
    """Activate the working memory for one question.

    ``llm`` parses the query intent with the paper's prompt; ``None`` uses the rule-based parser.
    ``index`` reuses a namespace's prebuilt :class:`ActivationIndex`; ``intent`` a parse made
    beforehand (batched). ``reranker`` ``None`` keeps the RRF order.
    """
    index = index or ActivationIndex(memory, cfg)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    if intent is None:
        intent = parse_intents([(question, question_time)], llm)[0] if llm is not None else parse_intent_rules(question, question_time)
    timings["intent"] = time.perf_counter() - start

    start = time.perf_counter()
    vectors = embedder.encode([question, *intent.entities, *intent.locations])
    query_vector = vectors[0]
    entity_vectors = vectors[1 : 1 + len(intent.entities)]
    location_vectors = vectors[1 + len(intent.entities) :]
    timings["embed"] = time.perf_counter() - start

    ranked = search_channels(index, cfg, question, query_vector, intent, entity_vectors, location_vectors, timings)

    start = time.perf_counter()
    pool, fused_scores = reciprocal_rank_fusion(ranked, kappa=cfg.kappa, n=cfg.n)
    timings["fusion"] = time.perf_counter() - start

    units = memory.units
    start = time.perf_counter()
    if reranker is None or len(pool) == 0:
        order, scores = pool, fused_scores
    else:
        documents = [rerank_document(units[row], index.trajectory_of(units[row])) for row in pool]
        rerank_scores = reranker.score(question, documents)
        order_in_pool = np.argsort(-rerank_scores, kind="stable")
        order, scores = pool[order_in_pool], rerank_scores[order_in_pool]
    timings["rerank"] = time.perf_counter() - start

    ids = lambda rows: [units[r].id for r in rows]  # noqa: E731
    return WorkingMemory(
        question=question,
        question_time=question_time,
        intent=intent,
        units=[units[r] for r in order[: cfg.k]],
        scores=[float(s) for s in scores[: cfg.k]],
        channels={name: ids(rows) for name, rows in ranked.items()},
        fused=ids(pool),
        reranked=ids(order),
        reranker=reranker.name if reranker is not None else "none",
        timings=timings,
    )


def search_channels(
    index: ActivationIndex,
    cfg: RetrievalConfig,
    question: str,
    query_vector: np.ndarray,
    intent: QueryIntent,
    entity_vectors: np.ndarray,
    location_vectors: np.ndarray,
    timings: dict[str, float] | None = None,
) -> dict[str, np.ndarray]:
    """Each configured channel's top-n unit rows, best first (BM25 and attributes: positive scores only).

    Attribute scores are coarse (many units share one), so ties are broken by the dense similarity.
    """
    timings = timings if timings is not None else {}
    ranked: dict[str, np.ndarray] = {}
    similarities = None
    if "dense" in index.channels:
        start = time.perf_counter()
        if index.dense.approximate:
            ranked["dense"] = index.dense.search(query_vector, cfg.n)[0]
        else:
            similarities = index.dense.similarities(query_vector)
            ranked["dense"] = top_n(similarities, cfg.n)[0]
        timings["dense"] = time.perf_counter() - start
    if "bm25" in index.channels:
        start = time.perf_counter()
        ranked["bm25"] = index.bm25.search(tokenize(question), cfg.n)[0]
        timings["bm25"] = time.perf_counter() - start
    if "attr" in index.channels:
        start = time.perf_counter()
        elt = index.attributes.scores(intent, entity_vectors, location_vectors)
        if similarities is not None:
            tiebreak = similarities.__getitem__
        else:
            tiebreak = lambda rows: index.dense.similarities(query_vector, rows)  # noqa: E731
        ranked["attr"] = top_positive(elt, cfg.n, tiebreak=tiebreak)[0]
        timings["attr"] = time.perf_counter() - start
    return {name: ranked[name] for name in CHANNELS if name in ranked}
