"""Dates: session times from dataset formats, and fact times resolved by rules against an utterance time.

Session times are kept as the wall-clock time written, without a zone: ``2024-03-02T18:30:00+02:00``,
``...Z`` and ``2024-03-02T18:30:00.250`` all become ``2024-03-02T18:30:00``. The day a speaker lives in is
what relative expressions ("yesterday") count from; converting to UTC could move it to another date.

The rule-based resolver serves the turns mode directly and is merged with the LLM's stage-2 time items:
a relative expression ("yesterday", "last weekend", "3 weeks ago", "in December") is resolved against the
unit's own utterance time into a closed date interval, forwards or backwards as the text points (a stated
last/this/next, else the tense of its clause); vague recency ("recently", "the other day") gives nothing.
Intervals are always full dates (``YYYY-MM-DD``) with a granularity (day, week, month, year): the
precision of their bounds, which :func:`calendar_bounds` widens to whole periods for matching.
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

_ISO_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?", re.IGNORECASE)
"""ISO 8601 date and time with optional seconds, fraction and zone (``Z`` or an offset)."""


def parse_session_time(text: str) -> str | None:
    """ISO form of a dataset's session time (date, or date and time when one is given); None if unknown.

    A zone or fraction of a second is accepted and dropped: the result is the wall-clock time as written.
    """
    cleaned = " ".join(str(text).strip().split())
    for fmt in _SESSION_FORMATS:
        try:
            parsed = datetime.strptime(cleaned, fmt)
        except ValueError:
            continue
        has_clock = "%H" in fmt or "%I" in fmt
        return parsed.isoformat(timespec="seconds") if has_clock else parsed.date().isoformat()
    if _ISO_DATETIME.fullmatch(cleaned):
        try:
            parsed = datetime.fromisoformat(cleaned.upper().replace(",", "."))
        except ValueError:
            return None
        return parsed.replace(tzinfo=None).isoformat(timespec="seconds")
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


def weekend_span(saturday: date) -> TimeSpan:
    """Saturday and Sunday: two days, each known to the day."""
    return TimeSpan(saturday.isoformat(), (saturday + timedelta(days=1)).isoformat(), "day")


def spoken_date(text: str) -> str:
    """``2023-05-08`` or ``2023-05-08T13:56:00`` as ``8 May 2023``; anything else (a month, a year, free text) unchanged."""
    try:
        day = date.fromisoformat(text[:10])
    except ValueError:
        return text
    return f"{day.day} {day:%B %Y}"


def spoken_span(span: TimeSpan) -> str:
    """A span in words, as dated answers write it: ``7 May 2023``, ``May 2023``, ``2022``, ``the week of 1 May 2023``;
    a span over several days, weeks, months or years as ``first..last`` of those."""
    lo, hi = calendar_bounds(span)
    if span.granularity == "year":
        parts = [str(lo.year), str(hi.year)]
    elif span.granularity == "month":
        parts = [f"{lo:%B %Y}", f"{hi:%B %Y}"]
    elif span.granularity == "week":
        parts = [f"the week of {spoken_date(d.isoformat())}" for d in (lo, hi - timedelta(days=6))]
    else:
        parts = [spoken_date(span.start), spoken_date(span.end)]
    return parts[0] if parts[0] == parts[1] else "..".join(parts)


def calendar_bounds(span: TimeSpan) -> tuple[date, date]:
    """The days ``span`` can mean at its granularity: whole weeks (Monday to Sunday), months or years
    from its start's to its end's; a ``day`` span, or one of another label (``vague``), as written."""
    lo, hi = date.fromisoformat(span.start[:10]), date.fromisoformat(span.end[:10])
    if span.granularity == "week":
        return lo - timedelta(days=lo.weekday()), hi + timedelta(days=6 - hi.weekday())
    if span.granularity == "month":
        return lo.replace(day=1), hi.replace(day=calendar.monthrange(hi.year, hi.month)[1])
    if span.granularity == "year":
        return date(lo.year, 1, 1), date(hi.year, 12, 31)
    return lo, hi


_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "couple of": 2,
}
_MONTH_RE = "|".join("(?-i:May)" if m == "may" else m for m in sorted(_MONTHS, key=len, reverse=True))
"""Month names and abbreviations; "May" only capitalised, so that the modal verb "may" is no date."""
_WEEKDAY_RE = "|".join(_WEEKDAYS)
_NUMBER_RE = r"\d+|" + "|".join(sorted((re.escape(k) for k in _NUMBERS), key=len, reverse=True))
_ORDINAL = r"(\d{1,2})(?:st|nd|rd|th)?"
_VAGUE = re.compile(
    r"\b(recently|lately|the other day|a while ago|a while back|some time ago|sometime ago|in the past|"
    r"a few (?:days|weeks|months|years) ago|in a few (?:days|weeks|months|years)|in the coming (?:days|weeks|months)|"
    r"ages ago|back in the day)\b",
    re.IGNORECASE,
)

_YEAR = r"(?:,\s*|\s+)(\d{4})\b"
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("weekday_around", re.compile(
        rf"\b(?:the\s+)?({_WEEKDAY_RE})\s+(before|after)\s+(?:{_ORDINAL}\s+(?:of\s+)?({_MONTH_RE})|({_MONTH_RE})\.?\s+{_ORDINAL}){_YEAR}",
        re.I)),
    ("iso", re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")),
    ("day_month_year", re.compile(rf"\b{_ORDINAL}\s+(?:of\s+)?({_MONTH_RE})\.?{_YEAR}", re.I)),
    ("month_day_year", re.compile(rf"\b({_MONTH_RE})\.?\s+{_ORDINAL}{_YEAR}", re.I)),
    ("month_year", re.compile(rf"\b({_MONTH_RE})\.?,?\s+(\d{{4}})\b", re.I)),
    ("ago", re.compile(rf"\b({_NUMBER_RE})\s+(day|week|month|year)s?\s+ago\b", re.I)),
    ("ahead", re.compile(rf"\bin\s+({_NUMBER_RE})\s+(day|week|month|year)s?\b", re.I)),
    ("ahead", re.compile(rf"\b({_NUMBER_RE})\s+(day|week|month|year)s?\s+from\s+(?:now|today)\b", re.I)),
    ("relative", re.compile(
        r"\b(the day before yesterday|the day after tomorrow|yesterday|today|tonight|tomorrow|this morning|"
        r"this afternoon|this evening|last night)\b", re.I)),
    ("unit", re.compile(r"\b(this past|this coming|last|this|next|past|coming)\s+(weekend|week|month|year)\b", re.I)),
    ("weekday", re.compile(
        rf"(?<!every\s)\b(?:(this past|this coming|last|this|next|coming|on)\s+)?({_WEEKDAY_RE})\b(?!s\b)(?!\s+(?:before|after)\b)"
        rf"(?!,?\s+(?:the\s+)?(?:\d|(?:{_MONTH_RE})\b))", re.I)),
    ("day_month", re.compile(rf"\b(?:the\s+)?{_ORDINAL}\s+(?:of\s+)?({_MONTH_RE})\b(?!\.?,?\s+\d)", re.I)),
    ("month_day", re.compile(rf"\b({_MONTH_RE})\.?\s+{_ORDINAL}\b(?!,?\s+\d)", re.I)),
    ("month", re.compile(
        rf"\b(?:(in|on|by|until|till|since|during|this past|this coming|this|next|last|coming)\s+)"
        rf"(?:(?:early|late|mid|the end of|end of|the beginning of|beginning of|the start of|start of)[\s-]+)?({_MONTH_RE})\b"
        rf"(?!\.?,?\s+\d)|\b(?:early|late|mid|the end of|end of|the beginning of|beginning of|the start of|start of)[\s-]+"
        rf"({_MONTH_RE})\b(?!\.?,?\s+\d)", re.I)),
    ("in_year", re.compile(r"\b(?:in|since|during|back in|by|until)\s+((?:19|20)\d{2})\b", re.I)),
]

_NOT_ING_VERBS = (
    "amazing|interesting|exciting|boring|inspiring|relaxing|challenging|fascinating|surprising|annoying|thrilling|"
    "stunning|charming|refreshing|overwhelming|rewarding|touching|heartwarming|amusing|encouraging|promising|"
    "satisfying|disappointing|frustrating|terrifying|worrying|confusing|tiring|exhausting|thing|something|nothing|"
    "anything|everything|morning|evening|wedding|building|painting|clothing|feeling|beginning|ending|spring|king|"
    "ring|sing|bring|string|swing|ceiling|during"
)
_NOT_ED_VERBS = (
    "excited|interested|scared|tired|supposed|scheduled|planned|booked|pleased|thrilled|worried|bored|amazed|"
    "delighted|stressed|prepared|hundred|sacred|naked|wicked|beloved"
)
_IRREGULAR_PAST = (
    "went|was|wasn't|were|weren't|had|did|didn't|got|came|saw|took|made|met|left|found|bought|brought|thought|"
    "told|said|felt|heard|held|kept|knew|lost|paid|sat|sent|spent|stood|taught|won|wore|wrote|drove|rode|flew|"
    "swam|sang|began|broke|chose|ate|drank|fell|forgot|grew|led|built|caught|fought|sold|slept|spoke|threw|woke|"
    "became|gave|ran"
)
_FUTURE_CUES = [
    r"\bwill\b", r"'ll\b", r"\bwon't\b", r"\bshall\b", r"\bgonna\b", r"\bwanna\b", r"\bgoing to\b", r"\babout to\b",
    r"\blooking forward\b", r"\bcan(?:'t|not| not) wait\b", r"\bupcoming\b", r"\bcoming up\b", r"\bsoon\b", r"\bnext\b",
    r"\btomorrow\b", r"\bsee you\b", r"\bscheduled\b", r"\bplan(?:s|ned|ning)?\s+(?:to|on)\b", r"\bplanning\b",
    r"\bhop(?:e|es|ing) to\b", r"\bwants? to\b", r"\bintends? to\b", r"\bwould (?:like|love) to\b",
    r"'d (?:like|love) to\b", r"\bexcited (?:to|for|about)\b", r"\b(?:flying|heading|leaving|travell?ing)\b",
    rf"(?:\b(?:am|is|are)|'m|'re|'s)\s+(?:(?:not|also|still|just|finally|really|[a-z]+ly)\s+)?"
    rf"(?!(?:{_NOT_ING_VERBS})\b)[a-z]+ing\b(?:\s+[a-z]+ed\b)?",
]
_PAST_CUES = [
    r"\bago\b", r"\byesterday\b", r"\blast\b", r"\bused to\b", r"\bbeen\b", r"\bsince\b",
    rf"\b(?:was|were)(?:\s+(?!(?:{_NOT_ING_VERBS})\b)[a-z]+ing\b)?",
    r"(?:\b(?:have|has|had)|'ve|'d)\s+(?:(?:just|already|never|finally|[a-z]+ly)\s+)?"
    r"(?:been|gone|done|seen|had|got|gotten|made|met|taken|given|known|[a-z]+ed)\b",
    rf"\b(?:{_IRREGULAR_PAST})\b",
    rf"\b(?!(?:{_NOT_ED_VERBS})\b)[a-z]{{2,}}(?<!e)ed\b",
]
_TENSE_CUE = re.compile(rf"(?P<future>{'|'.join(_FUTURE_CUES)})|(?P<past>{'|'.join(_PAST_CUES)})", re.I)
_CLAUSE_BREAK = re.compile(
    r"[.!?;]+(?:\s+|$)|\n+|,\s*(?=(?:and|but|so|because|though|although|while|whereas|then)\b)|\s+(?:but|whereas)\s+"
    r"|\s+and\s+(?=(?:in|on|at|next|last|this|then|i|we|he|she|they|you|it)\b)",
    re.I,
)

FUTURE, PAST, NO_TENSE = 1, -1, 0


def split_clauses(text: str) -> list[str]:
    """The clauses of ``text``: split at sentence ends, line breaks, semicolons and clause-joining conjunctions."""
    return [c.strip() for c in _CLAUSE_BREAK.split(text) if c and c.strip()]


def clause_tense(text: str, start: int, end: int) -> int:
    """Tense of the clause holding ``text[start:end]``: the nearest cue before it, else the nearest after it.

    Future cues: will/'ll, going to, plan to, upcoming, next, see you, a present progressive ("I'm flying",
    "we're moving") or a travel gerund ("Flying to Japan in December"). Past cues: did, went and other past
    forms, was/were, a perfect ("I've been"), -ed verbs, last, ago, since. :data:`NO_TENSE` without a cue.
    """
    lo, hi = 0, len(text)
    for brk in _CLAUSE_BREAK.finditer(text):
        if brk.end() <= start:
            lo = brk.end()
        elif brk.start() >= end:
            hi = brk.start()
            break
    before = after = NO_TENSE
    for cue in _TENSE_CUE.finditer(text, lo, hi):
        tense = FUTURE if cue.lastgroup == "future" else PAST
        if cue.end() <= start:
            before = tense
        elif cue.start() >= end and after == NO_TENSE:
            after = tense
    return before or after


@dataclass
class Resolution:
    """Spans found in a text, whether the text only spoke of vague recency, and which spans' direction
    (past or future) was inferred from tense or the default rather than stated."""

    spans: list[TimeSpan] = field(default_factory=list)
    vague: bool = False
    inferred: list[TimeSpan] = field(default_factory=list)


def _shift_months(day: date, months: int) -> tuple[int, int]:
    index = day.year * 12 + (day.month - 1) + months
    return index // 12, index % 12 + 1


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBERS[" ".join(word.lower().split())]


def _offset_span(ref: date, count: int, unit: str) -> TimeSpan:
    """The day, week, month or year ``count`` units from ``ref`` (negative: back)."""
    if unit == "day":
        return day_span(ref + timedelta(days=count))
    if unit == "week":
        moved = ref + timedelta(weeks=count)
        return week_span(moved - timedelta(days=moved.weekday()))
    if unit == "month":
        return month_span(*_shift_months(ref, count))
    return year_span(ref.year + count)


def _month_year(ref: date, month: int, direction: str) -> int:
    """Year of ``month`` seen from ``ref``: ``last``/``next`` exclude the current month, ``past``/``future`` include it."""
    if direction == "this":
        return ref.year
    if direction == "last":
        return ref.year if month < ref.month else ref.year - 1
    if direction == "next":
        return ref.year if month > ref.month else ref.year + 1
    if direction == "past":
        return ref.year if month <= ref.month else ref.year - 1
    return ref.year if month >= ref.month else ref.year + 1


def _weekday(ref: date, weekday: int, direction: str) -> date:
    """``weekday`` seen from ``ref``: ``this`` in ref's Monday-to-Sunday week, else the nearest one strictly before or after."""
    if direction == "this":
        return ref - timedelta(days=ref.weekday()) + timedelta(days=weekday)
    if direction in {"last", "past"}:
        return ref - timedelta(days=(ref.weekday() - weekday) % 7 or 7)
    return ref + timedelta(days=(weekday - ref.weekday()) % 7 or 7)


