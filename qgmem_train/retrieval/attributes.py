"""Event-attribute channel: S_ELT, how well a unit's entities, locations and times meet the query's constraints.

Per DESIGN.md: SemMatch for each query entity (location) is its best cosine with the unit's entities
(locations), counted when at least ``sem_threshold``; an axis scores the mean over its query items.
TimeMatch is 1 when a query interval overlaps one of the unit's fact intervals (utterance day for
``time.utterance``), each taken at its granularity (:func:`~qgmem_train.memory.timeparse.calendar_bounds`):
a month item covers its whole month, so a "December" fact matches a question about December 2023 or
about a day in it, while a day item is that day only and misses another day of the same month. A unit
without a fact time is compared through its utterance day, where an unstated event is most likely to
lie (``utterance_fallback``; off, as in the paper, it never meets a fact-time constraint). With both
fact and utterance constraints the time axis is their mean. S_ELT averages the non-empty axes; it is 0
when the query has no constraint.

Everything is vectorised over units: the index stores each attribute text once (per write of the
store), so a query item is compared once per text, and the per-unit maxima come from one
``np.maximum.at`` over matching rows. Each unit's triple subject counts as one of its entities
(:func:`with_subject_entities`), embedded when the unit was stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import TYPE_CHECKING

import numpy as np

from qgmem_train.memory.timeparse import calendar_bounds
from qgmem_train.memory.types import MemoryUnit, TimeSpan
from qgmem_train.memory.unit_table import ENTITY, LOCATION, SUBJECT, AttributeIndex
from qgmem_train.retrieval.intent import QueryIntent

if TYPE_CHECKING:
    from qgmem_train.llm.embedder import Embedder

NO_DAY = np.iinfo(np.int32).min


def day_ordinal(iso: str) -> int:
    """Proleptic Gregorian day number of an ISO date or datetime string."""
    return date.fromisoformat(iso[:10]).toordinal()


def span_ordinals(spans: Sequence[TimeSpan]) -> np.ndarray:
    """(S, 2) int32 closed day intervals of ``spans``, each widened to whole periods of its granularity."""
    bounds = [calendar_bounds(s) for s in spans]
    return np.array([(lo.toordinal(), hi.toordinal()) for lo, hi in bounds], dtype=np.int32).reshape(-1, 2)


def with_subject_entities(attributes: AttributeIndex, units: Sequence[MemoryUnit], embedder: Embedder) -> AttributeIndex:
    """The attribute rows with each unit's triple subject as an entity: who a fact is about is one of its entities.

    Stored subjects (kind SUBJECT) become entities; a unit stored without one (a store of schema
    version 2, a memory built by hand) takes the row of its subject's text when the index has it, else
    has its subject embedded here with ``embedder``.
    """
    unit_index = np.asarray(attributes.unit_index, np.int64)
    kind = np.asarray(attributes.kind, np.int8)
    text_id = np.asarray(attributes.text_id, np.int64)
    texts, embeddings = attributes.texts, attributes.embeddings
    missing = np.setdiff1d(np.arange(len(units), dtype=np.int64), unit_index[kind == SUBJECT])
    kind = np.where(kind == SUBJECT, ENTITY, kind).astype(np.int8)
    if len(missing):
        subjects = [units[i].subject for i in missing.tolist()]
        row = {text: i for i, text in reversed(list(enumerate(texts)))}
        distinct = sorted(set(subjects) - set(row))
        if distinct:
            vectors = embedder.encode(distinct)
            row |= {s: len(texts) + k for k, s in enumerate(distinct)}
            texts = [*texts, *distinct]
            embeddings = np.concatenate([np.asarray(embeddings, np.float32).reshape(-1, vectors.shape[1]), vectors])
        unit_index = np.concatenate([unit_index, missing])
        kind = np.concatenate([kind, np.full(len(missing), ENTITY, np.int8)])
        text_id = np.concatenate([text_id, np.asarray([row[s] for s in subjects], np.int64)])
    return AttributeIndex(unit_index, kind, texts, embeddings, text_id)


class AttributeScorer:
    """S_ELT of every unit of a namespace for a parsed query."""

    def __init__(
        self, units: Sequence[MemoryUnit], attributes: AttributeIndex, *, sem_threshold: float = 0.60, utterance_fallback: bool = True
    ):
        self.n_units = len(units)
        self.sem_threshold = sem_threshold
        self.utterance_fallback = utterance_fallback
        self._kind = np.asarray(attributes.kind, dtype=np.int8)
        self._unit_row = np.asarray(attributes.unit_index, dtype=np.int64)
        self._text_id = np.asarray(attributes.text_id, dtype=np.int64)
        self._text_embeddings = np.ascontiguousarray(attributes.embeddings, dtype=np.float32)
        rows = [row for row, u in enumerate(units) for _ in u.fact_time]
        fact_rows = np.column_stack([np.array(rows, dtype=np.int64), span_ordinals([s for u in units for s in u.fact_time])])
        self._fact_unit, self._fact_lo, self._fact_hi = fact_rows[:, 0], fact_rows[:, 1], fact_rows[:, 2]
        self._utterance_day = np.array(
            [day_ordinal(u.utterance_time) if u.utterance_time else NO_DAY for u in units], dtype=np.int64
        )
        self._has_fact_time = np.zeros(self.n_units, bool)
        self._has_fact_time[self._fact_unit] = True

    def sem_match(self, query_embeddings: np.ndarray, kind: int) -> np.ndarray:
        """Mean over query items of each unit's best cosine with its attributes of ``kind`` (0 below threshold)."""
        if len(query_embeddings) == 0 or len(self._text_embeddings) == 0:
            return np.zeros(self.n_units, np.float32)
        best = np.zeros((self.n_units, len(query_embeddings)), dtype=np.float32)
        text_sims = self._text_embeddings @ np.asarray(query_embeddings, dtype=np.float32).T
        text_sims[text_sims < self.sem_threshold] = 0.0
        passing = text_sims.any(axis=1)
        rows = np.flatnonzero(passing[self._text_id] & (self._kind == kind))
        np.maximum.at(best, self._unit_row[rows], text_sims[self._text_id[rows]])
        return best.mean(axis=1)

    def time_match(self, fact: np.ndarray, utterance: np.ndarray) -> np.ndarray | None:
        """Mean of the fact and utterance overlap indicators over the given constraint kinds; None if neither."""
        parts = []
        if len(fact):
            match = np.zeros(self.n_units, np.float32)
            hits = _overlaps(self._fact_lo, self._fact_hi, fact)
            match[self._fact_unit[hits]] = 1.0
            if self.utterance_fallback:
                undated = ~self._has_fact_time
                match[undated] = _overlaps(self._utterance_day, self._utterance_day, fact)[undated]
            parts.append(match)
        if len(utterance):
            parts.append(_overlaps(self._utterance_day, self._utterance_day, utterance).astype(np.float32))
        return np.mean(parts, axis=0) if parts else None

    def scores(self, intent: QueryIntent, entity_embeddings: np.ndarray, location_embeddings: np.ndarray) -> np.ndarray:
        """S_ELT of every unit: the mean over the query's non-empty axes (entities, locations, time)."""
        axes = []
        if intent.entities:
            axes.append(self.sem_match(entity_embeddings, ENTITY))
        if intent.locations:
            axes.append(self.sem_match(location_embeddings, LOCATION))
        time = self.time_match(span_ordinals(intent.fact_times), span_ordinals(intent.utterance_times))
        if time is not None:
            axes.append(time)
        if not axes:
            return np.zeros(self.n_units, np.float32)
        return np.mean(axes, axis=0).astype(np.float32)


def _overlaps(lo: np.ndarray, hi: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Whether each closed interval [lo, hi] meets any query interval (rows of ``query``); NO_DAY never does."""
    hit = np.zeros(lo.shape[0], bool)
    valid = lo != NO_DAY
    for q_lo, q_hi in query:
        hit |= valid & (lo <= q_hi) & (hi >= q_lo)
    return hit
