"""The persistent memory store: one SQLite file (WAL mode) holding turns, units, traces and embeddings.

Every build step commits in one transaction together with its progress record, so a build killed at any
moment leaves a store that opens, and the next build resumes at the first window not yet committed.
Embeddings are float32 blobs, one per unit (fact, relation) plus one stacked blob of its attributes, so a
namespace loads with one query (:meth:`MemoryStore.load_namespace`); the sentences of multi-sentence
facts have their own rows in ``sentences``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from qgmem_train.errors import InputError
from qgmem_train.memory.types import Conversation, MemoryUnit, TimeSpan, Trace, Turn

SCHEMA_VERSION = 1
STORE_FILE = "memory.sqlite"
ENTITY, LOCATION = 0, 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS namespaces (
  name TEXT PRIMARY KEY, units_mode TEXT NOT NULL, traces_stale INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS turns (
  namespace TEXT NOT NULL, id TEXT NOT NULL, session_id TEXT NOT NULL, position INTEGER NOT NULL,
  speaker TEXT NOT NULL, text TEXT NOT NULL, time TEXT, PRIMARY KEY (namespace, id));
CREATE TABLE IF NOT EXISTS windows (
  namespace TEXT NOT NULL, session_id TEXT NOT NULL, idx INTEGER NOT NULL, units INTEGER NOT NULL,
  dropped INTEGER NOT NULL, PRIMARY KEY (namespace, session_id, idx));
CREATE TABLE IF NOT EXISTS units (
  namespace TEXT NOT NULL, id TEXT NOT NULL, serial INTEGER NOT NULL, sub INTEGER NOT NULL,
  session_id TEXT NOT NULL, fact_text TEXT NOT NULL, subject TEXT NOT NULL, predicate TEXT NOT NULL,
  object TEXT NOT NULL, source_turn_ids TEXT NOT NULL, source_text TEXT NOT NULL, utterance_time TEXT,
  fact_time TEXT NOT NULL, entities TEXT NOT NULL, locations TEXT NOT NULL,
  fact_emb BLOB NOT NULL, relation_emb BLOB NOT NULL, attr_emb BLOB NOT NULL,
  PRIMARY KEY (namespace, id));
CREATE INDEX IF NOT EXISTS units_order ON units (namespace, serial, sub, id);
CREATE TABLE IF NOT EXISTS sentences (
  namespace TEXT NOT NULL, unit_id TEXT NOT NULL, idx INTEGER NOT NULL, emb BLOB NOT NULL,
  PRIMARY KEY (namespace, unit_id, idx));
CREATE TABLE IF NOT EXISTS traces (
  namespace TEXT NOT NULL, id TEXT NOT NULL, relation_text TEXT NOT NULL, member_ids TEXT NOT NULL,
  trajectory TEXT NOT NULL, current_id TEXT NOT NULL, PRIMARY KEY (namespace, id));
"""


@dataclass
class AttributeIndex:
    """Embedded entities (kind 0) and locations (kind 1) of all units of a namespace, one row each."""

    unit_index: np.ndarray
    kind: np.ndarray
    texts: list[str]
    embeddings: np.ndarray


@dataclass
class NamespaceMemory:
    """Everything activation needs from one namespace, loaded in one read."""

    namespace: str
    units: list[MemoryUnit]
    fact_embeddings: np.ndarray
    attributes: AttributeIndex
    traces: list[Trace]
    trace_of: dict[str, str]
    turns: dict[str, Turn]
    turn_time: dict[str, str | None]
    embedder_id: str
    sentence_embeddings: np.ndarray | None = None
    """(S, d) embeddings of the sentences of multi-sentence facts, grouped by unit in unit order."""
    sentence_unit: np.ndarray | None = None
    """(S,) row in ``units`` of each sentence embedding."""
    previous_turn: dict[str, str] = field(default_factory=dict)
    """Id of the turn before each turn in the same session (first turns have none)."""


@dataclass
class EmbeddedUnit:
    """A unit ready to store: its fact, relation and attribute embeddings (attributes: entities, then locations)."""

    unit: MemoryUnit
    fact_embedding: np.ndarray
    relation_embedding: np.ndarray
    attribute_embeddings: np.ndarray
    sentence_embeddings: np.ndarray | None = None
    """One row per sentence of a multi-sentence fact (see :func:`~qgmem_train.memory.sentences.fact_sentences`)."""


