"""A namespace's turns column by column, in conversation order, and the mappings retrieval reads from them.

:class:`TurnMap`, :class:`TurnTimeMap` and :class:`PreviousTurnMap` look turns up by id; the id index
is built on the first lookup, and a turn is decoded only when it is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from qgmem_train.memory.columns import TextColumn, pack_arrays, unpack_arrays
from qgmem_train.memory.search_terms import TermLists, turn_term_lists
from qgmem_train.memory.types import Turn

_COLUMNS = ("ids", "session_ids", "speakers", "texts", "times")


@dataclass
class TurnTable:
    """Turns in conversation order: id, session, speaker, text and the session's time of each."""

    ids: TextColumn
    session_ids: TextColumn
    speakers: TextColumn
    texts: TextColumn
    times: TextColumn
    terms: TermLists | None = None
    """BM25 terms of each turn's :func:`~qgmem_train.memory.search_terms.turn_line` (None: not stored, see :meth:`with_terms`)."""

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[str, str, str, str, str | None]]) -> TurnTable:
        """The table of (id, session id, speaker, text, time) rows."""
        return cls(*(TextColumn.from_strings(r[k] for r in rows) for k in range(len(_COLUMNS)))).with_terms()

    def with_terms(self) -> TurnTable:
        """The table with its BM25 terms: those stored, else made from its speakers and texts."""
        if self.terms is not None:
            return self
        return replace(self, terms=turn_term_lists(zip(self.speakers.tolist(), self.texts.tolist())))  # type: ignore[arg-type]

    def columns_blob(self) -> bytes:
        """The table packed into one blob."""
        arrays: dict[str, np.ndarray] = {}
        for name in _COLUMNS:
            arrays.update(getattr(self, name).arrays(name))
        if self.terms is not None:
            arrays.update(self.terms.arrays())
        return pack_arrays(arrays)

    @classmethod
    def from_columns_blob(cls, blob: bytes) -> TurnTable:
        """The table packed by :meth:`columns_blob`."""
        arrays = unpack_arrays(blob)
        return cls(*(TextColumn.from_arrays(arrays, name) for name in _COLUMNS), terms=TermLists.from_arrays(arrays))

    def take(self, rows: np.ndarray) -> TurnTable:
        """The turns at ``rows``, in that order."""
        terms = self.terms.take(rows) if self.terms is not None else None
        return TurnTable(*(getattr(self, name).take(rows) for name in _COLUMNS), terms=terms)

    @staticmethod
    def concat(tables: Sequence[TurnTable]) -> TurnTable:
        """The tables one after the other."""
        terms = None if any(t.terms is None for t in tables) else TermLists.concat([t.terms for t in tables])  # type: ignore[misc]
        return TurnTable(*(TextColumn.concat([getattr(t, name) for t in tables]) for name in _COLUMNS), terms=terms)

    @cached_property
    def row_of(self) -> dict[str, int]:
        """Row of each turn id."""
        return {turn_id: row for row, turn_id in enumerate(self.ids.tolist())}

    @cached_property
    def has_previous(self) -> np.ndarray:
        """Whether each turn follows another turn of its session."""
        sessions = self.session_ids.tolist()
        return np.fromiter((row > 0 and sessions[row - 1] == s for row, s in enumerate(sessions)), bool, len(sessions))


class _TurnMapping(Mapping):
    """A read-only mapping from turn id to something read from the turn's row."""

    def __init__(self, table: TurnTable) -> None:
        self.table = table

    def _row(self, turn_id: str) -> int:
        row = self.table.row_of.get(turn_id) if isinstance(turn_id, str) else None
        if row is None or not self._has(row):
            raise KeyError(turn_id)
        return row

    def _has(self, row: int) -> bool:
        return True

    def _value(self, row: int) -> object:
        raise NotImplementedError

    def __getitem__(self, turn_id: str) -> object:
        return self._value(self._row(turn_id))

    def __iter__(self) -> Iterator[str]:
        return iter(self.table.ids.tolist())

    def __len__(self) -> int:
        return len(self.table)


class TurnMap(_TurnMapping):
    """Turn by id, in conversation order."""

    def _value(self, row: int) -> Turn:
        t = self.table
        return Turn(t.ids[row], t.speakers[row], t.texts[row])


class TurnTimeMap(_TurnMapping):
    """Time of each turn's session (None when unknown), by turn id."""

    def _value(self, row: int) -> str | None:
        return self.table.times[row]


class PreviousTurnMap(_TurnMapping):
    """Id of the turn before each turn in the same session (first turns of a session have none)."""

    def _has(self, row: int) -> bool:
        return row > 0 and self.table.session_ids[row - 1] == self.table.session_ids[row]

    def _value(self, row: int) -> str:
        return self.table.ids[row - 1]

    def __iter__(self) -> Iterator[str]:
        ids = self.table.ids.tolist()
        return (ids[row] for row in np.flatnonzero(self.table.has_previous).tolist())

    def __len__(self) -> int:
        return int(self.table.has_previous.sum())
