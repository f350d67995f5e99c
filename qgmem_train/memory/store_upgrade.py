"""The upgrades of a store of schema version 2 to 3 (units and turns move into segments) and 3 to 4 (unit vectors move into sidecars).

Version 2 kept one row per unit (lists as JSON, one blob per vector) and one per sentence vector. The
upgrade reads each namespace's units in unit order, :data:`MOVE_ROWS` at a time, and writes each batch
as a segment, exactly as a build writes them; turns are copied into one segment per namespace. Version 2
stored no subject embeddings: retrieval embeds the subjects of those units when it builds its index.
Namespaces gain an unrecorded cut, taken by the next build (see :mod:`qgmem_train.memory.store`).

Version 3 kept each unit segment's vectors in the database, one blob per vector part cut into pieces;
version 4 keeps them in a sidecar file per segment (:mod:`qgmem_train.memory.sidecar`). The upgrade
writes one segment's sidecar at a time and drops the pieces; killed before it commits, it leaves the
store at version 3 (its files are removed by the next write).
"""

from __future__ import annotations

import json
import sqlite3

import numpy as np

from qgmem_train.memory import segments
from qgmem_train.memory.turn_table import TurnTable
from qgmem_train.memory.types import MemoryUnit, TimeSpan
from qgmem_train.memory.unit_table import VECTOR_PARTS, EmbeddedUnit, UnitTable

MOVE_ROWS = 4096
"""Units read and written as one segment by the upgrade."""
TURN_INDEXES = [
    "CREATE INDEX turns_session ON turns (namespace, session_id)",
    "CREATE INDEX turns_position ON turns (namespace, position)",
]
"""Version 3 looks turns up by session and position when it adds some, rather than reading them all."""

_UNITS = (
    "SELECT id, session_id, fact_text, subject, predicate, object, source_turn_ids, source_text, utterance_time, serial, "
    "fact_time, entities, locations, fact_emb, relation_emb, attr_emb, sub FROM units WHERE namespace = ? ORDER BY serial, sub, id"
)


def upgrade_2_to_3(db: sqlite3.Connection) -> None:
    """Move every namespace's units and turns into segments, drop the old unit tables, index turns, make room for the cut."""
    db.execute("ALTER TABLE namespaces ADD COLUMN cut_window INTEGER")
    db.execute("ALTER TABLE namespaces ADD COLUMN cut_overlap INTEGER")
    for statement in [*TURN_INDEXES, *segments.SCHEMA, *segments.FILES_SCHEMA]:
        db.execute(statement)
    row = db.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
    dim = int(row[0]) if row else 0
    names = db.execute("SELECT name FROM namespaces UNION SELECT namespace FROM units UNION SELECT namespace FROM turns").fetchall()
    for (namespace,) in names:
        _move_units(db, namespace, dim)
        turns = db.execute("SELECT id, session_id, speaker, text, time FROM turns WHERE namespace = ? ORDER BY position", (namespace,)).fetchall()
        if turns:
            segments.append(db, namespace, TurnTable.from_rows(turns))
    db.execute("DROP TABLE sentences")
    db.execute("DROP TABLE units")


def _move_units(db: sqlite3.Connection, namespace: str, dim: int) -> None:
    """Write the namespace's version-2 unit rows as segments, in unit order."""
    cursor = db.execute(_UNITS, (namespace,))
    while rows := cursor.fetchmany(MOVE_ROWS):
        ids = [r[0] for r in rows]
        sentences: dict[str, list[bytes]] = {}
        query = "SELECT unit_id, emb FROM sentences WHERE namespace = ? AND unit_id IN (SELECT value FROM json_each(?)) ORDER BY unit_id, idx"
        for unit_id, blob in db.execute(query, (namespace, json.dumps(ids))):
            sentences.setdefault(unit_id, []).append(blob)
        vectors = lambda blobs: np.frombuffer(b"".join(blobs), np.float32).reshape(-1, dim)  # noqa: E731
        items = [
            EmbeddedUnit(
                MemoryUnit(
                    id=r[0], session_id=r[1], fact_text=r[2], subject=r[3], predicate=r[4], object=r[5], source_turn_ids=json.loads(r[6]),
                    source_text=r[7], utterance_time=r[8], serial=r[9], fact_time=[TimeSpan(**t) for t in json.loads(r[10])],
                    entities=json.loads(r[11]), locations=json.loads(r[12]),
                ),
                vectors([r[13]])[0], vectors([r[14]])[0], vectors([r[15]]), vectors(sentences[r[0]]) if r[0] in sentences else None,
            )
            for r in rows
        ]  # fmt: skip
        seq = segments.append(db, namespace, UnitTable.from_embedded(items, [r[16] for r in rows], dim))
        db.executemany("INSERT INTO unit_keys VALUES (?, ?, ?)", [(namespace, unit_id, seq) for unit_id in ids])


def upgrade_3_to_4(db: sqlite3.Connection) -> None:
    """Move the vectors of every unit segment out of ``segment_parts`` into its sidecar file."""
    for statement in segments.FILES_SCHEMA:
        db.execute(statement)
    segments.remove_unused_sidecars(db)
    row = db.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
    dim = int(row[0]) if row else 0
    query = (
        "SELECT namespace, seq FROM segments s WHERE kind = ? AND NOT EXISTS "
        "(SELECT 1 FROM segment_files f WHERE f.namespace = s.namespace AND f.seq = s.seq) ORDER BY namespace, seq"
    )
    for namespace, seq in db.execute(query, (segments.UNITS,)).fetchall():
        counts = UnitTable.from_columns_blob(_pieces(db, namespace, seq, "columns")).row_counts()
        vectors = {part: np.frombuffer(_pieces(db, namespace, seq, part), np.float32).reshape(counts[part], dim) for part in VECTOR_PARTS}
        segments.add_sidecar(db, namespace, seq, vectors)
    db.execute("DELETE FROM segment_parts WHERE kind = ? AND part != 'columns'", (segments.UNITS,))


def _pieces(db: sqlite3.Connection, namespace: str, seq: int, part: str) -> bytes:
    """The blob of one part of one unit segment of version 3, its pieces joined."""
    query = "SELECT data FROM segment_parts WHERE namespace = ? AND kind = ? AND seq = ? AND part = ? ORDER BY piece"
    return b"".join(data for (data,) in db.execute(query, (namespace, segments.UNITS, seq, part)))
