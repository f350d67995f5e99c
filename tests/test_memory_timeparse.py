"""Dual time: session dates of every dataset, and fact times resolved with tense against the utterance time."""

from __future__ import annotations

import pytest

from qgmem_train.llm.schemas import TimeItem, UnitIndex
from qgmem_train.memory.extraction import apply_index
from qgmem_train.memory.timeparse import calendar_bounds, fact_time, normalize_time_item, parse_session_time, resolve_time_expressions
from qgmem_train.memory.types import MemoryUnit, TimeSpan

SAID = "2023-01-20T13:56:00"  # a Friday
FRI = SAID
SAT = "2023-01-21"
MON = "2023-05-08T13:56:00"  # a Monday in May (LoCoMo's first session)
JAN = "2024-01-15"  # a Monday in January
DEC = "2023-12-28"  # a Thursday at the end of the year


def day(iso: str) -> tuple[str, str, str]:
    return iso, iso, "day"


def month(ym: str, last: int) -> tuple[str, str, str]:
    return f"{ym}-01", f"{ym}-{last:02d}", "month"


def year(y: int) -> tuple[str, str, str]:
    return f"{y}-01-01", f"{y}-12-31", "year"


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


FUTURE = [
    ("I'm flying to Japan in December", FRI, [month("2023-12", 31)]),
    ("Flying to Japan in December!", FRI, [month("2023-12", 31)]),
    ("See you on Monday!", FRI, [day("2023-01-23")]),
    ("I'll visit my parents next month", FRI, [month("2023-02", 28)]),
    ("We're going camping this weekend", FRI, [("2023-01-21", "2023-01-22", "day")]),
    ("Let's meet next weekend", FRI, [("2023-01-28", "2023-01-29", "day")]),
    ("I will retire next year", FRI, [year(2024)]),
    ("The race is in two weeks", FRI, [("2023-01-30", "2023-02-05", "week")]),
    ("My sister arrives in 3 days", FRI, [day("2023-01-23")]),
    ("We move in a month", FRI, [month("2023-02", 28)]),
    ("I have a dentist appointment tomorrow", FRI, [day("2023-01-21")]),
    ("the day after tomorrow", FRI, [day("2023-01-22")]),
    ("a week from now", FRI, [("2023-01-23", "2023-01-29", "week")]),
    ("Dinner next Friday?", FRI, [day("2023-01-27")]),
    ("I have a meeting on Tuesday", FRI, [day("2023-01-24")]),  # no tense cue: the coming one
    ("My birthday is in July", MON, [month("2023-07", 31)]),  # no tense cue: the coming one
    ("I'm going to Paris in July", MON, [month("2023-07", 31)]),
    ("We will go to Rome in March", MON, [month("2024-03", 31)]),
    ("I'll be in London in May", MON, [month("2023-05", 31)]),  # the current month is still to come
    ("I start school next January", JAN, [month("2025-01", 31)]),
    ("We're planning a trip in December", JAN, [month("2024-12", 31)]),
    ("tickets for the upcoming festival in December", JAN, [month("2024-12", 31)]),
    ("The wedding is on March 12th", MON, [day("2024-03-12")]),
    ("We're moving on June 1st", MON, [day("2023-06-01")]),
    ("I'm relaxing this weekend", SAT, [("2023-01-21", "2023-01-22", "day")]),
    ("Can't wait for our trip in January!", DEC, [month("2024-01", 31)]),
    ("I'm getting married in June", JAN, [month("2024-06", 30)]),
]

PAST = [
    ("We went to Japan in December", FRI, [month("2022-12", 31)]),
    ("I saw her on Monday", FRI, [day("2023-01-16")]),
    ("I ran a marathon last January", JAN, [month("2023-01", 31)]),
    ("We went skiing in January", JAN, [month("2024-01", 31)]),  # the current month has begun
    ("We took a trip in December", JAN, [month("2023-12", 31)]),
    ("What did Caroline do in December?", JAN, [month("2023-12", 31)]),
    ("I went hiking last weekend", FRI, [("2023-01-14", "2023-01-15", "day")]),
    ("We went camping this weekend", MON, [("2023-05-06", "2023-05-07", "day")]),
    ("We moved last month", FRI, [month("2022-12", 31)]),
    ("I painted that lake sunrise last year", FRI, [year(2022)]),
    ("I started a new job last week", FRI, [("2023-01-09", "2023-01-15", "week")]),
    ("I adopted him 3 days ago", FRI, [day("2023-01-17")]),
    ("two weeks ago I ran a marathon", FRI, [("2023-01-02", "2023-01-08", "week")]),
    ("last Friday was fun", FRI, [day("2023-01-13")]),
    ("I met him this Wednesday", FRI, [day("2023-01-18")]),
    ("I went to the hospital yesterday", MON, [day("2023-05-07")]),
    ("the day before yesterday", FRI, [day("2023-01-18")]),
    ("I got married on 12 March", MON, [day("2023-03-12")]),
    ("I visited Rome on 10 June", MON, [day("2022-06-10")]),
    ("In March the weather was great", MON, [month("2023-03", 31)]),  # the cue follows the expression
    ("I've been painting since June", MON, [month("2022-06", 30)]),
]