def _day_of_month(ref: date, month: int, day: int, direction: str) -> date | None:
    """The latest such date on or before ``ref`` (``past``) or the earliest on or after it (``future``)."""
    candidates = []
    for year in (ref.year - 1, ref.year, ref.year + 1):
        try:
            candidates.append(date(year, month, day))
        except ValueError:
            continue
    if direction == "past":
        return max((d for d in candidates if d <= ref), default=None)
    return min((d for d in candidates if d >= ref), default=None)


_STATED = {"last": "last", "this past": "last", "past": "last", "next": "next", "coming": "next", "this coming": "next",
           "this": "this", "since": "past"}


def _direction(word: str | None, text: str, m: re.Match[str]) -> tuple[str, bool]:
    """(direction, inferred): a stated ``last/next/this/since``, else the clause's tense, else ``future``;
    other leading words ("in", "on", "by") state no direction.

    With no tense cue a bare month or weekday means the coming one: a past event is told with a past verb
    ("went", "was", "did"), while present-tense talk of a month or weekday ("my birthday is in July",
    "I have a meeting on Tuesday") looks ahead.
    """
    stated = _STATED.get(" ".join(word.lower().split())) if word else None
    if stated:
        return stated, False
    return ("past" if clause_tense(text, m.start(), m.end()) == PAST else "future"), True


