"""Working-memory activation (paper III-B, Algorithm 1): three channels, RRF, reranking, a budget of k units.

:class:`ActivationIndex` holds a namespace's search structures, built once and reused for every
question; :func:`activate` answers one question with a :class:`WorkingMemory` that keeps, besides the
k units, every channel's ranked list, the fused pool and the reranked pool, for evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from qgmem_train.config import RetrievalConfig
from qgmem_train.errors import InputError
from qgmem_train.llm.base import ChatLLM
from qgmem_train.memory.columns import ranges
from qgmem_train.memory.search_terms import TermLists, turn_term_lists, unit_term_lists
from qgmem_train.memory.store import NamespaceMemory
from qgmem_train.memory.turn_table import PreviousTurnMap, TurnMap
from qgmem_train.memory.types import MemoryUnit, Trace, Turn
from qgmem_train.memory.unit_table import UnitView, first_source_turn_ids, unit_texts
from qgmem_train.retrieval.attributes import AttributeScorer, TextMatcher, with_subject_entities
from qgmem_train.retrieval.cross_encoder import UNRECORDED_LAYOUT
from qgmem_train.retrieval.dense import DenseIndex
from qgmem_train.retrieval.fusion import reciprocal_rank_fusion
from qgmem_train.retrieval.graph import GraphChannel, unit_graph
from qgmem_train.retrieval.intent import QueryIntent, parse_intent_rules, parse_intents
from qgmem_train.retrieval.lexical import BM25Index
from qgmem_train.retrieval.ranking import top_n, top_positive
from qgmem_train.retrieval.rerank import Reranker, rerank_document
from qgmem_train.text import tokenize

if TYPE_CHECKING:
    from qgmem_train.llm.embedder import Embedder

CHANNELS = ("bm25", "dense", "attr", "graph")
"""Every retrieval channel; ``graph`` ranks after the others are fused, from their fused order (:func:`fuse_channels`)."""


def lexical_postings(memory: NamespaceMemory, count: int, start: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(vocabulary, term id, unit row) of every term BM25 indexes for the units from ``start`` on: each unit's
    :func:`~qgmem_train.memory.search_terms.lexical_text`, then its ``count`` preceding turns of the same session.

    The terms are those the store kept (a loaded namespace tokenizes nothing) or, for units and turns held in memory,
    made once each: a turn is the context of the units after it and is tokenized once, not once per unit. The terms
    equal those of the joined text, since no term spans the spaces and newlines that join the parts.
    """
    units = unit_terms(memory.units)
    n_units = len(units)
    own = np.arange(start, n_units, dtype=np.int64)
    rows, docs = [own], [own]
    if count > 0:
        turn_terms, (row_of, previous) = turn_context(memory), turn_rows(memory)
        chain = np.append(previous, -1)  # row -1 (no turn) leads to no turn
        first_turns = first_source_turn_ids(memory.units, start)
        turn = np.fromiter((row_of.get(t, -1) if t is not None else -1 for t in first_turns), np.int64, len(own))
        context = []
        for _ in range(count):
            turn = chain[turn]
            has = np.flatnonzero(turn >= 0)
            context.append(turn[has])
            docs.append(own[has])
        if start:  # only the later units' lists and their turns': their vocabulary alone is merged
            units, turns = units.take(own).without_unused_terms(), np.unique(np.concatenate(context))
            turn_terms, own = turn_terms.take(turns).without_unused_terms(), np.arange(len(own), dtype=np.int64)
            context = [np.searchsorted(turns, c) for c in context]
            rows = [own]
        units = TermLists.concat([units, turn_terms])  # turn row r is row len(units) + r
        rows += [len(units) - len(turn_terms) + c for c in context]
    row, doc = np.concatenate(rows), np.concatenate(docs)
    lengths = units.lengths[row]
    return units.vocab.tolist(), units.ids[ranges(units.starts[row], lengths)], np.repeat(doc, lengths)  # type: ignore[return-value]


def unit_terms(units: Sequence[MemoryUnit]) -> TermLists:
    """The BM25 terms of each unit: stored with a loaded namespace's units, else made from their texts."""
    if isinstance(units, UnitView):
        return units.table.with_terms().terms  # type: ignore[return-value]
    return unit_term_lists((u.fact_text, u.source_text) for u in units)


def turn_context(memory: NamespaceMemory) -> TermLists:
    """The turns' BM25 terms, a row per turn in :func:`turn_rows`' order: read from a loaded namespace's turn table, else
    made from its turns."""
    if isinstance(memory.turns, TurnMap):
        return memory.turns.table.with_terms().terms  # type: ignore[return-value]
    return turn_term_lists((t.speaker, t.text) for t in memory.turns.values())


