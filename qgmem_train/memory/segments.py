"""Segments: a namespace's units and turns stored one write at a time as packed columns, merged as they pile up.

A segment is a run of rows (units or turns) from one write: its ``columns`` blob (texts and integers,
see :meth:`UnitTable.columns_blob`) and, for units, one float32 blob per vector part. Every blob is
cut into pieces of at most :data:`PIECE_BYTES`, so a read copies piece by piece into one preallocated
array (the one copy into fresh memory) and no blob nears SQLite's size limit. A namespace reads as its segments concatenated in
``seq`` order, so loading costs a handful of queries and memory copies, whatever its size.

Merging keeps the count of segments low: each segment has a level (0 when written, one more than its
parts' when merged), and as soon as the newest :data:`MERGE_FACTOR` segments share a level they are
merged into one, unless it would exceed :data:`MAX_MERGED_ROWS` rows. Levels then count like digits in
base MERGE_FACTOR: a row is rewritten once per level, about log_F(N / rows per write) times.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np

from qgmem_train.memory.turn_table import TurnTable
from qgmem_train.memory.unit_table import VECTOR_PARTS, UnitTable

UNITS, TURNS = "units", "turns"
"""Segment kinds."""
PIECE_BYTES = 60 << 10
"""Largest blob stored in one row: within one page of a new store (no overflow chain to walk), and small
enough that reading copies through buffers the allocator reuses rather than fresh memory."""
MERGE_FACTOR = 8
"""Segments of one level merged at a time."""
MAX_MERGED_ROWS = 32_768
"""Largest merged segment, in rows: bounds the work (and the write lock) of one merge."""
LAST_SEQ = 1 << 62
"""Larger than any segment's seq."""

SCHEMA = [
    "CREATE TABLE unit_keys (namespace TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (namespace, id))",
    "CREATE INDEX unit_keys_seq ON unit_keys (namespace, seq)",
    "CREATE TABLE segments (namespace TEXT NOT NULL, kind TEXT NOT NULL, seq INTEGER NOT NULL, rows INTEGER NOT NULL, "
    "level INTEGER NOT NULL, PRIMARY KEY (namespace, kind, seq))",
    "CREATE TABLE segment_parts (namespace TEXT NOT NULL, kind TEXT NOT NULL, seq INTEGER NOT NULL, part TEXT NOT NULL, "
    "piece INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (namespace, kind, seq, part, piece))",
]
"""The tables holding every segment, and the segment of each unit id (``unit_keys``)."""


def append(db: sqlite3.Connection, namespace: str, table: UnitTable | TurnTable, *, seq: int | None = None, level: int = 0) -> int:
    """Store ``table`` as the namespace's newest segment (or as segment ``seq``); return its seq."""
    kind = UNITS if isinstance(table, UnitTable) else TURNS
    if seq is None:
        seq = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM segments WHERE namespace = ? AND kind = ?", (namespace, kind)).fetchone()[0]
    db.execute("INSERT INTO segments VALUES (?, ?, ?, ?, ?)", (namespace, kind, seq, len(table), level))
    blobs: dict[str, memoryview | bytes] = {"columns": table.columns_blob()}
    if isinstance(table, UnitTable):
        blobs.update({part: memoryview(np.ascontiguousarray(table.vectors[part], np.float32).reshape(-1).view(np.uint8)) for part in VECTOR_PARTS})
    rows = []
    for part, blob in blobs.items():
        view = memoryview(blob)
        rows += [(namespace, kind, seq, part, k, view[at:at + PIECE_BYTES]) for k, at in enumerate(range(0, max(len(view), 1), PIECE_BYTES))]
    db.executemany("INSERT INTO segment_parts VALUES (?, ?, ?, ?, ?, ?)", rows)
    return seq


def delete(db: sqlite3.Connection, namespace: str, kind: str, lo: int, hi: int) -> None:
    """Delete the segments ``lo`` to ``hi`` (inclusive)."""
    for table in ("segments", "segment_parts"):
        db.execute(f"DELETE FROM {table} WHERE namespace = ? AND kind = ? AND seq BETWEEN ? AND ?", (namespace, kind, lo, hi))


