"""Query intent: the entity, location and time constraints of a question (paper III-B1, parser φ(q, t_q)).

Two parsers give the same :class:`QueryIntent`:

- :func:`parse_intents` runs the paper's QUERY_INTENT prompt through the LLM with schema-checked JSON;
  this is the pipeline's parser (``ask``, ``eval retrieval`` whenever an LLM is configured for it).
- :func:`parse_intent_rules` needs no LLM: capitalised names and quoted terms as entities, dates and
  relative expressions through the construction's time rules. CPU benchmarks and ablations use it,
  and the LLM path falls back to it for an output that stays invalid after repair.

Times are closed date intervals with the precision they were written in. The question time only
resolves relative expressions, forwards or backwards as the question's tense points ("what did she do
in December" looks back, "when is she flying to Japan in December" ahead); a constraint that merely
repeats the question's own day, without a time expression in the question, is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.prompts import QUERY_INTENT
from qgmem_train.llm.schemas import IntentOutput
from qgmem_train.llm.structured import ParseStats, generate_structured
from qgmem_train.memory.timeparse import normalize_time_item, resolve_time_expressions, utterance_date
from qgmem_train.memory.types import TimeSpan

INTENT_MAX_NEW_TOKENS = 160
"""Enough for a few entities, locations and dates; the intent JSON is short."""


@dataclass
class QueryIntent:
    """Retrieval constraints of one question; empty lists mean "no constraint on this axis"."""

    entities: list[str] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)
    fact_times: list[TimeSpan] = field(default_factory=list)
    utterance_times: list[TimeSpan] = field(default_factory=list)
    parser: str = "rules"
    """Which parser produced it: ``llm``, ``rules``, or ``rules-fallback`` (LLM output dropped)."""

    def as_dict(self) -> dict:
        """JSON-ready form for reports."""
        spans = lambda items: [f"{s.start}..{s.end}" if s.start != s.end else s.start for s in items]  # noqa: E731
        return {
            "entities": self.entities,
            "locations": self.locations,
            "time": {"fact": spans(self.fact_times), "utterance": spans(self.utterance_times)},
            "parser": self.parser,
        }


def parse_date_range(text: str) -> TimeSpan | None:
    """``YYYY-MM-DD`` or ``a..b`` (each a day, month or year) as a closed full-date interval; None if not a date.

    Its granularity is the precision written (``2023-12``: month; ``2023-01-14..2023-01-15``: day), so
    matching never widens a range of days to the week around it.
    """
    start, _, end = str(text).strip().partition("..")
    return normalize_time_item(start, end or start)


def _dedupe(items: Sequence[str]) -> list[str]:
    """Stripped, non-empty, case-insensitively unique, in first-seen order."""
    seen: dict[str, str] = {}
    for item in items:
        text = " ".join(str(item).split())
        if text and text.lower() not in seen:
            seen[text.lower()] = text
    return list(seen.values())


def _drop_question_day(spans: list[TimeSpan], question: str, question_time: str | None) -> list[TimeSpan]:
    """Remove spans that only copy the question's day when the question states no time itself."""
    day = utterance_date(question_time)
    if day is None or resolve_time_expressions(question, question_time).spans:
        return spans
    return [s for s in spans if (s.start, s.end) != (day.isoformat(), day.isoformat())]


def intent_from_output(output: IntentOutput, question: str, question_time: str | None) -> QueryIntent:
    """Turn validated LLM output into a :class:`QueryIntent`; unparsable dates are skipped."""
    def spans(values: list[str]) -> list[TimeSpan]:
        parsed = [s for s in map(parse_date_range, values) if s is not None]
        unique = list({(s.start, s.end): s for s in parsed}.values())
        return _drop_question_day(unique, question, question_time)

    return QueryIntent(
        entities=_dedupe(output.entities),
        locations=_dedupe(output.locations),
        fact_times=spans(output.time.fact),
        utterance_times=spans(output.time.utterance),
        parser="llm",
    )


def parse_intents(
    questions: Sequence[tuple[str, str | None]],
    llm: ChatLLM,
    *,
    max_new_tokens: int = INTENT_MAX_NEW_TOKENS,
    stats: ParseStats | None = None,
) -> list[QueryIntent]:
    """Parse (question, question time) pairs with the QUERY_INTENT prompt, batched; dropped outputs use the rules."""
    chats = [QUERY_INTENT.render(query=q, question_time=t or "unknown") for q, t in questions]
    outputs = generate_structured(llm, chats, IntentOutput, max_new_tokens=max_new_tokens, stats=stats)
    intents = []
    for (question, question_time), output in zip(questions, outputs):
        if output is None:
            intent = parse_intent_rules(question, question_time)
            intent.parser = "rules-fallback"
        else:
            intent = intent_from_output(output, question, question_time)
        intents.append(intent)
    return intents


_QUESTION_WORDS = frozenset(
    """what when where who whom whose which why how did do does is are was were has have had can could would
    will should may might shall in on at for from by with about after before during since the a an if and or
    but of to i you he she we they it my your his her our their this that these those""".split()
)
_CALENDAR_WORDS = frozenset(
    """january february march april may june july august september october november december jan feb mar apr
    jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday""".split()
)
_CAPITALISED_RUN = re.compile(r"\b[A-Z][\w'&.-]*(?:\s+(?:of|the|de|and|&)?\s*[A-Z][\w'&.-]*)*")
_QUOTED = re.compile(r"[\"“”‘’']([^\"“”‘’']{2,60})[\"“”‘’']")
_UTTERANCE_CUE = re.compile(r"\b(chat|conversation|talked|talk|mentioned|told|said|discussed|spoke)\b", re.I)


def _names(question: str) -> list[str]:
    """Capitalised word runs, without question words and calendar words at their edges, plus quoted terms."""
    names = [m.group(1) for m in _QUOTED.finditer(question)]
    for match in _CAPITALISED_RUN.finditer(question):
        words = match.group(0).rstrip(".'").split()
        while words and (words[0].lower() in _QUESTION_WORDS or words[0].lower() in _CALENDAR_WORDS):
            words.pop(0)
        while words and words[-1].lower() in _CALENDAR_WORDS:
            words.pop()
        name = " ".join(words).removesuffix("'s")
        if name and not name.isdigit():
            names.append(name)
    return _dedupe(names)


def parse_intent_rules(question: str, question_time: str | None) -> QueryIntent:
    """Rule-based intent without an LLM: names as entities, resolved time expressions as fact (or utterance) time."""
    spans = resolve_time_expressions(question, question_time).spans
    utterance = bool(spans) and bool(_UTTERANCE_CUE.search(question))
    return QueryIntent(
        entities=_names(question),
        locations=[],
        fact_times=[] if utterance else spans,
        utterance_times=spans if utterance else [],
        parser="rules",
    )