def turn_rows(memory: NamespaceMemory) -> tuple[Mapping[str, int], np.ndarray]:
    """The row of each turn id, and the row of the turn before each turn in the same session (-1 for none): read from a
    loaded namespace's turn table, else from its turn mappings."""
    if isinstance(memory.turns, TurnMap) and isinstance(memory.previous_turn, PreviousTurnMap):
        table = memory.turns.table
        rows = np.arange(len(table), dtype=np.int64)
        return table.row_of, np.where(table.has_previous, rows - 1, -1)
    row_of = {turn_id: row for row, turn_id in enumerate(memory.turns)}
    previous = np.fromiter((row_of.get(memory.previous_turn.get(t), -1) for t in row_of), np.int64, len(row_of))  # type: ignore[arg-type]
    return row_of, previous


def query_texts(question: str, intent: QueryIntent) -> list[str]:
    """What a query embeds: the question, then its entities, then its locations."""
    return [question, *intent.entities, *intent.locations]


def encode_queries(embedder: Embedder, questions: Sequence[str], intents: Sequence[QueryIntent]) -> list[np.ndarray]:
    """The :func:`query_texts` embeddings of every question, encoded in one batch and split per question."""
    texts = [query_texts(q, intent) for q, intent in zip(questions, intents)]
    vectors = embedder.encode([t for group in texts for t in group])
    return np.split(vectors, np.cumsum([len(group) for group in texts])[:-1])


def check_channels(channels: Sequence[str]) -> list[str]:
    """The channels as a list, each one known; an unknown name is an :class:`InputError`."""
    unknown = [c for c in channels if c not in CHANNELS]
    if unknown or not channels:
        raise InputError("retrieval.channels", f"unknown or empty channels {list(channels)} (known: {', '.join(CHANNELS)})")
    return list(channels)


class ActivationIndex:
    """The search structures of one namespace: BM25, dense, attributes, the unit graph, and each unit's trace (trajectory,
    current member).

    With ``retrieval.subject_entities`` each unit's triple subject joins its entities for SemMatch,
    embedded when the unit was stored, else with ``embedder`` (extraction often leaves the subject, e.g.
    the speaker, out of the entity list); with ``retrieval.sentence_vectors`` the dense channel also
    reads the store's sentence vectors. The graph channel's graph (``graph`` in ``retrieval.channels``) is
    built here from the units' attributes, traces and turns: a store holds no graph, so one of any age answers.
    """

    def __init__(self, memory: NamespaceMemory, cfg: RetrievalConfig, embedder: Embedder, *, previous: ActivationIndex | None = None):
        """``previous``: the index (with the same ``cfg``) of an earlier load of the namespace whose units ``memory``'s
        begin with (:meth:`~qgmem_train.memory.store.MemoryStore.load_additions`): its BM25 postings, attribute days and
        unit rows are kept and the later units' appended, to the index a build over ``memory`` makes."""
        self.memory = memory
        self.channels = check_channels(cfg.channels)
        units = memory.units
        start = len(previous.memory.units) if previous is not None else 0
        self.bm25 = None
        if "bm25" in self.channels:
            postings = lexical_postings(memory, cfg.lexical_context_turns, start)
            self.bm25 = previous.bm25.appended(*postings, len(units)) if previous is not None and previous.bm25 else BM25Index(*postings, len(units))
        sentences = (memory.sentence_embeddings, memory.sentence_unit) if cfg.sentence_vectors else (None, None)
        dense_channel = "dense" in self.channels
        self.dense = DenseIndex(
            memory.fact_embeddings, *sentences,
            approximate=cfg.approximate and dense_channel, scan="auto" if dense_channel else "float32",
            code_blocks=memory.code_blocks if cfg.sentence_vectors else None,
        )  # fmt: skip
        self.attributes = None
        if "attr" in self.channels:
            attributes = memory.attributes
            if cfg.subject_entities and units:
                attributes = with_subject_entities(attributes, units, embedder)
            self.attributes = AttributeScorer(
                units, attributes, sem_threshold=cfg.sem_threshold, utterance_fallback=cfg.utterance_day_fallback,
                previous=previous.attributes if previous is not None else None,
            )  # fmt: skip
        self.trajectory = {t.id: t.trajectory for t in memory.traces}
        self._row_of = dict(previous._row_of) if previous is not None else {}
        self._row_of.update((unit_id, row) for row, unit_id in enumerate(unit_texts(units, "id", start), start))  # type: ignore[misc]
        self.current_row = current_rows(memory.traces, self._row_of)
        """Row of the current member of each unit's trace (its own row when it is current); -1 outside traces."""
        self.graph = None
        if "graph" in self.channels:
            texts = self.attributes.texts if self.attributes is not None else TextMatcher(memory.attributes.embeddings, cfg.sem_threshold)
            graph = unit_graph(units, memory.attributes, memory.traces, self._row_of, *turn_rows(memory), cfg.graph_links)
            self.graph = GraphChannel(graph, texts, len(memory.attributes.texts))

    def trajectory_of(self, unit: MemoryUnit) -> str | None:
        """The trajectory of the unit's trace, if it belongs to one."""
        trace_id = self.memory.trace_of.get(unit.id)
        return self.trajectory.get(trace_id) if trace_id else None

    def current_of(self, unit: MemoryUnit) -> MemoryUnit | None:
        """The current member of the unit's trace (the unit itself when it is current), if it belongs to one."""
        row = self.current_row[self._row_of[unit.id]]
        return self.memory.units[row] if row >= 0 else None

    def turn_before(self, unit: MemoryUnit) -> Turn | None:
        """The turn before the unit's first source turn in its session, if any."""
        previous = self.memory.previous_turn.get(unit.source_turn_ids[0]) if unit.source_turn_ids else None
        return self.memory.turns.get(previous) if previous is not None else None

    def document(self, unit: MemoryUnit, layout: str = UNRECORDED_LAYOUT) -> str:
        """The unit's rerank document in ``layout``, with its trace's trajectory and current state (and, in the
        ``context`` layout, the turn before it)."""
        before = self.turn_before(unit) if layout == "context" else None
        return rerank_document(unit, self.trajectory_of(unit), self.current_of(unit), layout, before)

    def without_superseded(self, rows: np.ndarray) -> np.ndarray:
        """Whether each of ``rows`` stays: False for a superseded unit whose trace's current member is among ``rows``."""
        current = self.current_row[rows]
        return ~((current >= 0) & (current != rows) & np.isin(current, rows))


