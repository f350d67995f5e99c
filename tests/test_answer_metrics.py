"""Token F1, BLEU-1 and exact match against hand-computed cases (LoCoMo normalisation; nltk's BLEU-1)."""

from __future__ import annotations

import math

import pytest

from qgmem_train.metrics.answers import answer_scores, bleu1, token_f1


def test_punctuation_case_and_articles_are_normalised_away() -> None:
    # "Paris!" and "paris" both normalise to "paris": one token, all of it shared.
    assert answer_scores("Paris!", "paris") == {"f1": 1.0, "bleu1": 1.0, "exact_match": 1.0}
    # "The red car" -> "red car", "a red car." -> "red car".
    assert answer_scores("The red car", "a red car.") == {"f1": 1.0, "bleu1": 1.0, "exact_match": 1.0}


def test_partial_overlap() -> None:
    # prediction "On 7 May, 2023." -> [on, 7, may, 2023]; reference "7 May 2023" -> [7, may, 2023].
    # shared 3: precision 3/4, recall 3/3, F1 = 2 * 3/4 * 1 / (3/4 + 1) = 6/7.
    # BLEU-1: clipped unigram precision 3/4; candidate (4) longer than reference (3), so no brevity penalty.
    scores = answer_scores("On 7 May, 2023.", "7 May 2023")
    assert scores["f1"] == pytest.approx(6 / 7) and scores["bleu1"] == pytest.approx(0.75) and scores["exact_match"] == 0.0


def test_repeated_tokens_count_as_a_multiset() -> None:
    # prediction [cat, cat, cat], reference [cat, dog]: the shared multiset is {cat: min(3, 1) = 1}.
    # precision 1/3, recall 1/2, F1 = 2 * (1/3 * 1/2) / (1/3 + 1/2) = (1/3) / (5/6) = 2/5.
    assert token_f1("cat cat cat", "cat dog") == pytest.approx(0.4)
    # BLEU-1 clips the three cats to the reference's one: 1/3; candidate 3 > reference 2, BP = 1.
    assert bleu1("cat cat cat", "cat dog") == pytest.approx(1 / 3)


def test_brevity_penalty_on_a_short_prediction() -> None:
    # prediction [red, car], reference [big, red, car]: unigram precision 2/2 = 1,
    # candidate length c = 2 <= reference length r = 3, so BP = exp(1 - r/c) = exp(1 - 3/2) = exp(-0.5) ~ 0.60653.
    assert bleu1("red car", "big red car") == pytest.approx(math.exp(-0.5))
    assert bleu1("red car", "big red car") == pytest.approx(0.60653066)
    # F1: precision 1, recall 2/3, F1 = 2 * (2/3) / (5/3) = 0.8.
    assert token_f1("red car", "big red car") == pytest.approx(0.8)
    # equal lengths: BP = exp(0) = 1, precision 1/2 ([red, bus] vs [red, car]).
    assert bleu1("red bus", "red car") == pytest.approx(0.5)


def test_empty_prediction_reference_or_both() -> None:
    # An empty prediction (or one that normalises to nothing, "The.") shares nothing: 0 everywhere.
    assert answer_scores("", "Paris") == {"f1": 0.0, "bleu1": 0.0, "exact_match": 0.0}
    assert answer_scores("The.", "Paris") == {"f1": 0.0, "bleu1": 0.0, "exact_match": 0.0}
    # An empty reference with a non-empty prediction: 0 everywhere.
    assert answer_scores("Paris", "  ") == {"f1": 0.0, "bleu1": 0.0, "exact_match": 0.0}
    # Both empty after normalisation: they agree, so 1 everywhere (as exact match already says).
    assert answer_scores("", "a") == {"f1": 1.0, "bleu1": 1.0, "exact_match": 1.0}


def test_values_are_plain_floats() -> None:
    scores = answer_scores("red car", "big red car")
    assert set(scores) == {"f1", "bleu1", "exact_match"} and all(type(v) is float and 0.0 <= v <= 1.0 for v in scores.values())
