"""The data model shared by construction, storage and retrieval.

Conversation → Session → Turn is what loaders produce; MemoryUnit and Trace are what construction
writes to the store and activation reads back. Times are ISO strings (``YYYY-MM-DD`` or a full
``YYYY-MM-DDTHH:MM:SS``) so that records serialize to JSON and SQLite unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """One utterance; ``id`` is the dataset's own turn id (LoCoMo ``D3:7``)."""

    id: str
    speaker: str
    text: str


@dataclass
class Session:
    """Consecutive turns with the time the session happened (ISO, or None when unknown)."""

    id: str
    time: str | None
    turns: list[Turn]


def session_fingerprint(turns: Sequence[Turn | Mapping[str, Any]], time: str | None) -> str:
    """The default id of a session added without one: ``s-`` and 16 hex digits of SHA-256 over its turns and time.

    Turns count by (id when given, speaker, text), as :class:`Turn` objects or ``{id?, speaker, text}``
    dicts, and the time as given; so a retried call with the same turns and time names the same session
    (and resumes it) rather than storing it twice. Values that are not turns are hashed as text: the
    caller refuses them afterwards.
    """

    def canonical(turn: object) -> object:
        if isinstance(turn, Turn):
            return [turn.id, turn.speaker, turn.text]
        if isinstance(turn, Mapping):
            return [str(turn["id"]) if turn.get("id") else None, turn.get("speaker"), turn.get("text")]
        return repr(turn)

    content = json.dumps({"time": time, "turns": [canonical(t) for t in turns]}, ensure_ascii=False, default=repr)
    return "s-" + hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()[:16]  # lone surrogates are refused afterwards


@dataclass
class Conversation:
    """A dialogue history; ``id`` becomes the store namespace unless one is given."""

    id: str
    sessions: list[Session]


@dataclass
class TimeSpan:
    """A closed date interval with its granularity (day, week, month, year)."""

    start: str
    end: str
    granularity: str = "day"


@dataclass
class MemoryUnit:
    """An event-indexed atomic memory unit with provenance (paper III-A1)."""

    id: str
    session_id: str
    fact_text: str
    subject: str
    predicate: str
    object: str
    source_turn_ids: list[str]
    source_text: str
    utterance_time: str | None
    serial: int
    """Position of the unit's first source turn in the conversation; orders units without times."""
    fact_time: list[TimeSpan] = field(default_factory=list)
    entities: list[str] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)

    @property
    def relation_text(self) -> str:
        """Subject plus predicate: what traces cluster on."""
        return f"{self.subject} {self.predicate}".strip()


@dataclass
class Trace:
    """A dynamic memory trace: related units, oldest first, and the LLM's trajectory."""

    id: str
    relation_text: str
    member_ids: list[str]
    trajectory: str
    current_id: str