def current_rows(traces: Sequence[Trace], row_of: dict[str, int]) -> np.ndarray:
    """Row of the current member (``current_id``) of each unit's trace, units given by ``row_of``; -1 outside traces."""
    current = np.full(len(row_of), -1, np.int64)
    for trace in traces:
        if trace.current_id in row_of:
            members = [row_of[m] for m in trace.member_ids if m in row_of]
            current[members] = row_of[trace.current_id]
    return current


@dataclass
class WorkingMemory:
    """The activated units (best first) and everything that led to them."""

    question: str
    question_time: str | None
    intent: QueryIntent
    units: list[MemoryUnit]
    scores: list[float]
    """Reranker score of each unit, its blended score (``rerank_mode: blend``), or its RRF score (without a reranker, or ``rrf``)."""
    channels: dict[str, list[str]]
    """Unit ids of each channel's top n, best first."""
    fused: list[str]
    """The candidate pool in RRF order (without the superseded units below)."""
    reranked: list[str]
    """The candidate pool in final order: the reranker's (or, with ``rerank_mode: rrf`` or ``blend``, its fusion with the RRF order; the RRF order without a reranker)."""
    reranker: str
    superseded: list[str] = field(default_factory=list)
    """Units of the RRF top n left out of the pool (``drop_superseded``): their trace's current member is in it."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per step: intent, embed, each channel, fusion (and the graph channel with its second fusion), rerank."""


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
    query_vectors: np.ndarray | None = None,
) -> WorkingMemory:
    """Activate the working memory for one question.

    ``llm`` parses the query intent with the paper's prompt; ``None`` uses the rule-based parser.
    ``index`` reuses a namespace's prebuilt :class:`ActivationIndex`; ``intent`` a parse made
    beforehand (batched); ``query_vectors`` the embeddings of :func:`query_texts`, encoded beforehand
    (batched). ``reranker`` ``None`` keeps the RRF order. With ``retrieval.drop_superseded`` a
    superseded trace member leaves the pool when its trace's current member is in it.
    """
    index = index or ActivationIndex(memory, cfg, embedder)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    if intent is None:
        intent = parse_intents([(question, question_time)], llm)[0] if llm is not None else parse_intent_rules(question, question_time)
    timings["intent"] = time.perf_counter() - start

    start = time.perf_counter()
    vectors = query_vectors if query_vectors is not None else embedder.encode(query_texts(question, intent))
    query_vector = vectors[0]
    entity_vectors = vectors[1 : 1 + len(intent.entities)]
    location_vectors = vectors[1 + len(intent.entities) :]
    timings["embed"] = time.perf_counter() - start

    ranked = search_channels(index, cfg, question, query_vector, intent, entity_vectors, location_vectors, timings)

    pool, fused_scores = fuse_channels(index, cfg, ranked, [entity_vectors, location_vectors], timings)
    start = time.perf_counter()
    superseded = np.zeros(0, np.int64)
    if cfg.drop_superseded:
        keep = index.without_superseded(pool)
        superseded, pool, fused_scores = pool[~keep], pool[keep], fused_scores[keep]
    timings["fusion"] += time.perf_counter() - start

    units = memory.units
    start = time.perf_counter()
    if reranker is None or len(pool) == 0:
        order, scores = pool, fused_scores
    else:
        scored = len(pool) if cfg.rerank_top is None else min(cfg.rerank_top, len(pool))
        layout = getattr(reranker, "document_layout", UNRECORDED_LAYOUT)
        order, scores = rerank_head(pool[:scored], question, [index.document(units[row], layout) for row in pool[:scored]], reranker, cfg)
        order, scores = np.concatenate([order, pool[scored:]]), np.concatenate([scores, fused_scores[scored:]])
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
        superseded=ids(superseded),
        reranked=ids(order),
        reranker=reranker.name if reranker is not None else "none",
        timings=timings,
    )