def _resolve_match(kind: str, m: re.Match[str], ref: date | None, text: str) -> tuple[TimeSpan | None, bool]:
    """One matched expression to (span, inferred); relative kinds need the reference day ``ref``."""
    if kind == "weekday_around":  # "the Sunday before October 25, 2022"
        day, month = (m[3], m[4]) if m[3] else (m[6], m[5])
        try:
            anchor = date(int(m[7]), _MONTHS[month.lower()], int(day))
        except ValueError:
            return None, False
        return day_span(_weekday(anchor, _WEEKDAYS[m[1].lower()], "last" if m[2].lower() == "before" else "next")), False
    if kind == "iso":
        try:
            return day_span(date(int(m[1]), int(m[2]), int(m[3]))), False
        except ValueError:
            return None, False
    if kind in {"day_month_year", "month_day_year"}:
        day, month = (m[1], m[2]) if kind == "day_month_year" else (m[2], m[1])
        try:
            return day_span(date(int(m[3]), _MONTHS[month.lower()], int(day))), False
        except ValueError:
            return None, False
    if kind == "month_year":
        return month_span(int(m[2]), _MONTHS[m[1].lower()]), False
    if kind == "in_year":
        return year_span(int(m[1])), False
    if ref is None:
        return None, False
    if kind == "ago":
        return _offset_span(ref, -_count(m[1]), m[2].lower()), False
    if kind == "ahead":  # "in two weeks" after a past verb is a duration ("I read it in a week"), not a date
        if clause_tense(text, m.start(), m.end()) == PAST:
            return None, False
        return _offset_span(ref, _count(m[1]), m[2].lower()), False
    if kind == "relative":
        word = " ".join(m[1].lower().split())
        offset = {"the day before yesterday": -2, "yesterday": -1, "last night": -1, "tomorrow": 1,
                  "the day after tomorrow": 2}.get(word, 0)
        return day_span(ref + timedelta(days=offset)), False
    if kind == "unit":
        which, unit = _STATED[" ".join(m[1].lower().split())], m[2].lower()
        step = {"last": -1, "this": 0, "next": 1}[which]
        monday = ref - timedelta(days=ref.weekday())
        if unit == "weekend":
            inferred = which == "this" and ref.weekday() < 5
            if inferred and clause_tense(text, m.start(), m.end()) == PAST:
                step = -1  # "we went camping this weekend", said on a weekday: the one just gone
            return weekend_span(monday + timedelta(days=5 + 7 * step)), inferred
        if unit == "week":
            return week_span(monday + timedelta(weeks=step)), False
        if unit == "month":
            return month_span(*_shift_months(ref, step)), False
        return year_span(ref.year + step), False
    if kind == "weekday":
        direction, inferred = _direction(m[1], text, m)
        return day_span(_weekday(ref, _WEEKDAYS[m[2].lower()], direction)), inferred
    if kind in {"day_month", "month_day"}:
        day, month = (m[1], m[2]) if kind == "day_month" else (m[2], m[1])
        direction, inferred = _direction(None, text, m)
        found = _day_of_month(ref, _MONTHS[month.lower()], int(day), direction)
        return (day_span(found) if found else None), inferred
    if kind == "month":
        direction, inferred = _direction(m[1], text, m)
        month = _MONTHS[(m[2] or m[3]).lower()]
        return month_span(_month_year(ref, month, direction), month), inferred
    return None, False


