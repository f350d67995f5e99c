"""A search's filters: which units of a namespace may enter its working memory (speaker, session, session date range)."""

from __future__ import annotations

from dataclasses import dataclass

from qgmem_train.memory.store import NamespaceMemory
from qgmem_train.memory.types import MemoryUnit


@dataclass(frozen=True)
class UnitFilter:
    """Keep a unit when one of its source turns has ``speaker``, it is of ``session_id``, and its session's date lies in
    ``since`` to ``until`` (inclusive ISO dates; a unit of an undated session is outside any range)."""

    speaker: str | None = None
    session_id: str | None = None
    since: str | None = None
    until: str | None = None

    def __bool__(self) -> bool:
        return any(value is not None for value in (self.speaker, self.session_id, self.since, self.until))

    def __call__(self, memory: NamespaceMemory, unit: MemoryUnit) -> bool:
        if self.session_id is not None and unit.session_id != self.session_id:
            return False
        if self.speaker is not None:
            turns = (memory.turns.get(turn_id) for turn_id in unit.source_turn_ids)
            if not any(turn is not None and turn.speaker == self.speaker for turn in turns):
                return False
        if self.since is not None or self.until is not None:
            day = next((memory.turn_time.get(t) for t in unit.source_turn_ids if memory.turn_time.get(t)), None)
            day = day[:10] if day else None
            if day is None or (self.since is not None and day < self.since[:10]) or (self.until is not None and day > self.until[:10]):
                return False
        return True