def fuse_channels(
    index: ActivationIndex, cfg: RetrievalConfig, ranked: dict[str, np.ndarray], query_items: Sequence[np.ndarray], timings: dict[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """The RRF pool of the channels' rankings and its scores; with the graph channel, ``ranked`` gains its ranking (the walk
    from the fused pool's first units and ``query_items``, the question's entity and its location embeddings) and the pool is
    fused again with it at weight ``retrieval.graph_weight``. Times ``fusion`` and ``graph`` into ``timings``."""
    start = time.perf_counter()
    pool, scores = reciprocal_rank_fusion(ranked, kappa=cfg.kappa, n=cfg.n)
    timings["fusion"] = time.perf_counter() - start
    if index.graph is not None:
        start = time.perf_counter()
        ranked["graph"] = index.graph.ranking(pool, scores, query_items, cfg)
        pool, scores = reciprocal_rank_fusion(ranked, kappa=cfg.kappa, n=cfg.n, weights={"graph": cfg.graph_weight})
        timings["graph"] = time.perf_counter() - start
    return pool, scores


def rerank_head(head: np.ndarray, question: str, documents: list[str], reranker: Reranker, cfg: RetrievalConfig) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``head`` (the fused pool's first units, in fused order) and their scores, in the order ``cfg.rerank_mode`` gives them."""
    rerank_scores = reranker.score(question, documents)
    if cfg.rerank_mode == "blend":
        rerank_scores = blend_with_fused_rank(rerank_scores, cfg.rerank_prior)
    order_in_head = np.argsort(-rerank_scores, kind="stable")
    order, scores = head[order_in_head], np.asarray(rerank_scores, dtype=np.float64)[order_in_head]
    if cfg.rerank_mode == "rrf":
        order, scores = reciprocal_rank_fusion({"fused": head, "reranked": order}, kappa=cfg.kappa, n=len(head))
    return order, scores


def blend_with_fused_rank(scores: np.ndarray, prior: float) -> np.ndarray:
    """Reranker scores of a fused pool (in pool order) standardized over the pool, minus ``prior``·ln(1 + fused rank from 0).

    Standardizing makes the prior's weight mean the same for any reranker's score scale; with prior 0
    the order is the reranker's own.
    """
    scores = np.asarray(scores, dtype=np.float64)
    standardized = (scores - scores.mean()) / (scores.std() + 1e-9)
    return standardized - prior * np.log1p(np.arange(len(scores)))


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

    Attribute scores are coarse (many units share one), so with ``retrieval.attr_tiebreak`` ties are
    broken by the BM25 score (units that match the constraints and share the query's words first), or
    by dense similarity without BM25; without it, by unit order.
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
    lexical = None
    if "bm25" in index.channels:
        start = time.perf_counter()
        lexical = index.bm25.scores(tokenize(question))
        ranked["bm25"] = top_positive(lexical, cfg.n)[0]
        timings["bm25"] = time.perf_counter() - start
    if "attr" in index.channels:
        start = time.perf_counter()
        matched, elt = index.attributes.matches(intent, entity_vectors, location_vectors)
        if not cfg.attr_tiebreak:
            tiebreak = None
        elif lexical is not None:
            tiebreak = lambda rows: lexical[matched[rows]]  # noqa: E731
        elif similarities is not None:
            tiebreak = lambda rows: similarities[matched[rows]]  # noqa: E731
        else:
            tiebreak = lambda rows: index.dense.similarities(query_vector, matched[rows])  # noqa: E731
        ranked["attr"] = matched[top_positive(elt, cfg.n, tiebreak=tiebreak)[0]]
        timings["attr"] = time.perf_counter() - start
    return {name: ranked[name] for name in CHANNELS if name in ranked}