@dataclass
class WindowResult:
    """What one window produced: its kept units, and how many outputs were dropped on the way."""

    session_id: str
    index: int
    units: list[EmbeddedUnit]
    dropped: int = 0


def _blob(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, dtype=np.float32).tobytes()


class MemoryStore:
    """A directory holding ``memory.sqlite``; namespaces separate users or conversations."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection

    @classmethod
    def open(cls, path: str | Path, *, create: bool = False) -> MemoryStore:
        """Open the store in directory ``path``; ``create`` makes it when missing."""
        path = Path(path)
        file = path / STORE_FILE
        if not file.exists():
            if not create:
                raise InputError(str(path), f"no memory store here (expected {STORE_FILE}); build one with `python -m qgmem_train build`")
            path.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(file, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            db.close()
            raise InputError(str(file), f"not a memory store: {exc}") from None
        store = cls(path, db)
        version = store._meta("schema_version")
        if version is None:
            with store.transaction():
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(version) != SCHEMA_VERSION:
            db.close()
            raise InputError(str(file), f"store schema version {version}, this code reads version {SCHEMA_VERSION}")
        return store

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: everything inside commits together or not at all."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    @property
    def embedder_id(self) -> str | None:
        """Id of the embedder every vector in this store came from (None while empty)."""
        return self._meta("embedder_id")

    @property
    def dim(self) -> int | None:
        """Embedding dimension recorded with the embedder."""
        value = self._meta("dim")
        return int(value) if value else None

    def namespaces(self) -> list[str]:
        """Names of the namespaces in the store."""
        return [r[0] for r in self._db.execute("SELECT name FROM namespaces ORDER BY name")]

    def ensure_namespace(self, namespace: str, units_mode: str, embedder_id: str, dim: int) -> None:
        """Create ``namespace`` (and record the embedder); refuse a different embedder or units mode."""
        known_embedder = self.embedder_id
        if known_embedder is not None and (known_embedder != embedder_id or self.dim != dim):
            raise InputError(str(self.path), f"store was built with embedder {known_embedder} ({self.dim}-d), not {embedder_id} ({dim}-d)")
        row = self._db.execute("SELECT units_mode FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        if row and row[0] != units_mode:
            raise InputError(f"{self.path}: namespace {namespace}", f"built with --units {row[0]}, not {units_mode}")
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('embedder_id', ?)", (embedder_id,))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('dim', ?)", (str(dim),))
            db.execute("INSERT OR IGNORE INTO namespaces (name, units_mode) VALUES (?, ?)", (namespace, units_mode))

    def put_turns(self, namespace: str, conversation: Conversation) -> dict[str, int]:
        """Record the conversation's turns (new ones after the existing ones); return every turn's position."""
        rows = self._db.execute("SELECT id, session_id, text, position FROM turns WHERE namespace = ?", (namespace,)).fetchall()
        known = {r[0]: r for r in rows}
        stored_sessions = {r[1] for r in rows}
        position = max((r[3] for r in rows), default=-1) + 1
        new = []
        for session in conversation.sessions:
            fresh = [t for t in session.turns if t.id not in known]
            if fresh and session.id in stored_sessions:
                raise InputError(
                    f"conversation {conversation.id}, session {session.id}, turn {fresh[0].id}",
                    f"session already stored in namespace {namespace} without this turn; a stored session cannot grow or be shared",
                )
            for turn in session.turns:
                if turn.id in known:
                    if known[turn.id][1] != session.id or known[turn.id][2] != turn.text:
                        raise InputError(f"conversation {conversation.id}, session {session.id}, turn {turn.id}", f"turn id already in namespace {namespace} with other content")
                    continue
                new.append((namespace, turn.id, session.id, position, turn.speaker, turn.text, session.time))
                position += 1
        if new:
            with self.transaction() as db:
                db.executemany("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?)", new)
        return {r[0]: r[1] for r in self._db.execute("SELECT id, position FROM turns WHERE namespace = ?", (namespace,))}

    def done_windows(self, namespace: str) -> set[tuple[str, int]]:
        """(session id, window index) of every window already committed."""
        return {(r[0], r[1]) for r in self._db.execute("SELECT session_id, idx FROM windows WHERE namespace = ?", (namespace,))}

    def add_windows(self, namespace: str, results: Sequence[WindowResult]) -> None:
        """Commit the units of finished windows together with their progress rows."""
        rows, sentence_rows = [], []
        for result in results:
            for sub, item in enumerate(result.units):
                u = item.unit
                if item.sentence_embeddings is not None:
                    sentence_rows += [(namespace, u.id, i, _blob(v)) for i, v in enumerate(item.sentence_embeddings)]
                rows.append((
                    namespace, u.id, u.serial, sub, u.session_id, u.fact_text, u.subject, u.predicate, u.object,
                    json.dumps(u.source_turn_ids), u.source_text, u.utterance_time,
                    json.dumps([asdict(t) for t in u.fact_time]), json.dumps(u.entities), json.dumps(u.locations),
                    _blob(item.fact_embedding), _blob(item.relation_embedding), _blob(item.attribute_embeddings),
                ))
        with self.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO units VALUES (" + ", ".join("?" * 18) + ")", rows)
            db.executemany("DELETE FROM sentences WHERE namespace = ? AND unit_id = ?", [(namespace, r[1]) for r in rows])
            db.executemany("INSERT INTO sentences VALUES (?, ?, ?, ?)", sentence_rows)
            db.executemany(
                "INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?, ?)",
                [(namespace, r.session_id, r.index, len(r.units), r.dropped) for r in results],
            )
            db.execute("UPDATE namespaces SET traces_stale = 1 WHERE name = ?", (namespace,))

    def count_units(self, namespace: str) -> int:
        """Number of units stored in ``namespace``."""
        return int(self._db.execute("SELECT COUNT(*) FROM units WHERE namespace = ?", (namespace,)).fetchone()[0])

    def count_traces(self, namespace: str) -> int:
        """Number of traces stored in ``namespace``."""
        return int(self._db.execute("SELECT COUNT(*) FROM traces WHERE namespace = ?", (namespace,)).fetchone()[0])

    def dropped_outputs(self, namespace: str) -> int:
        """Outputs dropped over all committed windows of ``namespace``."""
        return int(self._db.execute("SELECT COALESCE(SUM(dropped), 0) FROM windows WHERE namespace = ?", (namespace,)).fetchone()[0])

    def traces_stale(self, namespace: str) -> bool:
        """Whether units were added since the traces were last consolidated."""
        row = self._db.execute("SELECT traces_stale FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        return bool(row and row[0])

    def relation_embeddings(self, namespace: str) -> np.ndarray:
        """(N, d) relation embeddings in unit order (the order of :meth:`load_namespace`)."""
        blobs = [r[0] for r in self._db.execute("SELECT relation_emb FROM units WHERE namespace = ? ORDER BY serial, sub, id", (namespace,))]
        return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1) if blobs else np.zeros((0, self.dim or 0), np.float32)

    def put_traces(self, namespace: str, traces: Sequence[Trace]) -> None:
        """Insert or replace ``traces`` in one transaction."""
        with self.transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO traces VALUES (?, ?, ?, ?, ?, ?)",
                [(namespace, t.id, t.relation_text, json.dumps(t.member_ids), t.trajectory, t.current_id) for t in traces],
            )

    def finish_traces(self, namespace: str, keep_ids: set[str]) -> None:
        """Delete traces not in ``keep_ids`` and mark the namespace's traces up to date, atomically."""
        with self.transaction() as db:
            stale = [r[0] for r in db.execute("SELECT id FROM traces WHERE namespace = ?", (namespace,)) if r[0] not in keep_ids]
            db.executemany("DELETE FROM traces WHERE namespace = ? AND id = ?", [(namespace, t) for t in stale])
            db.execute("UPDATE namespaces SET traces_stale = 0 WHERE name = ?", (namespace,))

    def load_traces(self, namespace: str) -> list[Trace]:
        """The namespace's traces, ordered by id."""
        rows = self._db.execute("SELECT id, relation_text, member_ids, trajectory, current_id FROM traces WHERE namespace = ? ORDER BY id", (namespace,))
        return [Trace(r[0], r[1], json.loads(r[2]), r[3], r[4]) for r in rows]

    def require_namespaces(self, namespaces: Iterable[str]) -> None:
        """Refuse, before any model loads, a run over namespaces this store does not hold."""
        missing = sorted(set(namespaces) - set(self.namespaces()))
        if missing:
            raise InputError(f"{self.path}: namespace {missing[0]}", "not in the store (build it from the same input first)")

    def load_namespace(self, namespace: str, *, embedder_id: str | None = None) -> NamespaceMemory:
        """All units, embeddings, attributes, traces and turns of ``namespace``.

        With ``embedder_id``, a namespace built with another embedder is refused (its vectors would not
        compare with the queries').
        """
        if self._db.execute("SELECT 1 FROM namespaces WHERE name = ?", (namespace,)).fetchone() is None:
            raise InputError(f"{self.path}: namespace {namespace}", f"not in this store (namespaces: {', '.join(self.namespaces()) or 'none'})")
        if embedder_id is not None and self.embedder_id != embedder_id:
            raise InputError(f"{self.path}: namespace {namespace}", f"built with embedder {self.embedder_id!r}, configured {embedder_id!r}")
        dim = self.dim or 0
        rows = self._db.execute(
            "SELECT id, session_id, fact_text, subject, predicate, object, source_turn_ids, source_text, utterance_time, "
            "serial, fact_time, entities, locations, fact_emb, attr_emb FROM units WHERE namespace = ? ORDER BY serial, sub, id",
            (namespace,),
        ).fetchall()
        units, fact_blobs, attr_blobs = [], [], []
        unit_index, kinds, texts = [], [], []
        for i, r in enumerate(rows):
            entities, locations = json.loads(r[11]), json.loads(r[12])
            units.append(MemoryUnit(
                id=r[0], session_id=r[1], fact_text=r[2], subject=r[3], predicate=r[4], object=r[5],
                source_turn_ids=json.loads(r[6]), source_text=r[7], utterance_time=r[8], serial=r[9],
                fact_time=[TimeSpan(**t) for t in json.loads(r[10])], entities=entities, locations=locations,
            ))
            fact_blobs.append(r[13])
            attr_blobs.append(r[14])
            unit_index += [i] * (len(entities) + len(locations))
            kinds += [ENTITY] * len(entities) + [LOCATION] * len(locations)
            texts += entities + locations
        facts = np.frombuffer(b"".join(fact_blobs), dtype=np.float32).reshape(len(units), dim)
        attrs = np.frombuffer(b"".join(attr_blobs), dtype=np.float32).reshape(len(texts), dim)
        traces = self.load_traces(namespace)
        turns, turn_time, previous_turn = {}, {}, {}
        last: tuple[str, str] | None = None
        for r in self._db.execute("SELECT id, speaker, text, time, session_id FROM turns WHERE namespace = ? ORDER BY position", (namespace,)):
            turns[r[0]] = Turn(r[0], r[1], r[2])
            turn_time[r[0]] = r[3]
            if last is not None and last[1] == r[4]:
                previous_turn[r[0]] = last[0]
            last = (r[0], r[4])
        sentence_embeddings, sentence_unit = self._load_sentences(namespace, {u.id: i for i, u in enumerate(units)}, dim)
        return NamespaceMemory(
            namespace=namespace,
            units=units,
            fact_embeddings=facts,
            attributes=AttributeIndex(np.asarray(unit_index, np.int64), np.asarray(kinds, np.int8), texts, attrs),
            traces=traces,
            trace_of={m: t.id for t in traces for m in t.member_ids},
            turns=turns,
            turn_time=turn_time,
            embedder_id=self.embedder_id or "",
            sentence_embeddings=sentence_embeddings,
            sentence_unit=sentence_unit,
            previous_turn=previous_turn,
        )

    def _load_sentences(self, namespace: str, row_of: dict[str, int], dim: int) -> tuple[np.ndarray, np.ndarray]:
        """Sentence embeddings of ``namespace`` and the unit row of each, grouped by unit in unit order."""
        rows = self._db.execute("SELECT unit_id, emb FROM sentences WHERE namespace = ? ORDER BY unit_id, idx", (namespace,)).fetchall()
        owners = np.asarray([row_of[r[0]] for r in rows], np.int64)
        vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), dim)
        order = np.argsort(owners, kind="stable")
        return vectors[order], owners[order]
