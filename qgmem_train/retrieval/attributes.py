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

Nothing scans the units: a query item is compared once with each distinct attribute text (the store
keeps each text once), posting lists give the units of the texts that pass, and sorted interval
bounds give the units whose times meet the query's (:class:`AttributeScorer`). Each unit's triple
subject counts as one of its entities (:func:`with_subject_entities`), embedded when the unit was stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import TYPE_CHECKING

import numpy as np

from qgmem_train.memory.columns import group_bounds, ranges
from qgmem_train.memory.timeparse import calendar_bounds
from qgmem_train.memory.types import MemoryUnit, TimeSpan
from qgmem_train.memory.unit_table import ENTITY, LOCATION, SUBJECT, AttributeIndex, unit_fact_spans, unit_texts
from qgmem_train.retrieval.intent import QueryIntent
from qgmem_train.vector_codes import build_int8_codes, has_faiss

if TYPE_CHECKING:
    from qgmem_train.llm.embedder import Embedder

NO_DAY = np.iinfo(np.int32).min
TEXT_CODES_MIN = 20_000
"""Distinct attribute texts from which SemMatch looks for the texts near a query item through int8 codes (with faiss)
rather than one exact product with every text."""
TEXT_CANDIDATES = 256
"""Texts a code search returns first for a query item; it widens while a text beyond them could still pass."""
RECENT_QUERIES = 4
"""Query arrays whose passing texts a :class:`TextMatcher` keeps: a question's entities and locations, asked twice."""
_DISTANCE_SLACK = 1e-4
"""Allowance for float32 rounding in faiss's code distances, in cosine units."""


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
    """S_ELT of the units of a namespace for a parsed query, read from indexes rather than a pass over every unit.

    SemMatch compares each query item once with every distinct attribute text and reads the units of
    the texts that reach the threshold from posting lists (one per text and kind); TimeMatch finds the
    fact intervals a query interval meets by binary search over interval starts, one sorted run per
    length class (intervals of at most twice each other's length, so a day, a week, a month and a year
    each fall in their own), and utterance days by binary search over the sorted days. A query costs
    one product with the distinct texts and what it matches, not a pass over the units.
    """

    def __init__(
        self,
        units: Sequence[MemoryUnit],
        attributes: AttributeIndex,
        *,
        sem_threshold: float = 0.60,
        utterance_fallback: bool = True,
        text_codes_from: int = TEXT_CODES_MIN,
        previous: AttributeScorer | None = None,
    ):
        """``previous``: the scorer of the first of ``units`` (those of an earlier load of the namespace): their days are
        kept and only the later units' read."""
        self.n_units = len(units)
        self.sem_threshold = sem_threshold
        self.utterance_fallback = utterance_fallback
        self.texts = TextMatcher(attributes.embeddings, sem_threshold, codes_from=text_codes_from)
        """SemMatch over the distinct attribute texts (the graph channel's walk starts from the texts it passes, too)."""
        self._postings = {
            kind: PostingLists(np.asarray(attributes.text_id, np.int64), np.asarray(attributes.unit_index, np.int64),
                               len(self.texts.embeddings), np.asarray(attributes.kind, np.int8) == kind)
            for kind in (ENTITY, LOCATION)
        }  # fmt: skip
        start = previous.n_units if previous is not None else 0
        fact_unit, fact_spans = unit_fact_spans(units, start)
        fact_days = span_ordinals(fact_spans)
        day = np.array([day_ordinal(t) if t else NO_DAY for t in unit_texts(units, "utterance_time", start)], dtype=np.int64)
        if previous is not None:
            fact_unit, fact_days, day = (np.concatenate(pair) for pair in zip(previous.days, (fact_unit, fact_days, day)))
        self.days = (fact_unit, fact_days, day)
        """Unit row and day interval of every fact time, and every unit's utterance day (:data:`NO_DAY` for none)."""
        self._facts = IntervalIndex(fact_days[:, 0], fact_days[:, 1], fact_unit)
        dated = day != NO_DAY
        undated_by_fact = np.ones(self.n_units, bool)
        undated_by_fact[fact_unit] = False
        self._utterance = IntervalIndex(day[dated], day[dated], np.flatnonzero(dated))
        fallback = dated & undated_by_fact
        self._fallback = IntervalIndex(day[fallback], day[fallback], np.flatnonzero(fallback))

    def sem_matches(self, query_embeddings: np.ndarray, kind: int) -> tuple[np.ndarray, np.ndarray]:
        """Units with an attribute of ``kind`` at the threshold of some query item, and the mean over query items of each one's best cosine."""
        if len(query_embeddings) == 0 or len(self.texts.embeddings) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        passing, text_sims = self.texts.passing(query_embeddings)
        texts, units = self._postings[kind].units_of(passing)
        rows, unit_of_posting = np.unique(units, return_inverse=True)
        best = np.zeros((len(rows), len(query_embeddings)), dtype=np.float32)
        np.maximum.at(best, unit_of_posting, text_sims[np.searchsorted(passing, texts)])
        return rows, best.mean(axis=1)

    def sem_match(self, query_embeddings: np.ndarray, kind: int) -> np.ndarray:
        """:meth:`sem_matches` as one score per unit (0 for the units it leaves out)."""
        return _dense(self.n_units, *self.sem_matches(query_embeddings, kind))

    def time_matches(self, fact: np.ndarray, utterance: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Units meeting a time constraint and the mean of their fact and utterance overlap indicators over the given kinds; None if neither."""
        parts = []
        if len(fact):
            hits = self._facts.meeting(fact)
            if self.utterance_fallback:
                hits = np.union1d(hits, self._fallback.meeting(fact))
            parts.append(hits)
        if len(utterance):
            parts.append(self._utterance.meeting(utterance))
        if not parts:
            return None
        rows = np.unique(np.concatenate(parts))
        indicators = np.stack([np.isin(rows, hits).astype(np.float32) for hits in parts])
        return rows, np.mean(indicators, axis=0)

    def matches(self, intent: QueryIntent, entity_embeddings: np.ndarray, location_embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows (ascending) of the units meeting some constraint and their S_ELT, the mean over the query's non-empty axes; 0 elsewhere."""
        axes = []
        if intent.entities:
            axes.append(self.sem_matches(entity_embeddings, ENTITY))
        if intent.locations:
            axes.append(self.sem_matches(location_embeddings, LOCATION))
        time = self.time_matches(span_ordinals(intent.fact_times), span_ordinals(intent.utterance_times))
        if time is not None:
            axes.append(time)
        if not axes:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        rows = np.unique(np.concatenate([axis_rows for axis_rows, _ in axes]))
        values = np.zeros((len(axes), len(rows)), np.float32)
        for values_of_axis, (axis_rows, axis_values) in zip(values, axes):
            values_of_axis[np.searchsorted(rows, axis_rows)] = axis_values
        return rows, np.mean(values, axis=0).astype(np.float32)

    def scores(self, intent: QueryIntent, entity_embeddings: np.ndarray, location_embeddings: np.ndarray) -> np.ndarray:
        """S_ELT of every unit (:meth:`matches` spread over the namespace)."""
        return _dense(self.n_units, *self.matches(intent, entity_embeddings, location_embeddings))


class TextMatcher:
    """The attribute texts whose similarity with a query item reaches the threshold, with their exact float32 similarities.

    Few texts: one product with all of them. From ``codes_from`` texts on (faiss installed), the int8
    codes the dense channel scans (:func:`~qgmem_train.vector_codes.build_int8_codes`) give each
    item's nearest texts, widened until every text left out provably falls below the threshold (a
    decoded component is off by at most ``0.5 / scale``), and only those are compared exactly. The
    answers for the last :data:`RECENT_QUERIES` query arrays are kept: the graph channel asks for the
    question's items right after the attribute channel has.
    """

    def __init__(self, embeddings: np.ndarray, threshold: float, *, codes_from: int = TEXT_CODES_MIN):
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        self.threshold = threshold
        self._recent: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self._codes = None
        if len(self.embeddings) and len(self.embeddings) >= codes_from and has_faiss():
            self._codes, self._scale = build_int8_codes([self.embeddings])
            self._largest_norm2 = max(
                float((np.square(np.rint(self.embeddings[lo : lo + 65_536] * self._scale) / self._scale)).sum(axis=1).max())
                for lo in range(0, len(self.embeddings), 65_536)
            )  # fmt: skip

    def passing(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows (ascending) of the texts at the threshold with some query item, and their similarity with each item (0 below it).

        The arrays returned are shared with later calls for the same items: read them, do not write them.
        """
        queries = np.asarray(queries, dtype=np.float32)
        key = queries.tobytes() + bytes(str(queries.shape), "ascii")
        if key not in self._recent:
            if len(self._recent) >= RECENT_QUERIES:
                del self._recent[next(iter(self._recent))]
            self._recent[key] = self._passing(queries)
        return self._recent[key]

    def _passing(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`passing`, computed."""
        if self._codes is None:
            sims = self.embeddings @ queries.T
        else:
            candidates = np.unique(np.concatenate([self._near(q) for q in queries]))
            sims = self.embeddings[candidates] @ queries.T
        sims[sims < self.threshold] = 0.0
        keep = np.flatnonzero(sims.any(axis=1))
        return (keep if self._codes is None else candidates[keep]), sims[keep]

    def _near(self, query: np.ndarray) -> np.ndarray:
        """Texts nearest ``query`` by their codes, enough that each text left out has a similarity below the threshold."""
        total = self._codes.ntotal
        error = 0.5 * float(np.abs(query).sum()) / self._scale + _DISTANCE_SLACK
        wanted = min(total, TEXT_CANDIDATES)
        while True:
            distances, rows = self._codes.search((query * self._scale + 128.0)[None, :], wanted)
            # a text beyond the last one found is at least as far: |x'|² + |q|² - 2 x'·q ≥ that distance / scale²
            bound = (self._largest_norm2 + float(query @ query) - float(distances[0, -1]) / self._scale**2) / 2 + error
            if bound < self.threshold or wanted >= total:
                return rows[0][rows[0] >= 0]
            wanted = min(total, 4 * wanted)


class PostingLists:
    """The units holding each text, for the attribute rows selected by ``keep``: text ids in, (text, unit) pairs out."""

    def __init__(self, text_id: np.ndarray, unit_index: np.ndarray, n_texts: int, keep: np.ndarray):
        order = np.argsort(text_id[keep], kind="stable")
        self._unit = unit_index[keep][order]
        self._start, self._end = group_bounds(text_id[keep][order], n_texts)

    def units_of(self, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The text and the unit of every posting of ``texts``."""
        counts = self._end[texts] - self._start[texts]
        return np.repeat(texts, counts), self._unit[ranges(self._start[texts], counts)]


class IntervalIndex:
    """Closed day intervals of units, sorted by start within length classes, for the units an interval query meets."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, unit: np.ndarray):
        length_class = np.ceil(np.log2(hi - lo + 1.0)).astype(np.int64)
        self._runs = []
        for c in np.unique(length_class).tolist():
            members = np.flatnonzero(length_class == c)
            order = members[np.argsort(lo[members], kind="stable")]
            self._runs.append((lo[order], hi[order], unit[order], int((hi[order] - lo[order]).max())))

    def meeting(self, query: np.ndarray) -> np.ndarray:
        """Units (ascending, once each) with an interval meeting any query interval (rows ``[lo, hi]`` of ``query``)."""
        found = [np.zeros(0, np.int64)]
        for q_lo, q_hi in np.asarray(query, np.int64).tolist():
            for lo, hi, unit, longest in self._runs:
                start, end = np.searchsorted(lo, q_lo - longest), np.searchsorted(lo, q_hi, side="right")
                found.append(unit[start:end][hi[start:end] >= q_lo])
        return np.unique(np.concatenate(found))


def _dense(n: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` at ``rows`` of n float32 zeros."""
    out = np.zeros(n, np.float32)
    out[rows] = values
    return out
