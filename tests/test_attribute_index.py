"""The indexed attribute channel (posting lists, sorted intervals) scores every unit as the scan over all units did."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import pytest

from qgmem_train.memory.types import MemoryUnit, TimeSpan
from qgmem_train.memory.unit_table import ENTITY, LOCATION, AttributeIndex
from qgmem_train.retrieval.attributes import NO_DAY, AttributeScorer, day_ordinal, span_ordinals
from qgmem_train.retrieval.intent import QueryIntent
from qgmem_train.retrieval.ranking import top_positive

DIM = 8
GRANULARITIES = ("day", "week", "month", "year")
START = date(2022, 11, 1)


def scanned_scores(units, attributes, intent, entity_vectors, location_vectors, threshold, fallback) -> np.ndarray:
    """S_ELT as the channel computed it before it was indexed: a pass over every attribute row and every unit's times."""
    n = len(units)
    kinds, owners, text_id = attributes.kind, attributes.unit_index, attributes.text_id

    def sem(query, kind):
        if len(query) == 0 or len(attributes.embeddings) == 0:
            return np.zeros(n, np.float32)
        best = np.zeros((n, len(query)), np.float32)
        sims = attributes.embeddings @ np.asarray(query, np.float32).T
        sims[sims < threshold] = 0.0
        rows = np.flatnonzero(sims.any(axis=1)[text_id] & (kinds == kind))
        np.maximum.at(best, owners[rows], sims[text_id[rows]])
        return best.mean(axis=1)

    def overlaps(lo, hi, query):
        hit = np.zeros(lo.shape[0], bool)
        for q_lo, q_hi in query:
            hit |= (lo != NO_DAY) & (lo <= q_hi) & (hi >= q_lo)
        return hit

    fact_unit = np.array([row for row, u in enumerate(units) for _ in u.fact_time], np.int64)
    fact_days = span_ordinals([s for u in units for s in u.fact_time])
    day = np.array([day_ordinal(u.utterance_time) if u.utterance_time else NO_DAY for u in units], np.int64)
    axes = []
    if intent.entities:
        axes.append(sem(entity_vectors, ENTITY))
    if intent.locations:
        axes.append(sem(location_vectors, LOCATION))
    parts = []
    if intent.fact_times:
        match = np.zeros(n, np.float32)
        match[fact_unit[overlaps(fact_days[:, 0], fact_days[:, 1], span_ordinals(intent.fact_times))]] = 1.0
        if fallback:
            undated = ~np.isin(np.arange(n), fact_unit)
            match[undated] = overlaps(day, day, span_ordinals(intent.fact_times))[undated]
        parts.append(match)
    if intent.utterance_times:
        parts.append(overlaps(day, day, span_ordinals(intent.utterance_times)).astype(np.float32))
    if parts:
        axes.append(np.mean(parts, axis=0))
    return np.mean(axes, axis=0).astype(np.float32) if axes else np.zeros(n, np.float32)


def random_span(rng: np.random.Generator) -> TimeSpan:
    """A span of a random granularity, one period or several (start and end in different periods)."""
    start = START + timedelta(days=int(rng.integers(0, 500)))
    end = start + timedelta(days=int(rng.choice([0, 0, 0, 3, 20, 90])))
    return TimeSpan(start.isoformat(), end.isoformat(), str(rng.choice(GRANULARITIES)))