def resolve_time_expressions(text: str, utterance_time: str | None) -> Resolution:
    """Fact-time spans of the time expressions in ``text``, resolved against ``utterance_time``.

    Explicit dates resolve without a reference; relative ones need the utterance day and go the way the
    text points: a stated ``last``/``this``/``next``/``ago``/``in two weeks``, else the tense of their clause
    (see :func:`clause_tense`), else the coming occurrence. ``last``/``next`` exclude the current month or
    day ("last January" said in January is a year back); a month told in the past or future tense
    includes the current one. Overlapping matches keep the earliest, longest one. Vague recency sets
    ``vague`` and yields no span.
    """
    ref = utterance_date(utterance_time)
    text = text.replace("\u2019", "'")
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, TimeSpan, bool]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if any(m.start() < end and start < m.end() for start, end in taken):
                continue
            span, inferred = _resolve_match(kind, m, ref, text)
            if span is not None:
                taken.append((m.start(), m.end()))
                found.append((m.start(), span, inferred))
    spans: list[TimeSpan] = []
    for _, span, _ in sorted(found, key=lambda item: item[0]):
        if span not in spans:
            spans.append(span)
    inferred = [s for s in spans if all(flag for _, span, flag in found if span == s)]
    return Resolution(spans=spans, vague=not spans and bool(_VAGUE.search(text)), inferred=inferred)


