"""Dense search (with sentence vectors), S_ELT on crafted units, RRF order, top-n ties, rule-based and LLM-output query intents."""

from __future__ import annotations

import numpy as np
import pytest

from qgmem_train.llm.schemas import IntentOutput, IntentTime
from qgmem_train.memory.sentences import fact_sentences
from qgmem_train.memory.store import AttributeIndex
from qgmem_train.memory.types import MemoryUnit, TimeSpan
from qgmem_train.retrieval.attributes import AttributeScorer
from qgmem_train.retrieval.dense import DenseIndex
from qgmem_train.retrieval.fusion import reciprocal_rank_fusion
from qgmem_train.retrieval.intent import QueryIntent, intent_from_output, parse_date_range, parse_intent_rules
from qgmem_train.retrieval.ranking import top_n, top_positive


def _unit(uid: str, *, utterance: str | None = "2023-05-08", fact: list[TimeSpan] | None = None, serial: int = 0) -> MemoryUnit:
    return MemoryUnit(
        id=uid, session_id="s1", fact_text=uid, subject="x", predicate="p", object="o", source_turn_ids=[uid],
        source_text=uid, utterance_time=utterance, serial=serial, fact_time=fact or [],
    )


def _axis(*pairs: tuple[int, float]) -> np.ndarray:
    """A unit vector in 4-d with the given coordinates (used to craft exact cosines)."""
    v = np.zeros(4, np.float32)
    for i, value in pairs:
        v[i] = value
    return v / np.linalg.norm(v)


def test_dense_exact_equals_brute_force_and_hnsw_finds_the_same() -> None:
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(2000, 32)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    query = emb[17] + 0.1 * rng.normal(size=32).astype(np.float32)
    query /= np.linalg.norm(query)
    brute = np.argsort(-(emb @ query), kind="stable")[:50]
    rows, scores = DenseIndex(emb).search(query, 50)
    assert rows.tolist() == brute.tolist()
    np.testing.assert_allclose(scores, (emb @ query)[brute], rtol=1e-6)
    approx_rows, _ = DenseIndex(emb, approximate=True).search(query, 50)
    assert len(set(approx_rows.tolist()) & set(brute.tolist())) >= 45


def test_dense_scores_a_unit_by_its_best_sentence_exactly_and_through_hnsw() -> None:
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(500, 16)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    owners = np.array([3, 3, 7, 40, 40, 40])
    sentences = rng.normal(size=(len(owners), 16)).astype(np.float32)
    sentences /= np.linalg.norm(sentences, axis=1, keepdims=True)
    query = sentences[4]
    best = emb @ query
    for owner, vector in zip(owners, sentences):
        best[owner] = max(best[owner], vector @ query)
    index = DenseIndex(emb, sentences, owners)
    np.testing.assert_allclose(index.similarities(query), best, rtol=1e-6)
    np.testing.assert_allclose(index.similarities(query, np.array([40, 2])), best[[40, 2]], rtol=1e-6)
    rows, scores = index.search(query, 20)
    assert rows[0] == 40 and scores[0] == pytest.approx(1.0, abs=1e-5)
    assert rows.tolist() == np.argsort(-best, kind="stable")[:20].tolist()
    approx_rows, approx_scores = DenseIndex(emb, sentences, owners, approximate=True).search(query, 20)
    assert approx_rows[0] == 40 and len(set(approx_rows.tolist())) == len(approx_rows) == 20
    assert len(set(approx_rows.tolist()) & set(rows.tolist())) >= 18


def test_fact_sentences_keep_the_speaker_label_and_skip_single_sentences() -> None:
    assert fact_sentences("Caroline: I went to a support group. It was so powerful!") == [
        "Caroline: I went to a support group.", "Caroline: It was so powerful!"]
    assert fact_sentences("Melanie painted a sunrise. She shared it with Caroline.") == [
        "Melanie painted a sunrise.", "She shared it with Caroline."]
    assert fact_sentences("Caroline: Hey Mel!") == [] and fact_sentences("One fact only.") == []


