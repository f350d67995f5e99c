"""Search a namespace: its index kept while the namespace lives, a question's working memory and its MEMORY_CONTEXT.

:class:`NamespaceIndex` loads a namespace and builds its :class:`~qgmem_train.retrieval.activation.ActivationIndex`
once, checked against the namespace's own version (:meth:`~qgmem_train.memory.store.MemoryStore.version`: its
incarnation and write count), so another namespace's writes or delete leave it in place, and grown by the namespace's
adds (:meth:`~qgmem_train.memory.store.MemoryStore.load_additions`) rather than built again. :func:`search` walks one question:
activation (intent, channels, RRF, rerank) over that index, then the evidence the answerer reads.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qgmem_train.config import RetrievalConfig
from qgmem_train.pipeline.models import PipelineModels
from qgmem_train.pipeline.results import EvidenceUnit, SourceTurn

if TYPE_CHECKING:
    import numpy as np

    from qgmem_train.answer.evidence import AnswerEvidence
    from qgmem_train.llm.structured import ParseStats
    from qgmem_train.memory.store import MemoryStore, NamespaceMemory
    from qgmem_train.memory.types import MemoryUnit
    from qgmem_train.retrieval.activation import ActivationIndex, WorkingMemory
    from qgmem_train.retrieval.intent import QueryIntent

log = logging.getLogger(__name__)

WIDEN = 4
"""How much a filtered search widens its fused pool each time fewer than k of its units pass the filter."""
UnitFilter = Callable[["NamespaceMemory", "MemoryUnit"], bool]
"""Whether a unit of a loaded namespace may enter a working memory (a search's speaker, session or time filter)."""


class NamespaceIndex:
    """One namespace's loaded memory and search index: grown by what the namespace gained since (its adds, by this
    process or another), built again only when the namespace is another one (deleted and made again, or a unit written
    again).

    ``traces`` False serializes every unit as a plain fact (the evaluation's ablation). ``builds`` and ``appends``
    count the indexes built whole and grown.
    """

    def __init__(self, store: MemoryStore, namespace: str, models: PipelineModels, *, retrieval: RetrievalConfig | None = None,
                 traces: bool = True) -> None:  # fmt: skip
        self.store = store
        self.namespace = namespace
        self.models = models
        self.retrieval = retrieval or models.cfg.retrieval
        self.traces = traces
        self.builds = self.appends = 0
        self._loaded: tuple[NamespaceMemory, ActivationIndex] | None = None
        self._loading = threading.Lock()
        """Held while the index loads or grows, so that concurrent searches of one namespace make it once; a search
        holds the (memory, index) pair it was handed, which later growth replaces rather than changes."""

    def current(self) -> tuple[NamespaceMemory, ActivationIndex]:
        """The namespace and its index as stored now: those held while the namespace is unchanged, grown by its additions."""
        with self._loading:
            if self._loaded is None or self.store.version(self.namespace) != (self._loaded[0].incarnation, self._loaded[0].generation):
                self._loaded = self._grown() or self._built()
            return self._loaded

    def refresh(self) -> None:
        """Grow the index held by what the namespace gained (after an add): the next search finds it ready. Nothing when
        no index is held yet; when it cannot grow (or reading the additions fails) it is let go, and the next search
        builds it whole (and meets the error, if it lasts), so that an add that committed is never reported failed."""
        with self._loading:
            try:
                self._loaded = self._grown()
            except Exception as exc:  # noqa: BLE001 - the add committed; the search that builds the index reports a lasting error
                log.warning("namespace %s: its search index could not grow (%s); the next search builds it", self.namespace, exc)
                self._loaded = None

    def _built(self) -> tuple[NamespaceMemory, ActivationIndex]:
        """The namespace loaded whole and its index built."""
        from qgmem_train.retrieval.activation import ActivationIndex

        embedder = self.models.embedder
        memory = self._own(self.store.load_namespace(self.namespace, embedder_id=embedder.model_id, sentences=self.retrieval.sentence_vectors))
        self.builds += 1
        return memory, ActivationIndex(memory, self.retrieval, embedder)

    def _grown(self) -> tuple[NamespaceMemory, ActivationIndex] | None:
        """The index held with the namespace's additions appended (itself when none); None when none is held or the
        namespace did not only grow (see :meth:`~qgmem_train.memory.store.MemoryStore.load_additions`)."""
        from qgmem_train.retrieval.activation import ActivationIndex

        if self._loaded is None:
            return None
        held, index = self._loaded
        memory = self.store.load_additions(held)
        if memory is None or memory is held:
            return None if memory is None else self._loaded
        memory = self._own(memory)
        self.appends += 1
        return memory, ActivationIndex(memory, self.retrieval, self.models.embedder, previous=index)

    def _own(self, memory: NamespaceMemory) -> NamespaceMemory:
        """``memory`` as this index reads it (without traces for the evaluation's ablation)."""
        return memory if self.traces else dataclasses.replace(memory, traces=[], trace_of={})


@dataclass
class Retrieval:
    """One question's working memory as the answerer reads it, with the seconds spent so far."""

    question: str
    question_time: str | None
    memory: NamespaceMemory
    working: WorkingMemory
    evidence: AnswerEvidence
    seconds: dict[str, float]
    started: float
    """``time.perf_counter()`` when the question was taken."""

    @property
    def units(self) -> list[MemoryUnit]:
        """The working memory, best first."""
        return list(self.working.units)

    def evidence_units(self, cited: Collection[str] = ()) -> list[EvidenceUnit]:
        """The working memory with labels, scores and source turns, the ``cited`` ids marked."""
        label_of = {uid: label for label, uid in self.evidence.context.labels.items()}
        return [
            EvidenceUnit(u.id, label_of.get(u.id, ""), u.fact_text, score, u.id in cited, [source_turn(self.memory, t) for t in u.source_turn_ids])
            for u, score in zip(self.working.units, self.working.scores)
        ]


def source_turn(memory: NamespaceMemory, turn_id: str) -> SourceTurn:
    """The stored turn ``turn_id`` with its time (speaker and text ``None`` when the store lacks it)."""
    turn = memory.turns.get(turn_id)
    return SourceTurn(turn_id, turn.speaker if turn else None, turn.text if turn else None, memory.turn_time.get(turn_id))


def activate_question(
    question: str, question_time: str | None, memory: NamespaceMemory, index: ActivationIndex, models: PipelineModels, *,
    retrieval: RetrievalConfig | None = None, intent: QueryIntent | None = None, query_vectors: np.ndarray | None = None,
    rerank: bool = True,
) -> WorkingMemory:  # fmt: skip
    """The working memory of one question with the models' intent parser (:func:`question_intents`), embedder and reranker
    (``rerank`` False: the RRF order); ``intent`` and ``query_vectors`` made beforehand (batched) are used as given."""
    from qgmem_train.retrieval.activation import activate

    parse_seconds = None
    if intent is None:
        start = time.perf_counter()
        intent = question_intents(models, [(question, question_time)])[0]
        parse_seconds = time.perf_counter() - start
    wm = activate(
        question, question_time, memory, cfg=retrieval or models.cfg.retrieval, llm=None, embedder=models.embedder,
        reranker=models.reranker if rerank else None, index=index, intent=intent, query_vectors=query_vectors,
    )  # fmt: skip
    if parse_seconds is not None:
        wm.timings["intent"] = parse_seconds
    return wm


def search(
    question: str, question_time: str | None, memory: NamespaceMemory, index: ActivationIndex, models: PipelineModels, *,
    retrieval: RetrievalConfig | None = None, top_k: int | None = None, keep: UnitFilter | None = None,
    intent: QueryIntent | None = None, query_vectors: np.ndarray | None = None, seconds: dict[str, float] | None = None,
) -> Retrieval:  # fmt: skip
    """Activate the working memory for ``question`` and serialize it (MEMORY_CONTEXT and local graph) as the answerer reads it.

    ``top_k`` replaces ``retrieval.k``; ``keep`` drops units of the fused pool before the k best are taken: when fewer
    than k of the pool's ``retrieval.n`` units pass, the pool is widened (n times :data:`WIDEN`, up to the whole
    namespace) until k pass or none is left out. ``seconds`` are stages already spent on the question (loading the
    namespace); activation and serialization join them.
    """
    from qgmem_train.answer.evidence import answer_evidence
    from qgmem_train.graph.local_graph import graph_options

    started = time.perf_counter() - sum((seconds or {}).values())
    seconds = dict(seconds or {})
    cfg = models.cfg
    base = retrieval or cfg.retrieval
    k = top_k or base.k
    pool = dataclasses.replace(base, k=max(k, base.n) if keep else k)
    while True:
        wm = activate_question(question, question_time, memory, index, models, retrieval=pool, intent=intent, query_vectors=query_vectors)
        kept = [(u, score) for u, score in zip(wm.units, wm.scores) if not keep or keep(memory, u)][:k]
        if not keep or len(kept) == k or pool.n >= len(memory.units):
            break
        intent, wider = wm.intent, min(len(memory.units), pool.n * WIDEN)
        pool = dataclasses.replace(pool, n=wider, k=max(k, wider))
    if keep or pool.k != k:
        wm = dataclasses.replace(wm, units=[u for u, _ in kept], scores=[score for _, score in kept])
    seconds.update(wm.timings)
    start = time.perf_counter()
    evidence = answer_evidence(wm.units, memory, models.llm, max_edges=k, **graph_options(cfg.graph))
    seconds["serialize"] = time.perf_counter() - start
    return Retrieval(question, question_time, memory, wm, evidence, seconds, started)


def question_intents(models: PipelineModels, pairs: Sequence[tuple[str, str | None]], *, stats: ParseStats | None = None) -> list[QueryIntent]:
    """The intents of (question, question time) pairs: parsed by the LLM in one batch, or by the rules."""
    from qgmem_train.retrieval.intent import INTENT_MAX_NEW_TOKENS, parse_intent_rules, parse_intents

    if models.intent_llm is None:
        return [parse_intent_rules(*pair) for pair in pairs]
    budget = min(INTENT_MAX_NEW_TOKENS, models.cfg.generation.max_new_tokens)
    return parse_intents(list(pairs), models.intent_llm, max_new_tokens=budget, stats=stats)
