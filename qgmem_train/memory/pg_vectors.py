"""A PostgreSQL store's segment vectors: one row of ``segment_vectors`` (a pgvector column) per vector.

The rows of a segment are written with binary ``COPY`` in the transaction that adds the segment and read back
in one query per load, part by part in row order; float32 values go through pgvector unchanged, so a namespace
loads the same vectors from PostgreSQL as from an SQLite store's sidecars. No codes are kept: the dense scan
encodes them at load when a namespace is large enough to want them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from qgmem_train.errors import InputError
from qgmem_train.memory.segments import UNITS, StoredVectors

_COPY = "COPY segment_vectors (namespace, seq, part, idx, embedding) FROM STDIN (FORMAT BINARY)"
_READ = (
    "SELECT seq, part, embedding FROM segment_vectors WHERE namespace = %s AND seq BETWEEN %s AND %s AND part = ANY(%s) "
    "ORDER BY seq, part, idx"
)


class PgVectors:
    """:class:`~qgmem_train.memory.segments.VectorStorage` in ``segment_vectors`` (see the module docstring)."""

    table = "segment_vectors"

    def write(self, db: Any, namespace: str, seq: int, vectors: dict[str, np.ndarray]) -> None:
        with db.raw.cursor() as cursor, cursor.copy(_COPY) as copy:
            copy.set_types(["text", "int8", "text", "int4", "vector"])
            for part, array in vectors.items():
                for row, vector in enumerate(np.asarray(array, np.float32)):
                    copy.write_row((namespace, seq, part, row, vector))

    def remove_unused(self, db: Any) -> None:
        """Nothing is left unused: a segment's vectors are deleted with it."""

    def delete(self, db: Any, namespace: str, lo: int, hi: int) -> None:
        db.execute("DELETE FROM segment_vectors WHERE namespace = ? AND seq BETWEEN ? AND ?", (namespace, lo, hi))

    def read(self, db: Any, namespace: str, lo: int, hi: int, parts: Sequence[str], dim: int) -> list[StoredVectors]:
        query = "SELECT seq FROM segments WHERE namespace = ? AND kind = ? AND seq BETWEEN ? AND ? ORDER BY seq"
        seqs = [seq for (seq,) in db.execute(query, (namespace, UNITS, lo, hi))]
        rows: dict[tuple[int, str], list[np.ndarray]] = {}
        with db.raw.cursor(binary=True) as cursor:
            for seq, part, vector in cursor.execute(_READ, (namespace, lo, hi, list(parts))):
                vector = vector.to_numpy() if hasattr(vector, "to_numpy") else vector
                if vector.shape != (dim,):
                    raise InputError(f"segment_vectors of namespace {namespace}, segment {seq}", f"a {part} vector of {len(vector)} components in a store of {dim}-d vectors: not this store's vectors")
                rows.setdefault((seq, part), []).append(vector)
        empty = np.zeros((0, dim), np.float32)
        return [
            StoredVectors(seq, {part: np.stack(rows[seq, part]).astype(np.float32, copy=False) if (seq, part) in rows else empty for part in parts},
                          f"segment_vectors of namespace {namespace}, segment {seq}")
            for seq in seqs
        ]  # fmt: skip
