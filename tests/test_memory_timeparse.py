"""Dual time: session dates of every dataset, and fact times resolved against the utterance time."""

from __future__ import annotations

import pytest

from qgmem_train.memory.timeparse import fact_time, normalize_time_item, parse_session_time, resolve_time_expressions
from qgmem_train.memory.types import TimeSpan

SAID = "2023-01-20T13:56:00"  # a Friday


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("1:56 pm on 8 May, 2023", "2023-05-08T13:56:00"),
        ("10:37 am on 27 June, 2023", "2023-06-27T10:37:00"),
        ("March-15-2024", "2024-03-15"),
        ("2024-04-15", "2024-04-15"),
        ("2024-03-02T18:30:00", "2024-03-02T18:30:00"),
        ("next Tuesday-ish", None),
    ],
)
def test_session_times_of_every_dataset(text: str, iso: str | None) -> None:
    assert parse_session_time(text) == iso


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("I went to the hospital yesterday.", [("2023-01-19", "2023-01-19", "day")]),
        ("We went camping last weekend!", [("2023-01-14", "2023-01-15", "week")]),
        ("I started a new job last week", [("2023-01-09", "2023-01-15", "week")]),
        ("We moved last month", [("2022-12-01", "2022-12-31", "month")]),
        ("I painted that lake sunrise last year", [("2022-01-01", "2022-12-31", "year")]),
        ("I adopted him 3 days ago", [("2023-01-17", "2023-01-17", "day")]),
        ("two weeks ago I ran a marathon", [("2023-01-02", "2023-01-08", "week")]),
        ("last Friday was fun", [("2023-01-13", "2023-01-13", "day")]),
        ("the show on 8 May, 2023 was great", [("2023-05-08", "2023-05-08", "day")]),
        ("since May 2021", [("2021-05-01", "2021-05-31", "month")]),
        ("back in 2019", [("2019-01-01", "2019-12-31", "year")]),
        ("I saw it today and yesterday", [("2023-01-20", "2023-01-20", "day"), ("2023-01-19", "2023-01-19", "day")]),
    ],
)
def test_relative_and_explicit_expressions_resolve_against_the_utterance_time(text: str, spans: list[tuple[str, str, str]]) -> None:
    resolution = resolve_time_expressions(text, SAID)
    assert resolution.spans == [TimeSpan(*s) for s in spans]
    assert not resolution.vague


@pytest.mark.parametrize("text", ["I did it recently", "Lately I paint a lot", "I saw her the other day", "That was a while ago", "a few weeks ago"])
def test_vague_recency_gives_no_fact_time(text: str) -> None:
    resolution = resolve_time_expressions(text, SAID)
    assert resolution.spans == [] and resolution.vague
    assert fact_time(text, SAID, [TimeSpan("2023-01-10", "2023-01-10", "day")]) == []


def test_relative_expressions_need_an_utterance_time() -> None:
    assert resolve_time_expressions("I went there yesterday", None).spans == []
    assert resolve_time_expressions("on 8 May, 2023", None).spans == [TimeSpan("2023-05-08", "2023-05-08", "day")]


def test_llm_time_items_are_normalised_to_closed_date_intervals() -> None:
    assert normalize_time_item("2023-05", "2023-05", "month") == TimeSpan("2023-05-01", "2023-05-31", "month")
    assert normalize_time_item("2024", "2024", "year") == TimeSpan("2024-01-01", "2024-12-31", "year")
    assert normalize_time_item("2023-02-10", "2023-02-03", "week") == TimeSpan("2023-02-03", "2023-02-10", "week")
    assert normalize_time_item("last week", "", "week") is None
    assert normalize_time_item("2023-02-30", "2023-02-30", "day") is None


def test_rules_repair_llm_time_items() -> None:
    wrong = [TimeSpan("2023-01-20", "2023-01-20", "day")]
    assert fact_time("Caroline: I went to a support group yesterday", SAID, wrong) == [TimeSpan("2023-01-19", "2023-01-19", "day")]
    assert fact_time("Caroline: I love painting", SAID, wrong) == []  # a bare copy of the utterance day is not a fact time
    kept = [TimeSpan("2022-06-01", "2022-06-30", "month")]
    assert fact_time("Caroline: I moved from Sweden", SAID, kept) == kept