EXPLICIT_AND_MIXED = [
    ("the show on 8 May, 2023 was great", FRI, [day("2023-05-08")]),
    ("since May 2021", FRI, [month("2021-05", 31)]),
    ("back in 2019", FRI, [year(2019)]),
    ("we signed on 2023-03-02", FRI, [day("2023-03-02")]),
    ("I saw it today and yesterday", FRI, [day("2023-01-20"), day("2023-01-19")]),
    ("I went to the hospital yesterday and next month I'm starting a new job", FRI, [day("2023-01-19"), month("2023-02", 28)]),
    ("I loved Paris, and in December we'll go back", MON, [month("2023-12", 31)]),
    ("We went to Paris in June and we're going back in December", MON, [month("2022-06", 30), month("2023-12", 31)]),
    ("What did Joanna show on the Sunday before October 25, 2022?", FRI, [day("2022-10-23")]),
    ("They planned a hike for the Saturday after 28 October 2023", FRI, [day("2023-11-04")]),
    ("We met on May 2 at the park", MON, [day("2023-05-02")]),
]


@pytest.mark.parametrize(("text", "said", "spans"), FUTURE + PAST + EXPLICIT_AND_MIXED)
def test_expressions_resolve_with_tense_and_direction(text: str, said: str, spans: list[tuple[str, str, str]]) -> None:
    resolution = resolve_time_expressions(text, said)
    assert resolution.spans == [TimeSpan(*s) for s in spans]
    assert not resolution.vague


@pytest.mark.parametrize("text", ["Mondays are hard", "every Friday I swim", "I may call you 2 times", "I have 3 cats"])
def test_habits_and_the_modal_may_give_no_date(text: str) -> None:
    resolution = resolve_time_expressions(text, FRI)
    assert resolution.spans == [] and not resolution.vague


@pytest.mark.parametrize(
    "text", ["I did it recently", "Lately I paint a lot", "I saw her the other day", "That was a while ago", "a few weeks ago", "in a few weeks"]
)
def test_vague_recency_gives_no_fact_time(text: str) -> None:
    resolution = resolve_time_expressions(text, SAID)
    assert resolution.spans == [] and resolution.vague
    assert fact_time(text, SAID, [TimeSpan("2023-01-10", "2023-01-10", "day")]) == []


def test_relative_expressions_need_an_utterance_time() -> None:
    assert resolve_time_expressions("I went there yesterday", None).spans == []
    assert resolve_time_expressions("I'm flying to Japan in December", None).spans == []
    assert resolve_time_expressions("on 8 May, 2023", None).spans == [TimeSpan("2023-05-08", "2023-05-08", "day")]


def test_llm_time_items_are_normalised_to_closed_date_intervals() -> None:
    assert normalize_time_item("2023-05", "2023-05", "month") == TimeSpan("2023-05-01", "2023-05-31", "month")
    assert normalize_time_item("2024", "2024", "year") == TimeSpan("2024-01-01", "2024-12-31", "year")
    assert normalize_time_item("2023-02-10", "2023-02-03", "week") == TimeSpan("2023-02-03", "2023-02-10", "week")
    assert normalize_time_item("last week", "", "week") is None
    assert normalize_time_item("2023-02-30", "2023-02-30", "day") is None
    # without a stated granularity, the finer precision of the written bounds
    assert normalize_time_item("2023", "2024-02").granularity == "month"
    assert normalize_time_item("2023-01-14", "2023-01-15").granularity == "day"


