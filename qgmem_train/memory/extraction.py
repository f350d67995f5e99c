"""The paper's two-stage LLM extraction (III-A1): window → atomic units (stage 1) → retrieval index (stage 2).

Stage 1 renders each window with its overlap lines marked and enforces the evidence bound on the reply:
a unit whose start/end turn is not a line of its window, or whose evidence lies only in overlap lines,
is dropped and counted. Stage 2 indexes the kept units ``index_batch_size`` at a time, keyed by their
unchanged ids; fact time comes from :func:`~qgmem_train.memory.timeparse.fact_time`, which merges the
LLM's time items with the rule-based resolver run on the unit's own text (:func:`unit_time_text`).
Windows of one batch share one generate call: a constrained backend decodes against a schema
enumerating the ids of the whole batch, an unconstrained one is parsed with plain-string ids, so one
bad id drops one unit, not the window; either way the bound is checked per window afterwards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from qgmem_train.config import PipelineConfig
from qgmem_train.llm.base import Chat, ChatLLM
from qgmem_train.llm.prompts import MEMORY_UNIT_EXTRACTION, MEMORY_UNIT_INDEX
from qgmem_train.llm.schemas import ExtractionOutput, IndexOutput, UnitIndex, extraction_schema, index_schema
from qgmem_train.llm.structured import ParseStats, generate_structured
from qgmem_train.memory.timeparse import fact_time, normalize_time_item, resolve_time_expressions, split_clauses
from qgmem_train.memory.types import MemoryUnit, Turn
from qgmem_train.memory.windows import Window, annotated_content
from qgmem_train.text import tokenize

_SPEAKER = re.compile(r"^[^:\n]{1,40}:\s+", re.M)


@dataclass
class BoundedUnits:
    """Stage-1 units of one window that passed the evidence bound, and how many were dropped."""

    units: list[MemoryUnit]
    dropped: int


def window_chat(window: Window) -> Chat:
    """The extraction prompt for one window."""
    time = window.session.time or "unknown"
    return MEMORY_UNIT_EXTRACTION.render(
        session_id=window.session.id,
        start_turn=window.turns[0].id,
        end_turn=window.turns[-1].id,
        utterance_time=time,
        annotated_memory_content=annotated_content(window, window.session.time),
    )


def _source_text(turns: Sequence[Turn]) -> str:
    return "\n".join(f"{t.speaker}: {t.text}" for t in turns)


def bound_units(window: Window, output: ExtractionOutput | None, positions: dict[str, int]) -> BoundedUnits:
    """Units of ``output`` whose evidence is a turn range of ``window`` touching at least one new turn."""
    if output is None:
        return BoundedUnits([], 1)
    order = {turn_id: i for i, turn_id in enumerate(window.turn_ids)}
    units, dropped = [], 0
    for extracted in output.memory_units:
        if extracted.start_turn not in order or extracted.end_turn not in order or not extracted.fact_text.strip():
            dropped += 1
            continue
        lo, hi = sorted((order[extracted.start_turn], order[extracted.end_turn]))
        turns = window.turns[lo:hi + 1]
        if not any(t.id in window.new_ids for t in turns):
            dropped += 1
            continue
        triple = extracted.triple
        units.append(MemoryUnit(
            id=f"{window.new[0].id}#{len(units)}",
            session_id=window.session.id,
            fact_text=extracted.fact_text.strip(),
            subject=triple.subject.strip(),
            predicate=triple.predicate.strip(),
            object=triple.object.strip(),
            source_turn_ids=[t.id for t in turns],
            source_text=_source_text(turns),
            utterance_time=window.session.time,
            serial=positions[turns[0].id],
        ))
    return BoundedUnits(units, dropped)


def index_chat(window: Window, units: Sequence[MemoryUnit]) -> Chat:
    """The retrieval-index prompt for a chunk of one window's units."""
    items = [
        {"memory_unit_id": u.id, "utterance_time": u.utterance_time or "unknown", "fact_text": u.fact_text, "evidence_text": u.source_text}
        for u in units
    ]
    return MEMORY_UNIT_INDEX.render(
        session_id=window.session.id,
        start_turn=window.turns[0].id,
        end_turn=window.turns[-1].id,
        utterance_time=window.session.time or "unknown",
        memory_units_json=json.dumps(items, ensure_ascii=False),
    )


def _clean(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(v.strip() for v in values if v and v.strip()))


def unit_time_text(unit: MemoryUnit) -> str:
    """The text whose time expressions belong to ``unit``, so that units cut from one turn keep their own times.

    The fact text when it states a time (or vague recency); else the evidence clauses sharing the most
    words with the fact text (all of them on a tie); the whole evidence when no clause shares a word.
    """
    resolution = resolve_time_expressions(unit.fact_text, unit.utterance_time)
    if resolution.spans or resolution.vague:
        return unit.fact_text
    clauses = split_clauses(_SPEAKER.sub("", unit.source_text))
    words = set(tokenize(unit.fact_text))
    shared = [len(words.intersection(tokenize(clause))) for clause in clauses]
    best = max(shared, default=0)
    if best == 0:
        return unit.source_text
    return "\n".join(clause for clause, n in zip(clauses, shared) if n == best)


def apply_index(unit: MemoryUnit, index: UnitIndex | None) -> None:
    """Set the unit's entities, locations and fact time from its stage-2 record (None: rules only)."""
    if index is not None:
        unit.entities = _clean(index.entities)
        unit.locations = _clean(index.locations)
    items = [normalize_time_item(t.start, t.end, t.granularity) for t in (index.time if index else [])]
    unit.fact_time = fact_time(unit_time_text(unit), unit.utterance_time, [t for t in items if t is not None])


def extract_windows(
    llm: ChatLLM, windows: Sequence[Window], positions: dict[str, int], cfg: PipelineConfig, stats: ParseStats | None = None
) -> list[tuple[list[MemoryUnit], int]]:
    """Both stages over a batch of windows: ``(units, dropped outputs)`` per window, in window order."""
    max_tokens = cfg.generation.max_new_tokens
    turn_ids = list(dict.fromkeys(i for w in windows for i in w.turn_ids))
    schema = extraction_schema(turn_ids) if llm.supports_schema else ExtractionOutput
    outputs = generate_structured(llm, [window_chat(w) for w in windows], schema, max_new_tokens=max_tokens, stats=stats)
    bounded = [bound_units(w, out, positions) for w, out in zip(windows, outputs)]
    size = max(1, cfg.construction.index_batch_size)
    requests = [(i, b.units[lo:lo + size]) for i, b in enumerate(bounded) for lo in range(0, len(b.units), size)]
    dropped = [b.dropped for b in bounded]
    if requests:
        unit_ids = [u.id for _, chunk in requests for u in chunk]
        chats = [index_chat(windows[i], chunk) for i, chunk in requests]
        schema = index_schema(unit_ids) if llm.supports_schema else IndexOutput
        indexes: list[IndexOutput | None] = generate_structured(llm, chats, schema, max_new_tokens=max_tokens, stats=stats)
        for (i, chunk), index in zip(requests, indexes):
            if index is None:
                dropped[i] += 1
            by_id = {item.memory_unit_id: item for item in (index.memory_units if index else [])}
            for unit in chunk:
                apply_index(unit, by_id.get(unit.id))
    return [(b.units, d) for b, d in zip(bounded, dropped)]