def listing(db: sqlite3.Connection, namespace: str, kind: str) -> list[tuple[int, int, int]]:
    """(seq, rows, level) of each segment, oldest first."""
    return db.execute("SELECT seq, rows, level FROM segments WHERE namespace = ? AND kind = ? ORDER BY seq", (namespace, kind)).fetchall()


def _columns(db: sqlite3.Connection, namespace: str, kind: str, lo: int, hi: int) -> list[bytes]:
    """The ``columns`` blob of each segment from ``lo`` to ``hi``, in seq order."""
    blobs: dict[int, list[bytes]] = {}
    query = "SELECT seq, data FROM segment_parts WHERE namespace = ? AND kind = ? AND part = 'columns' AND seq BETWEEN ? AND ? ORDER BY seq, piece"
    for seq, data in db.execute(query, (namespace, kind, lo, hi)):
        blobs.setdefault(seq, []).append(data)
    return [b"".join(pieces) for pieces in blobs.values()]


def _vectors(db: sqlite3.Connection, namespace: str, part: str, rows: int, dim: int, lo: int, hi: int) -> np.ndarray:
    """(rows, dim) vectors of ``part`` over the segments ``lo`` to ``hi``, copied piece by piece into one array."""
    out = np.empty((rows, dim), np.float32)
    flat = out.reshape(-1).view(np.uint8)
    at = 0
    query = "SELECT data FROM segment_parts WHERE namespace = ? AND kind = ? AND part = ? AND seq BETWEEN ? AND ? ORDER BY seq, piece"
    for (data,) in db.execute(query, (namespace, UNITS, part, lo, hi)):
        flat[at:at + len(data)] = np.frombuffer(data, np.uint8)
        at += len(data)
    if at != flat.nbytes:
        raise sqlite3.DatabaseError(f"namespace {namespace}: {part} vectors hold {at} bytes, expected {flat.nbytes}")
    return out


def read_units(db: sqlite3.Connection, namespace: str, dim: int, parts: Sequence[str] = VECTOR_PARTS, lo: int = 0, hi: int = LAST_SEQ) -> UnitTable:
    """Units of the segments ``lo`` to ``hi`` (default: all) as one table, with the vector ``parts`` asked for."""
    tables = [UnitTable.from_columns_blob(blob) for blob in _columns(db, namespace, UNITS, lo, hi)]
    table = UnitTable.concat(tables) if tables else UnitTable.from_embedded([], [], dim)
    counts = table.row_counts()
    table.vectors = {part: _vectors(db, namespace, part, counts[part], dim, lo, hi) for part in parts}
    return table


def read_turns(db: sqlite3.Connection, namespace: str, lo: int = 0, hi: int = LAST_SEQ) -> TurnTable:
    """Turns of the segments ``lo`` to ``hi`` (default: all), in conversation order."""
    tables = [TurnTable.from_columns_blob(blob) for blob in _columns(db, namespace, TURNS, lo, hi)]
    return TurnTable.concat(tables) if tables else TurnTable.from_rows([])


def merge_group(segments: Sequence[tuple[int, int, int]]) -> tuple[int, int, int] | None:
    """(first seq, last seq, level) of the newest segments to merge now, if any (see the module docstring)."""
    tail = segments[-MERGE_FACTOR:]
    if len(tail) < MERGE_FACTOR or len({level for _, _, level in tail}) != 1 or sum(rows for _, rows, _ in tail) > MAX_MERGED_ROWS:
        return None
    return tail[0][0], tail[-1][0], tail[0][2]


def merge(db: sqlite3.Connection, namespace: str, kind: str, dim: int) -> list[tuple[int, int]]:
    """Merge the namespace's newest segments while :func:`merge_group` finds some; return the (lo, hi) merged."""
    merged = []
    while (group := merge_group(listing(db, namespace, kind))) is not None:
        lo, hi, level = group
        if kind == UNITS:
            table: UnitTable | TurnTable = read_units(db, namespace, dim, lo=lo, hi=hi).without_unused_texts().in_unit_order()
        else:
            table = read_turns(db, namespace, lo, hi)
        delete(db, namespace, kind, lo, hi)
        append(db, namespace, table, seq=lo, level=level + 1)
        merged.append((lo, hi))
    return merged