def test_rules_fill_what_the_llm_left_empty_and_keep_what_it_found() -> None:
    wrong = [TimeSpan("2023-01-20", "2023-01-20", "day")]  # a bare copy of the utterance day is not a fact time
    assert fact_time("Caroline: I went to a support group yesterday", SAID, wrong) == [TimeSpan(*day("2023-01-19"))]
    assert fact_time("Caroline: I love painting", SAID, wrong) == []
    kept = [TimeSpan("2022-06-01", "2022-06-30", "month")]
    assert fact_time("Caroline: I moved from Sweden", SAID, kept) == kept


def test_agreeing_items_keep_the_more_specific_one() -> None:
    christmas = [TimeSpan(*day("2023-12-24"))]
    assert fact_time("We're flying to Japan in December", SAID, christmas) == christmas
    assert fact_time("I went there yesterday", SAID, [TimeSpan(*month("2023-01", 31))]) == [TimeSpan(*day("2023-01-19"))]
    assert fact_time("I'm flying to Japan in December", SAID, [TimeSpan(*month("2023-12", 31))]) == [TimeSpan(*month("2023-12", 31))]


def test_disagreeing_items_go_to_the_more_specific_then_to_a_stated_direction() -> None:
    # equal specificity: a rule with a stated direction ("last") beats the LLM's item
    assert fact_time("I ran a marathon last January", JAN, [TimeSpan(*month("2024-01", 31))]) == [TimeSpan(*month("2023-01", 31))]
    # equal specificity: a rule whose direction was only inferred (no cue: the coming July) yields
    llm_july = [TimeSpan(*month("2022-07", 31))]
    assert fact_time("The conference in July", MON, llm_july) == llm_july
    # a more specific item wins whichever side it is on
    llm_day = [TimeSpan(*day("2022-11-15"))]
    assert fact_time("We went there last month", SAID, llm_day) == llm_day
    assert fact_time("I went there yesterday", SAID, [TimeSpan(*month("2022-11", 30))]) == [TimeSpan(*day("2023-01-19"))]


def _turn_unit(uid: str, fact: str, evidence: str, said: str = SAID) -> MemoryUnit:
    return MemoryUnit(uid, "s1", fact, "Caroline", "p", "o", ["D1:3"], evidence, said, 0)


def test_each_unit_takes_the_expressions_of_its_own_text() -> None:
    evidence = "Caroline: I went to a support group yesterday, and next month I'm starting a new job at the clinic."
    group = _turn_unit("D1:3#0", "Caroline went to an LGBTQ support group.", evidence)
    job = _turn_unit("D1:3#1", "Caroline is starting a new job at a clinic.", evidence)
    stated = _turn_unit("D1:3#2", "Caroline will start the job in February 2023.", evidence)
    for unit in (group, job, stated):
        apply_index(unit, UnitIndex(memory_unit_id=unit.id))
    assert group.fact_time == [TimeSpan(*day("2023-01-19"))]
    assert job.fact_time == [TimeSpan(*month("2023-02", 28))]
    assert stated.fact_time == [TimeSpan(*month("2023-02", 28))]
    llm = _turn_unit("D1:3#3", "Caroline is starting a new job at a clinic.", evidence)
    apply_index(llm, UnitIndex(memory_unit_id=llm.id, time=[TimeItem(start="2023-02-01", end="2023-02-01", granularity="day")]))
    assert llm.fact_time == [TimeSpan(*day("2023-02-01"))]  # agrees with "next month" and is more specific


def test_a_unit_whose_clause_holds_no_expression_gets_none() -> None:
    evidence = "Caroline: I went to a support group yesterday. I love painting sunsets."
    painting = _turn_unit("D1:3#1", "Caroline loves painting sunsets.", evidence)
    apply_index(painting, None)
    assert painting.fact_time == []


@pytest.mark.parametrize(
    ("span", "bounds"),
    [
        (TimeSpan("2023-12-05", "2023-12-05", "month"), ("2023-12-01", "2023-12-31")),
        (TimeSpan("2023-01-18", "2023-01-18", "week"), ("2023-01-16", "2023-01-22")),
        (TimeSpan("2023-03-10", "2023-05-02", "year"), ("2023-01-01", "2023-12-31")),
        (TimeSpan("2023-01-14", "2023-01-15", "day"), ("2023-01-14", "2023-01-15")),
        (TimeSpan("2023-01-14", "2023-01-15", "vague"), ("2023-01-14", "2023-01-15")),
    ],
)
def test_calendar_bounds_cover_whole_periods_of_the_granularity(span: TimeSpan, bounds: tuple[str, str]) -> None:
    lo, hi = calendar_bounds(span)
    assert (lo.isoformat(), hi.isoformat()) == bounds
