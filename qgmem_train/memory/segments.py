"""Segments: a namespace's units and turns stored one write at a time as packed columns, merged as they pile up.

A segment is a run of rows (units or turns) from one write: its ``columns`` blob (texts and integers,
see :meth:`UnitTable.columns_blob`), cut into pieces of at most :data:`PIECE_BYTES` so that no blob
nears SQLite's size limit, and, for units, a vector sidecar (:mod:`qgmem_train.memory.sidecar`): the
float32 vectors in a file of their own, recorded in ``segment_files`` and read through a memory map,
so a load does not copy them out of the database, and the codes of its facts and sentences in a codes file
the dense channel searches (int8, mapped; product-quantised for a large segment, read). A namespace reads as its segments concatenated in
``seq`` order, so loading costs a handful of queries, whatever its size. A PostgreSQL store keeps a unit segment's
vectors as rows of a pgvector column instead of a sidecar (:class:`VectorStorage`); everything else here is shared.

Merging keeps the count of segments low: each segment has a level (0 when written, one more than its
parts' when merged), and as soon as the newest :data:`MERGE_FACTOR` segments share a level they are
merged into one, unless it would exceed :data:`MAX_MERGED_ROWS` rows. Levels then count like digits in
base MERGE_FACTOR: a row is rewritten once per level, about log_F(N / rows per write) times.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from qgmem_train import vector_codes
from qgmem_train.errors import InputError
from qgmem_train.memory import sidecar
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
CODED_PARTS = ("fact", "sentence")
"""The vector parts a segment's codes hold, in that order (the dense channel's vectors)."""

SCHEMA = [
    "CREATE TABLE unit_keys (namespace TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (namespace, id))",
    "CREATE INDEX unit_keys_seq ON unit_keys (namespace, seq)",
    "CREATE TABLE segments (namespace TEXT NOT NULL, kind TEXT NOT NULL, seq INTEGER NOT NULL, rows INTEGER NOT NULL, "
    "level INTEGER NOT NULL, PRIMARY KEY (namespace, kind, seq))",
    "CREATE TABLE segment_parts (namespace TEXT NOT NULL, kind TEXT NOT NULL, seq INTEGER NOT NULL, part TEXT NOT NULL, "
    "piece INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (namespace, kind, seq, part, piece))",
]
"""The tables holding every segment, and the segment of each unit id (``unit_keys``)."""
FILES_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS segment_files (namespace TEXT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, "
    "bytes INTEGER NOT NULL, token TEXT NOT NULL, PRIMARY KEY (namespace, seq))",
]
"""The vector sidecar of each unit segment: file name, size and the token the file holds (schema version 4)."""


def append(db: sqlite3.Connection, namespace: str, table: UnitTable | TurnTable, *, seq: int | None = None, level: int = 0) -> int:
    """Store ``table`` as the namespace's newest segment (or as segment ``seq``); return its seq."""
    kind = UNITS if isinstance(table, UnitTable) else TURNS
    table = table.with_terms()  # a merge of segments written before terms were stored writes them
    table = replace(table, terms=table.terms.without_unused_terms())  # type: ignore[union-attr]
    if seq is None:
        seq = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM segments WHERE namespace = ? AND kind = ?", (namespace, kind)).fetchone()[0]
    db.execute("INSERT INTO segments VALUES (?, ?, ?, ?, ?)", (namespace, kind, seq, len(table), level))
    if isinstance(table, UnitTable):
        storage_of(db).write(db, namespace, seq, {part: np.asarray(table.vectors[part], np.float32) for part in VECTOR_PARTS})
    view = memoryview(table.columns_blob())
    rows = [(namespace, kind, seq, "columns", k, view[at:at + PIECE_BYTES]) for k, at in enumerate(range(0, max(len(view), 1), PIECE_BYTES))]
    db.executemany("INSERT INTO segment_parts VALUES (?, ?, ?, ?, ?, ?)", rows)
    return seq


@dataclass
class StoredVectors:
    """The vectors of one unit segment as read: every part's array, what errors name, and its codes file, if any."""

    seq: int
    arrays: dict[str, np.ndarray]
    where: str
    codes: Path | None = None


class VectorStorage(Protocol):
    """Where the vectors of unit segments live: sidecar files beside an SQLite store (:class:`SidecarStorage`), rows
    of pgvector columns in a PostgreSQL store (:class:`~qgmem_train.memory.pg_vectors.PgVectors`)."""

    table: str
    """The table recording the vectors, a row (or more) per segment, keyed by namespace."""

    def write(self, db: Any, namespace: str, seq: int, vectors: dict[str, np.ndarray]) -> None:
        """Store the vectors of unit segment ``seq`` in the current transaction."""

    def remove_unused(self, db: Any) -> None:
        """Drop vectors no committed segment uses (first thing in a write transaction)."""

    def delete(self, db: Any, namespace: str, lo: int, hi: int) -> None:
        """Forget the vectors of the unit segments ``lo`` to ``hi``."""

    def read(self, db: Any, namespace: str, lo: int, hi: int, parts: Sequence[str], dim: int) -> list[StoredVectors]:
        """The vectors (at least ``parts``) of the unit segments ``lo`` to ``hi``, in seq order."""