def test_top_n_orders_ties_by_tiebreak_and_keeps_positive_only() -> None:
    scores = np.array([0.5, 1.0, 0.5, 0.0, 0.5, 1.0], np.float32)
    assert top_n(scores, 3)[0].tolist() == [1, 5, 0]
    tiebreak = np.array([0, 0, 3, 0, 9, 1], np.float32)
    assert top_n(scores, 4, tiebreak.__getitem__)[0].tolist() == [5, 1, 4, 2]
    assert top_positive(scores, 10)[0].tolist() == [1, 5, 0, 2, 4]


def test_rrf_order_matches_hand_computation() -> None:
    ranked = {"bm25": [3, 1, 2], "dense": [1, 4], "attr": [2]}
    rows, scores = reciprocal_rank_fusion(ranked, kappa=60, n=3)
    expected = {1: 1 / 62 + 1 / 61, 2: 1 / 63 + 1 / 61, 3: 1 / 61, 4: 1 / 62}
    assert rows.tolist() == [1, 2, 3]
    np.testing.assert_allclose(scores, [expected[1], expected[2], expected[3]])
    assert reciprocal_rank_fusion({"a": [5, 6], "b": [6, 5]}, kappa=60, n=2)[0].tolist() == [5, 6]


def _scorer() -> AttributeScorer:
    units = [
        _unit("u0", fact=[TimeSpan("2023-05-07", "2023-05-07")]),
        _unit("u1", utterance="2023-06-10"),
        _unit("u2", fact=[TimeSpan("2022-01-01", "2022-12-31", "year")]),
        _unit("u3", utterance=None, serial=3),
    ]
    attrs = AttributeIndex(
        unit_index=np.array([0, 0, 1, 2, 3], np.int64),
        kind=np.array([0, 1, 0, 0, 1], np.int8),
        texts=["Caroline", "Boston", "Caroline's sister", "painting", "Boston"],
        embeddings=np.stack([_axis((0, 1)), _axis((1, 1)), _axis((0, 0.7), (2, 0.714)), _axis((3, 1)), _axis((1, 1))]),
    )
    return AttributeScorer(units, attrs, sem_threshold=0.60)


def test_s_elt_entity_threshold_location_and_averaging() -> None:
    scorer = _scorer()
    caroline = _axis((0, 1))[None, :]
    near_threshold = _axis((0, 0.59), (2, 0.807))[None, :]  # cosine 0.59 with "Caroline": below 0.60
    intent = QueryIntent(entities=["Caroline"])
    np.testing.assert_allclose(scorer.scores(intent, caroline, np.zeros((0, 4))), [1.0, 0.7, 0.0, 0.0], atol=1e-3)
    assert scorer.scores(intent, near_threshold, np.zeros((0, 4)))[0] == 0.0
    both = QueryIntent(entities=["Caroline"], locations=["Boston"])
    np.testing.assert_allclose(scorer.scores(both, caroline, _axis((1, 1))[None, :]), [1.0, 0.35, 0.0, 0.5], atol=1e-3)
    two_entities = QueryIntent(entities=["Caroline", "painting"])
    np.testing.assert_allclose(
        scorer.scores(two_entities, np.stack([_axis((0, 1)), _axis((3, 1))]), np.zeros((0, 4))), [0.5, 0.35, 0.5, 0.0], atol=1e-3
    )
    assert not scorer.scores(QueryIntent(), np.zeros((0, 4)), np.zeros((0, 4))).any()


def test_s_elt_time_overlap_fact_and_utterance() -> None:
    scorer = _scorer()
    empty = np.zeros((0, 4))
    may = QueryIntent(fact_times=[TimeSpan("2023-05-01", "2023-05-31", "month")])
    # u0 by its fact time; u1 (no fact time) by its utterance day, which is in June; u2's fact time is 2022
    assert scorer.scores(may, empty, empty).tolist() == [1.0, 0.0, 0.0, 0.0]
    june = QueryIntent(fact_times=[TimeSpan("2023-06-01", "2023-06-30", "month")])
    assert scorer.scores(june, empty, empty).tolist() == [0.0, 1.0, 0.0, 0.0]
    chat_on = QueryIntent(utterance_times=[TimeSpan("2023-05-08", "2023-05-08")])
    assert scorer.scores(chat_on, empty, empty).tolist() == [1.0, 0.0, 1.0, 0.0]
    with_entity = QueryIntent(entities=["Caroline"], fact_times=may.fact_times)
    np.testing.assert_allclose(scorer.scores(with_entity, _axis((0, 1))[None, :], empty), [1.0, 0.35, 0.0, 0.0], atol=1e-3)