def random_namespace(rng: np.random.Generator, n: int, n_texts: int) -> tuple[list[MemoryUnit], AttributeIndex, np.ndarray]:
    """Units with random utterance days (some none) and fact spans, and attribute rows over shared texts."""
    centres = rng.standard_normal((6, DIM)).astype(np.float32)
    texts = centres[rng.integers(0, 6, n_texts)] + 0.5 * rng.standard_normal((n_texts, DIM)).astype(np.float32)
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    units = []
    for i in range(n):
        utterance = None if rng.random() < 0.1 else (START + timedelta(days=int(rng.integers(0, 500)))).isoformat()
        units.append(MemoryUnit(
            id=f"u{i}", session_id="s", fact_text=f"fact {i}", subject="x", predicate="p", object="o", source_turn_ids=[f"t{i}"],
            source_text="", utterance_time=utterance, serial=i, fact_time=[random_span(rng) for _ in range(rng.choice([0, 0, 1, 2]))],
        ))  # fmt: skip
    owners = np.sort(rng.integers(0, n, 3 * n))
    attributes = AttributeIndex(
        unit_index=owners.astype(np.int64), kind=rng.choice([ENTITY, LOCATION], len(owners)).astype(np.int8),
        texts=[f"text{t}" for t in range(n_texts)], embeddings=texts, text_id=rng.integers(0, n_texts, len(owners)).astype(np.int64),
    )  # fmt: skip
    return units, attributes, centres


def random_query(rng: np.random.Generator, centres: np.ndarray, granularity: str) -> tuple[QueryIntent, np.ndarray, np.ndarray]:
    """An intent with random entities, locations, fact and utterance times (each possibly absent) and their vectors."""

    def items(count: int) -> np.ndarray:
        vectors = centres[rng.integers(0, len(centres), count)] + 0.5 * rng.standard_normal((count, DIM)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    entities, locations = items(int(rng.integers(0, 3))), items(int(rng.integers(0, 2)))
    spans = lambda: [TimeSpan(s.start, s.end, granularity) for s in (random_span(rng) for _ in range(rng.integers(0, 3)))]  # noqa: E731
    intent = QueryIntent(entities=[f"e{i}" for i in range(len(entities))], locations=[f"l{i}" for i in range(len(locations))],
                         fact_times=spans(), utterance_times=spans() if rng.random() < 0.4 else [])  # fmt: skip
    return intent, entities, locations


@pytest.mark.parametrize("fallback", [True, False])
def test_indexed_attribute_scores_equal_the_scan_on_random_units_and_queries(fallback: bool) -> None:
    rng = np.random.default_rng(11 + fallback)
    units, attributes, centres = random_namespace(rng, 400, 60)
    scorer = AttributeScorer(units, attributes, sem_threshold=0.6, utterance_fallback=fallback)
    matched = 0
    for q in range(160):
        intent, entities, locations = random_query(rng, centres, GRANULARITIES[q % 4])
        expected = scanned_scores(units, attributes, intent, entities, locations, 0.6, fallback)
        rows, values = scorer.matches(intent, entities, locations)
        assert np.all(np.diff(rows) > 0)
        np.testing.assert_array_equal(rows[values > 0], np.flatnonzero(expected > 0))
        np.testing.assert_array_equal(values, expected[rows])
        np.testing.assert_array_equal(scorer.scores(intent, entities, locations), expected)
        assert top_positive(values, 20)[0].tolist() == np.searchsorted(rows, top_positive(expected, 20)[0]).tolist()
        matched += int(np.any(expected > 0))
    assert matched > 100


def test_texts_found_through_int8_codes_score_as_the_exact_product() -> None:
    pytest.importorskip("faiss")
    rng = np.random.default_rng(21)
    units, attributes, centres = random_namespace(rng, 300, 600)
    exact = AttributeScorer(units, attributes, sem_threshold=0.6)
    coded = AttributeScorer(units, attributes, sem_threshold=0.6, text_codes_from=0)
    for q in range(80):
        intent, entities, locations = random_query(rng, centres, GRANULARITIES[q % 4])
        expected = exact.scores(intent, entities, locations)
        rows, values = coded.matches(intent, entities, locations)
        np.testing.assert_array_equal(rows[values > 0], np.flatnonzero(expected > 0))
        np.testing.assert_allclose(values, expected[rows], rtol=0, atol=1e-6)
        for vectors in (entities, locations):
            if len(vectors):
                texts, sims = coded.texts.passing(vectors)
                full = attributes.embeddings @ vectors.T
                assert texts.tolist() == np.flatnonzero((full >= 0.6).any(axis=1)).tolist()
                np.testing.assert_allclose(sims, np.where(full[texts] >= 0.6, full[texts], 0), rtol=0, atol=1e-6)
