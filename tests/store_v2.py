"""Memory stores in schema version 2's format (one row per unit, its lists as JSON), written with plain SQL.

Version 2 is what the upgrade to version 3 reads (tests) and what the per-row loader of
``bench/bench_store_load.py`` reads; version 1 is the same without the namespaces' write counts.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from qgmem_train.memory.store import EmbeddedUnit

V2_SCHEMA = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE namespaces (name TEXT PRIMARY KEY, units_mode TEXT NOT NULL, traces_stale INTEGER NOT NULL DEFAULT 0, "
    "generation INTEGER NOT NULL DEFAULT 0, units_generation INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE turns (namespace TEXT NOT NULL, id TEXT NOT NULL, session_id TEXT NOT NULL, position INTEGER NOT NULL, "
    "speaker TEXT NOT NULL, text TEXT NOT NULL, time TEXT, PRIMARY KEY (namespace, id))",
    "CREATE TABLE windows (namespace TEXT NOT NULL, session_id TEXT NOT NULL, idx INTEGER NOT NULL, units INTEGER NOT NULL, "
    "dropped INTEGER NOT NULL, PRIMARY KEY (namespace, session_id, idx))",
    "CREATE TABLE units (namespace TEXT NOT NULL, id TEXT NOT NULL, serial INTEGER NOT NULL, sub INTEGER NOT NULL, "
    "session_id TEXT NOT NULL, fact_text TEXT NOT NULL, subject TEXT NOT NULL, predicate TEXT NOT NULL, object TEXT NOT NULL, "
    "source_turn_ids TEXT NOT NULL, source_text TEXT NOT NULL, utterance_time TEXT, fact_time TEXT NOT NULL, "
    "entities TEXT NOT NULL, locations TEXT NOT NULL, fact_emb BLOB NOT NULL, relation_emb BLOB NOT NULL, "
    "attr_emb BLOB NOT NULL, PRIMARY KEY (namespace, id))",
    "CREATE INDEX units_order ON units (namespace, serial, sub, id)",
    "CREATE TABLE sentences (namespace TEXT NOT NULL, unit_id TEXT NOT NULL, idx INTEGER NOT NULL, emb BLOB NOT NULL, "
    "PRIMARY KEY (namespace, unit_id, idx))",
    "CREATE TABLE traces (namespace TEXT NOT NULL, id TEXT NOT NULL, relation_text TEXT NOT NULL, member_ids TEXT NOT NULL, "
    "trajectory TEXT NOT NULL, current_id TEXT NOT NULL, PRIMARY KEY (namespace, id))",
]


def _blob(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, dtype=np.float32).tobytes()


def create_store(directory: Path, embedder_id: str, dim: int, *, version: int = 2) -> sqlite3.Connection:
    """A new store of schema ``version`` (1 or 2) in ``directory``, open for writing (autocommit)."""
    directory.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(directory / "memory.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for statement in V2_SCHEMA:
        db.execute(statement)
    if version == 1:
        db.execute("ALTER TABLE namespaces DROP COLUMN generation")
        db.execute("ALTER TABLE namespaces DROP COLUMN units_generation")
    db.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", str(version)), ("embedder_id", embedder_id), ("dim", str(dim))])
    return db


def add_namespace(db: sqlite3.Connection, namespace: str, units_mode: str) -> None:
    """A namespace row (write counts at 0)."""
    db.execute("INSERT INTO namespaces (name, units_mode) VALUES (?, ?)", (namespace, units_mode))


def add_units(db: sqlite3.Connection, namespace: str, items: Sequence[EmbeddedUnit], subs: Iterable[int]) -> None:
    """Unit rows (``subs``: each unit's index among its window's units) and their sentence rows, as version 2 wrote them."""
    rows, sentence_rows = [], []
    for item, sub in zip(items, subs):
        u = item.unit
        if item.sentence_embeddings is not None:
            sentence_rows += [(namespace, u.id, i, _blob(v)) for i, v in enumerate(item.sentence_embeddings)]
        rows.append((
            namespace, u.id, u.serial, sub, u.session_id, u.fact_text, u.subject, u.predicate, u.object,
            json.dumps(u.source_turn_ids), u.source_text, u.utterance_time,
            json.dumps([asdict(t) for t in u.fact_time]), json.dumps(u.entities), json.dumps(u.locations),
            _blob(item.fact_embedding), _blob(item.relation_embedding), _blob(item.attribute_embeddings),
        ))  # fmt: skip
    db.executemany("INSERT INTO units VALUES (" + ", ".join("?" * 18) + ")", rows)
    db.executemany("INSERT INTO sentences VALUES (?, ?, ?, ?)", sentence_rows)


def add_turns(db: sqlite3.Connection, namespace: str, turns: Sequence[tuple[str, str, str, str, str | None]], first_position: int = 0) -> None:
    """Turn rows from (id, session id, speaker, text, time), at positions from ``first_position`` in the order given."""
    db.executemany(
        "INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(namespace, turn_id, session, first_position + k, speaker, text, time) for k, (turn_id, session, speaker, text, time) in enumerate(turns)],
    )
