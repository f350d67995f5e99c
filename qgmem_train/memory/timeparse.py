"""Dates: session times from dataset formats, and fact times resolved by rules against an utterance time.

The rule-based resolver serves the turns mode directly and checks the LLM's stage-2 time items: a
relative expression ("yesterday", "last weekend", "3 weeks ago") is resolved against the unit's own
utterance time into a closed date interval; vague recency ("recently", "the other day") gives nothing.
Intervals are always full dates (``YYYY-MM-DD``) so that retrieval compares them as closed intervals.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from qgmem_train.memory.types import TimeSpan

_SESSION_FORMATS = (
    "%I:%M %p on %d %B, %Y",  # LoCoMo: "1:56 pm on 8 May, 2023"
    "%I:%M %p on %d %b, %Y",
    "%B-%d-%Y",  # BEAM: "March-15-2024"
    "%b-%d-%Y",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
    "%d %B %Y",
    "%d %B, %Y",
    "%B %d, %Y",
)


def parse_session_time(text: str) -> str | None:
    """ISO form of a dataset's session time (date, or date and time when one is given); None if unknown."""
    cleaned = " ".join(str(text).strip().split())
    for fmt in _SESSION_FORMATS:
        try:
            parsed = datetime.strptime(cleaned, fmt)
        except ValueError:
            continue
        has_clock = "%H" in fmt or "%I" in fmt
        return parsed.isoformat(timespec="seconds") if has_clock else parsed.date().isoformat()
    return None


def utterance_date(utterance_time: str | None) -> date | None:
    """The calendar day of an ISO utterance time."""
    if not utterance_time:
        return None
    try:
        return date.fromisoformat(utterance_time[:10])
    except ValueError:
        return None


def day_span(day: date) -> TimeSpan:
    """A one-day interval."""
    return TimeSpan(day.isoformat(), day.isoformat(), "day")


def month_span(year: int, month: int) -> TimeSpan:
    """A calendar month as a closed interval."""
    last = calendar.monthrange(year, month)[1]
    return TimeSpan(date(year, month, 1).isoformat(), date(year, month, last).isoformat(), "month")


def year_span(year: int) -> TimeSpan:
    """A calendar year as a closed interval."""
    return TimeSpan(f"{year:04d}-01-01", f"{year:04d}-12-31", "year")


def week_span(monday: date) -> TimeSpan:
    """Monday to Sunday as a closed interval."""
    return TimeSpan(monday.isoformat(), (monday + timedelta(days=6)).isoformat(), "week")