def test_time_match_takes_each_item_at_its_granularity() -> None:
    units = [
        _unit("december", fact=[TimeSpan("2023-12-01", "2023-12-01", "month")]),  # "in December", written as its first day
        _unit("dec5", fact=[TimeSpan("2023-12-05", "2023-12-05", "day")]),
        _unit("week", fact=[TimeSpan("2023-12-20", "2023-12-20", "week")]),  # the week of Monday 18 December
        _unit("year", fact=[TimeSpan("2023-06-30", "2023-06-30", "year")]),
    ]
    attrs = AttributeIndex(unit_index=np.zeros(0, np.int64), kind=np.zeros(0, np.int8), texts=[], embeddings=np.zeros((0, 4), np.float32))
    scorer, empty = AttributeScorer(units, attrs), np.zeros((0, 4))

    def matched(*spans: str) -> list[str]:
        intent = QueryIntent(fact_times=[parse_date_range(s) for s in spans])
        return [u.id for u, score in zip(units, scorer.scores(intent, empty, empty)) if score == 1.0]

    assert matched("2023-12") == ["december", "dec5", "week", "year"]
    assert matched("2023-12-25") == ["december", "year"]  # another day of the month misses the day fact
    assert matched("2023-12-05") == ["december", "dec5", "year"]
    assert matched("2023-12-18..2023-12-19") == ["december", "week", "year"]
    assert matched("2023-12-16..2023-12-17") == ["december", "year"]  # two days are not widened to their week
    assert matched("2024-01") == []


def test_rule_intent_names_and_times() -> None:
    intent = parse_intent_rules('When did Caroline go to the LGBTQ support group in May 2023 with "Pride Club"?', "2023-10-01")
    assert intent.entities == ["Pride Club", "Caroline", "LGBTQ"]
    assert [(s.start, s.end) for s in intent.fact_times] == [("2023-05-01", "2023-05-31")]
    ahead = parse_intent_rules("When is Caroline flying to Japan in December?", "2023-01-20")
    assert [(s.start, s.end) for s in ahead.fact_times] == [("2023-12-01", "2023-12-31")]
    back = parse_intent_rules("What did Caroline do in December?", "2023-01-20")
    assert [(s.start, s.end) for s in back.fact_times] == [("2022-12-01", "2022-12-31")]
    said = parse_intent_rules("What did Melanie say in our chat yesterday?", "2023-10-01")
    assert said.entities == ["Melanie"] and not said.fact_times
    assert [(s.start, s.end) for s in said.utterance_times] == [("2023-09-30", "2023-09-30")]
    assert parse_intent_rules("what happened?", None).entities == []


def test_llm_intent_output_dates_and_question_day() -> None:
    output = IntentOutput(entities=["Caroline", "caroline", " "], locations=["Paris"],
                          time=IntentTime(fact=["2023-05-01..2023-05-31", "2023-10-01", "not a date"], utterance=["2023-06"]))
    intent = intent_from_output(output, "What did Caroline do in Paris?", "2023-10-01")
    assert intent.entities == ["Caroline"] and intent.locations == ["Paris"] and intent.parser == "llm"
    assert [(s.start, s.end) for s in intent.fact_times] == [("2023-05-01", "2023-05-31")]  # the question's own day is dropped
    assert [(s.start, s.end) for s in intent.utterance_times] == [("2023-06-01", "2023-06-30")]
    kept = intent_from_output(output, "What did Caroline do today?", "2023-10-01")
    assert ("2023-10-01", "2023-10-01") in [(s.start, s.end) for s in kept.fact_times]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2023-05-07", ("2023-05-07", "2023-05-07", "day")),
        ("2023-12", ("2023-12-01", "2023-12-31", "month")),
        ("2023..2024-02", ("2023-01-01", "2024-02-29", "month")),
        ("2023-01-14..2023-01-15", ("2023-01-14", "2023-01-15", "day")),
        ("May", None),
    ],
)
def test_parse_date_range(text: str, expected: tuple[str, str, str] | None) -> None:
    span = parse_date_range(text)
    assert (span.start, span.end, span.granularity) == expected if expected else span is None