_PRECISION = {"day": 0, "week": 1, "month": 2, "year": 3}


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


def normalize_time_item(start: str, end: str, granularity: str | None = None) -> TimeSpan | None:
    """A time item as a closed full-date interval; None when a bound is not a date.

    ``granularity`` defaults to the finer precision of the written bounds (``2023..2024-02``: month).
    """
    lo, hi = _expand(start, end=False), _expand(end or start, end=True)
    if lo is None or hi is None:
        return None
    if lo[0] > hi[0]:
        lo, hi = _expand(end, end=False), _expand(start, end=True)
        if lo is None or hi is None:
            return None
    if granularity is None:
        granularity = min(lo[1], hi[1], key=_PRECISION.__getitem__)
    return TimeSpan(lo[0].isoformat(), hi[0].isoformat(), granularity)


def _coarseness(span: TimeSpan) -> int:
    """0 (a day) to 3 (a year or more): the coarser of the span's label and its calendar width."""
    lo, hi = calendar_bounds(span)
    days = (hi - lo).days + 1
    width = 0 if days <= 1 else 1 if days <= 7 else 2 if days <= 31 else 3
    return max(_PRECISION.get(span.granularity, 0), width)


def _meet(a: TimeSpan, b: TimeSpan) -> bool:
    (a_lo, a_hi), (b_lo, b_hi) = calendar_bounds(a), calendar_bounds(b)
    return a_lo <= b_hi and b_lo <= a_hi