_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "couple of": 2,
}
_MONTH_RE = "|".join(sorted(_MONTHS, key=len, reverse=True))
_NUMBER_RE = r"\d+|" + "|".join(sorted((re.escape(k) for k in _NUMBERS), key=len, reverse=True))
_VAGUE = re.compile(
    r"\b(recently|lately|the other day|a while ago|a while back|some time ago|sometime ago|in the past|"
    r"a few (?:days|weeks|months|years) ago|ages ago|back in the day)\b",
    re.IGNORECASE,
)

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("iso", re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")),
    ("day_month_year", re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH_RE})\.?,?\s+(\d{{4}})\b", re.I)),
    ("month_day_year", re.compile(rf"\b({_MONTH_RE})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I)),
    ("month_year", re.compile(rf"\b({_MONTH_RE})\.?,?\s+(\d{{4}})\b", re.I)),
    ("ago", re.compile(rf"\b({_NUMBER_RE})\s+(day|week|month|year)s?\s+ago\b", re.I)),
    ("relative", re.compile(r"\b(yesterday|today|tonight|tomorrow|this morning|this afternoon|this evening|last night)\b", re.I)),
    ("last_unit", re.compile(r"\b(last|this|next|past)\s+(weekend|week|month|year)\b", re.I)),
    ("last_weekday", re.compile(r"\b(last|this past|on)\s+(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b", re.I)),
    ("in_month", re.compile(rf"\b(?:in|last|this past)\s+({_MONTH_RE})\b(?!\s+\d)", re.I)),
    ("in_year", re.compile(r"\b(?:in|since|during|back in)\s+((?:19|20)\d{2})\b", re.I)),
]


@dataclass
class Resolution:
    """Spans found in a text, and whether the text only spoke of vague recency."""

    spans: list[TimeSpan] = field(default_factory=list)
    vague: bool = False


def _shift_months(day: date, months: int) -> tuple[int, int]:
    index = day.year * 12 + (day.month - 1) - months
    return index // 12, index % 12 + 1


def _resolve_match(kind: str, m: re.Match[str], ref: date | None) -> TimeSpan | None:
    """One matched expression to a span; relative kinds need the reference day ``ref``."""
    if kind == "iso":
        try:
            return day_span(date(int(m[1]), int(m[2]), int(m[3])))
        except ValueError:
            return None
    if kind in {"day_month_year", "month_day_year"}:
        day, month = (m[1], m[2]) if kind == "day_month_year" else (m[2], m[1])
        try:
            return day_span(date(int(m[3]), _MONTHS[month.lower()], int(day)))
        except ValueError:
            return None
    if kind == "month_year":
        return month_span(int(m[2]), _MONTHS[m[1].lower()])
    if kind == "in_year":
        return year_span(int(m[1]))
    if ref is None:
        return None
    if kind == "ago":
        count = int(m[1]) if m[1].isdigit() else _NUMBERS[m[1].lower()]
        unit = m[2].lower()
        if unit == "day":
            return day_span(ref - timedelta(days=count))
        if unit == "week":
            past = ref - timedelta(weeks=count)
            return week_span(past - timedelta(days=past.weekday()))
        if unit == "month":
            return month_span(*_shift_months(ref, count))
        return year_span(ref.year - count)
    if kind == "relative":
        word = m[1].lower()
        offset = {"yesterday": -1, "last night": -1, "tomorrow": 1}.get(word, 0)
        return day_span(ref + timedelta(days=offset))
    if kind == "last_unit":
        which, unit = m[1].lower(), m[2].lower()
        step = {"last": -1, "past": -1, "this": 0, "next": 1}[which]
        monday = ref - timedelta(days=ref.weekday())
        if unit == "weekend":
            saturday = monday + timedelta(days=5 + 7 * step)
            return TimeSpan(saturday.isoformat(), (saturday + timedelta(days=1)).isoformat(), "week")
        if unit == "week":
            return week_span(monday + timedelta(weeks=step))
        if unit == "month":
            return month_span(*_shift_months(ref, -step))
        return year_span(ref.year + step)
    if kind == "last_weekday":
        target = _WEEKDAYS[m[2].lower()]
        back = (ref.weekday() - target) % 7 or 7
        return day_span(ref - timedelta(days=back))
    if kind == "in_month":
        month = _MONTHS[m[1].lower()]
        year = ref.year if month <= ref.month else ref.year - 1
        return month_span(year, month)
    return None


def resolve_time_expressions(text: str, utterance_time: str | None) -> Resolution:
    """Fact-time spans of the time expressions in ``text``, resolved against ``utterance_time``.

    Explicit dates resolve without a reference; relative ones need the utterance day. Overlapping
    matches keep the earliest, longest one. Vague recency sets ``vague`` and yields no span.
    """
    ref = utterance_date(utterance_time)
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, TimeSpan]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if any(m.start() < end and start < m.end() for start, end in taken):
                continue
            span = _resolve_match(kind, m, ref)
            if span is not None:
                taken.append((m.start(), m.end()))
                found.append((m.start(), span))
    spans: list[TimeSpan] = []
    for _, span in sorted(found, key=lambda item: item[0]):
        if span not in spans:
            spans.append(span)
    return Resolution(spans=spans, vague=not spans and bool(_VAGUE.search(text)))


def _expand(value: str, end: bool) -> tuple[date, str] | None:
    """``YYYY-MM-DD``, ``YYYY-MM`` or ``YYYY`` to the first (or last) day it covers, with its granularity."""
    value = value.strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return date.fromisoformat(value), "day"
        if re.fullmatch(r"\d{4}-\d{2}", value):
            year, month = int(value[:4]), int(value[5:])
            day = calendar.monthrange(year, month)[1] if end else 1
            return date(year, month, day), "month"
        if re.fullmatch(r"\d{4}", value):
            return date(int(value), 12 if end else 1, 31 if end else 1), "year"
    except ValueError:
        return None
    return None


def normalize_time_item(start: str, end: str, granularity: str) -> TimeSpan | None:
    """An LLM time item as a closed full-date interval; None when a bound is not a date."""
    lo, hi = _expand(start, end=False), _expand(end or start, end=True)
    if lo is None or hi is None:
        return None
    if lo[0] > hi[0]:
        lo, hi = _expand(end, end=False), _expand(start, end=True)
        if lo is None or hi is None:
            return None
    return TimeSpan(lo[0].isoformat(), hi[0].isoformat(), granularity)


def fact_time(evidence_text: str, utterance_time: str | None, llm_items: list[TimeSpan] | None = None) -> list[TimeSpan]:
    """Dual-time rule: the unit's fact time from its evidence, checked against the LLM's items.

    Expressions the rules resolve win (they are exact); vague recency gives no time; otherwise the
    LLM's normalised items are kept, except a bare copy of the utterance day, which the prompt forbids.
    """
    resolution = resolve_time_expressions(evidence_text, utterance_time)
    if resolution.spans or resolution.vague:
        return resolution.spans
    ref = utterance_date(utterance_time)
    copied = day_span(ref) if ref else None
    return [item for item in (llm_items or []) if item != copied]