class SidecarStorage:
    """Vectors in sidecar files next to the SQLite file (:mod:`qgmem_train.memory.sidecar`), recorded in ``segment_files``."""

    table = "segment_files"

    def write(self, db: sqlite3.Connection, namespace: str, seq: int, vectors: dict[str, np.ndarray]) -> None:
        add_sidecar(db, namespace, seq, vectors)

    def remove_unused(self, db: sqlite3.Connection) -> None:
        sidecar.remove_unreferenced(sidecar.folder_of(db), {name for (name,) in db.execute("SELECT name FROM segment_files")})

    def delete(self, db: sqlite3.Connection, namespace: str, lo: int, hi: int) -> None:
        db.execute("DELETE FROM segment_files WHERE namespace = ? AND seq BETWEEN ? AND ?", (namespace, lo, hi))

    def read(self, db: sqlite3.Connection, namespace: str, lo: int, hi: int, parts: Sequence[str], dim: int) -> list[StoredVectors]:
        folder = sidecar.folder_of(db)
        query = "SELECT seq, name, bytes, token FROM segment_files WHERE namespace = ? AND seq BETWEEN ? AND ? ORDER BY seq"
        return [
            StoredVectors(seq, sidecar.read(folder, name, size, token, f"namespace {namespace}, segment {seq}"), str(folder / name), sidecar.codes_path(folder, name))
            for seq, name, size, token in db.execute(query, (namespace, lo, hi)).fetchall()
        ]


SIDECARS = SidecarStorage()


def storage_of(db: Any) -> VectorStorage:
    """The vector storage of the store ``db`` is connected to: an SQLite connection's sidecars, else the connection's own."""
    return SIDECARS if isinstance(db, sqlite3.Connection) else db.vectors


def add_sidecar(db: sqlite3.Connection, namespace: str, seq: int, vectors: dict[str, np.ndarray]) -> None:
    """Write the vector sidecar of unit segment ``seq`` and record it in the current transaction."""
    name, size, token = sidecar.write(sidecar.folder_of(db), vectors, coded=CODED_PARTS)
    db.execute("INSERT INTO segment_files VALUES (?, ?, ?, ?, ?)", (namespace, seq, name, size, token))


def remove_unused_sidecars(db: Any) -> None:
    """Delete the vectors no committed segment uses (call first in a write transaction: see :mod:`~qgmem_train.memory.sidecar`)."""
    storage_of(db).remove_unused(db)


def delete(db: sqlite3.Connection, namespace: str, kind: str, lo: int, hi: int) -> None:
    """Delete the segments ``lo`` to ``hi`` (inclusive)."""
    for table in ("segments", "segment_parts"):
        db.execute(f"DELETE FROM {table} WHERE namespace = ? AND kind = ? AND seq BETWEEN ? AND ?", (namespace, kind, lo, hi))
    if kind == UNITS:
        storage_of(db).delete(db, namespace, lo, hi)


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


def read_units(db: sqlite3.Connection, namespace: str, dim: int, parts: Sequence[str] = VECTOR_PARTS, lo: int = 0, hi: int = LAST_SEQ) -> UnitTable:
    """Units of the segments ``lo`` to ``hi`` (default: all) as one table, with the vector ``parts`` asked for.

    The vectors of each segment are views of its memory-mapped sidecar; those of several segments are a
    :class:`~qgmem_train.memory.row_stack.RowStack` of the views (nothing is copied).
    """
    return _concat([table for table, _ in _read_segments(db, namespace, dim, parts, lo, hi)], dim)


def read_units_and_codes(db: sqlite3.Connection, namespace: str, dim: int, parts: Sequence[str] = VECTOR_PARTS, lo: int = 0) -> tuple[UnitTable, list[tuple[object, float, int]] | None]:
    """The units of the segments from ``lo`` on (as :func:`read_units`) and each segment's codes (a faiss index of its facts, then its
    sentences, its scale and its unit count); None when a segment has none (written without faiss or before codes were
    kept, or its codes file removed by a writer that keeps none: the codes are then encoded at load)."""
    segments = _read_segments(db, namespace, dim, parts, lo, LAST_SEQ)
    codes = []
    for table, stored in segments:
        arrays, path = stored.arrays, stored.codes
        if path is None or sidecar.CODE_BYTES not in arrays or not path.exists():  # none kept, or removed by a writer that keeps none
            return _concat([t for t, _ in segments], dim), None
        vectors = len(table) + len(table.sentence_owner)
        index = vector_codes.read(path, int(arrays[sidecar.CODE_BYTES][0]), vectors, dim, f"namespace {namespace}, segment {stored.seq}")
        codes.append((index, float(arrays[sidecar.CODE_SCALE][0]), len(table)))
    return _concat([t for t, _ in segments], dim), codes


def _read_segments(db: Any, namespace: str, dim: int, parts: Sequence[str], lo: int, hi: int) -> list[tuple[UnitTable, StoredVectors]]:
    """Each unit segment from ``lo`` to ``hi`` as a table with its vector ``parts``, and its stored vectors."""
    tables = [UnitTable.from_columns_blob(blob) for blob in _columns(db, namespace, UNITS, lo, hi)]
    stored = storage_of(db).read(db, namespace, lo, hi, parts, dim)
    if len(stored) != len(tables):
        raise sqlite3.DatabaseError(f"namespace {namespace}: {len(tables)} unit segments but {len(stored)} stored vector sets")
    for table, vectors in zip(tables, stored):
        counts = table.row_counts()
        for part in parts:
            shape = vectors.arrays[part].shape if part in vectors.arrays else None
            if shape != (counts[part], dim):
                raise InputError(vectors.where, f"{part} vectors of shape {shape}, segment {vectors.seq} needs ({counts[part]}, {dim})")
        table.vectors = {part: vectors.arrays[part] for part in parts}
    return list(zip(tables, stored))


def _concat(tables: list[UnitTable], dim: int) -> UnitTable:
    """The segments' tables as one (the one table itself when there is one)."""
    if len(tables) == 1:
        return tables[0]
    return UnitTable.concat(tables) if tables else UnitTable.from_embedded([], [], dim)


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
