"""Sliding windows over a session (appendix A1): w turns, the first ``overlap`` of them context only.

The first window of a session has no overlap; each next window starts ``w - overlap`` turns later and
shows the previous window's last ``overlap`` turns as OVERLAP_FROM_PREVIOUS_WINDOW lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from qgmem_train.memory.types import Session, Turn


@dataclass
class Window:
    """One extraction window: its new turns and the overlap turns shown only as context."""

    session: Session
    index: int
    new: list[Turn]
    overlap: list[Turn]

    @property
    def turns(self) -> list[Turn]:
        """All turns in dialogue order (overlap first)."""
        return self.overlap + self.new

    @property
    def turn_ids(self) -> list[str]:
        """Source ids shown to the extractor, in dialogue order."""
        return [t.id for t in self.turns]

    @property
    def new_ids(self) -> set[str]:
        """Ids of the turns units may be extracted from."""
        return {t.id for t in self.new}


def session_windows(session: Session, window: int, overlap: int) -> list[Window]:
    """Cut ``session`` into windows of ``window`` turns with ``overlap`` context turns (step window - overlap)."""
    if window < 1 or not 0 <= overlap < window:
        raise ValueError(f"need window >= 1 and 0 <= overlap < window, got window={window}, overlap={overlap}")
    step = window - overlap
    turns = session.turns
    windows = []
    start = 0
    while start < len(turns):
        context = turns[max(0, start - overlap):start]
        windows.append(Window(session, len(windows), turns[start:start + step if start else window], context))
        start += step if start else window
    return windows


def annotated_content(window: Window, time: str | None) -> str:
    """MEMORY_CONTENT in the prompt's form: NEW_IN_THIS_WINDOW lines, then OVERLAP_FROM_PREVIOUS_WINDOW lines."""
    stamp = time or "unknown"

    def line(turn: Turn) -> str:
        return f"[{turn.id}] time: {stamp} {turn.speaker}: {turn.text}"

    parts = ["NEW_IN_THIS_WINDOW", *map(line, window.new)]
    if window.overlap:
        parts += ["OVERLAP_FROM_PREVIOUS_WINDOW", *map(line, window.overlap)]
    return "\n".join(parts)