def fact_time(text: str, utterance_time: str | None, llm_items: list[TimeSpan] | None = None) -> list[TimeSpan]:
    """Dual-time rule: a unit's fact time from the rules on its own ``text`` and the LLM's items.

    Vague recency gives no time. Otherwise the LLM's items (less a bare copy of the utterance day, which
    the prompt forbids) and the rule spans are merged: rules fill what the LLM left empty and the LLM's
    items stand where the rules found nothing. A rule span and the LLM items that overlap it agree on
    when; the more specific of them is kept ("December" and 2023-12-24 give the day). Rule spans and
    items that overlap nothing disagree; the side with the more specific one wins. At equal specificity
    a rule whose direction is stated ("last January", "yesterday", a date) wins, being arithmetic on the
    utterance day, and a rule whose direction was inferred from tense yields to the LLM, which read the
    whole window.
    """
    resolution = resolve_time_expressions(text, utterance_time)
    if resolution.vague:
        return []
    ref = utterance_date(utterance_time)
    copied = day_span(ref) if ref else None
    free_items = [item for item in (llm_items or []) if item != copied]

    def rule_wins(rule: TimeSpan, item: TimeSpan) -> bool:
        ours, theirs = _coarseness(rule), _coarseness(item)
        return ours < theirs or (ours == theirs and rule not in resolution.inferred)

    kept: list[TimeSpan] = []
    free_rules: list[TimeSpan] = []
    for rule in resolution.spans:
        rivals = [item for item in free_items if _meet(rule, item)]
        if not rivals:
            free_rules.append(rule)
            continue
        kept += [item for item in rivals if not rule_wins(rule, item)] or [rule]
        free_items = [item for item in free_items if item not in rivals]
    if free_rules and free_items:
        rules_win = rule_wins(min(free_rules, key=_coarseness), min(free_items, key=_coarseness))
        kept += free_rules if rules_win else free_items
    else:
        kept += free_rules + free_items
    unique: list[TimeSpan] = []
    for span in kept:
        if span not in unique:
            unique.append(span)
    return unique
