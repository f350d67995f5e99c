"""The persistent memory store: one SQLite file (WAL mode) holding turns, units, traces and embeddings.

Every build step commits in one transaction together with its progress record, so a build killed at any
moment leaves a store that opens, and the next build resumes at the first window not yet committed.
Many processes and threads may write at once: each write decides from what it reads inside its own
transaction (see :mod:`qgmem_train.memory.store_file`), and every namespace counts its writes
(:meth:`MemoryStore.generation`) so that caches and trace consolidation notice other writers.
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
from qgmem_train.memory.store_file import BUSY_TIMEOUT_S, StoreFile
from qgmem_train.memory.types import Conversation, MemoryUnit, TimeSpan, Trace, Turn

STORE_FILE = "memory.sqlite"
ENTITY, LOCATION = 0, 1


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
    generation: int = 0
    """The namespace's write count when it was read (see :meth:`MemoryStore.generation`)."""
    units_generation: int = 0
    """Its count of unit writes then: traces computed from these units are stored only while it holds."""


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


class UnitsChanged(Exception):
    """Traces computed from a namespace's units were not stored: another writer has added units since they were read."""


class MemoryStore:
    """A directory holding ``memory.sqlite``; namespaces separate users or conversations.

    One handle may serve many threads (each gets its own connection); many processes may open the same store.
    """

    def __init__(self, path: Path, file: StoreFile) -> None:
        self.path = path
        self._file = file

    @classmethod
    def open(cls, path: str | Path, *, create: bool = False, busy_timeout: float = BUSY_TIMEOUT_S) -> MemoryStore:
        """Open the store in directory ``path``; ``create`` makes it when missing.

        A write waits up to ``busy_timeout`` seconds for other writers, then fails with
        :class:`~qgmem_train.memory.store_file.StoreLockedError` (an :class:`InputError`).
        """
        path = Path(path)
        file = path / STORE_FILE
        if not file.exists():
            if not create:
                raise InputError(str(path), f"no memory store here (expected {STORE_FILE}); build one with `python -m qgmem_train build`")
            path.mkdir(parents=True, exist_ok=True)
        return cls(path, StoreFile.open(file, busy_timeout))

    @property
    def _db(self) -> sqlite3.Connection:
        return self._file.db

    def close(self) -> None:
        """Close the database connections of every thread."""
        self._file.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write holding the write lock from its first read: everything inside commits together or not at all."""
        with self._file.transaction() as db:
            yield db

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """Reads inside see one state of the store, whatever other writers commit meanwhile."""
        with self._file.snapshot() as db:
            yield db

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
        with self.transaction() as db:
            known_embedder = self.embedder_id
            if known_embedder is not None and (known_embedder != embedder_id or self.dim != dim):
                raise InputError(str(self.path), f"store was built with embedder {known_embedder} ({self.dim}-d), not {embedder_id} ({dim}-d)")
            row = db.execute("SELECT units_mode FROM namespaces WHERE name = ?", (namespace,)).fetchone()
            if row and row[0] != units_mode:
                raise InputError(f"{self.path}: namespace {namespace}", f"built with --units {row[0]}, not {units_mode}")
            db.execute("INSERT OR IGNORE INTO meta VALUES ('embedder_id', ?)", (embedder_id,))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('dim', ?)", (str(dim),))
            db.execute("INSERT OR IGNORE INTO namespaces (name, units_mode) VALUES (?, ?)", (namespace, units_mode))

    def put_turns(self, namespace: str, conversation: Conversation) -> dict[str, int]:
        """Record the conversation's turns (new ones after the existing ones); return every turn's position.

        Turns already stored with the same session and text are kept as they are, so a retried call adds nothing.
        """
        with self.transaction() as db:
            return self._put_turns(db, namespace, conversation)

    @staticmethod
    def _put_turns(db: sqlite3.Connection, namespace: str, conversation: Conversation) -> dict[str, int]:
        rows = db.execute("SELECT id, session_id, text, position FROM turns WHERE namespace = ?", (namespace,)).fetchall()
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
            db.executemany("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?)", new)
            db.execute("UPDATE namespaces SET generation = generation + 1 WHERE name = ?", (namespace,))
        return {r[0]: r[1] for r in db.execute("SELECT id, position FROM turns WHERE namespace = ?", (namespace,))}

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
            db.execute(
                "UPDATE namespaces SET traces_stale = 1, generation = generation + 1, units_generation = units_generation + 1 WHERE name = ?",
                (namespace,),
            )

    def count_units(self, namespace: str) -> int:
        """Number of units stored in ``namespace``."""
        return int(self._db.execute("SELECT COUNT(*) FROM units WHERE namespace = ?", (namespace,)).fetchone()[0])

    def count_traces(self, namespace: str) -> int:
        """Number of traces stored in ``namespace``."""
        return int(self._db.execute("SELECT COUNT(*) FROM traces WHERE namespace = ?", (namespace,)).fetchone()[0])

    def dropped_outputs(self, namespace: str) -> int:
        """Outputs dropped over all committed windows of ``namespace``."""
        return int(self._db.execute("SELECT COALESCE(SUM(dropped), 0) FROM windows WHERE namespace = ?", (namespace,)).fetchone()[0])

    def generation(self, namespace: str) -> int:
        """How many writes ``namespace`` has had, by any process: equal generations mean the same content."""
        row = self._db.execute("SELECT generation FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        return int(row[0]) if row else 0

    def traces_stale(self, namespace: str) -> bool:
        """Whether units were added since the traces were last consolidated."""
        row = self._db.execute("SELECT traces_stale FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        return bool(row and row[0])

    def relation_embeddings(self, namespace: str) -> np.ndarray:
        """(N, d) relation embeddings in unit order (the order of :meth:`load_namespace`)."""
        blobs = [r[0] for r in self._db.execute("SELECT relation_emb FROM units WHERE namespace = ? ORDER BY serial, sub, id", (namespace,))]
        return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1) if blobs else np.zeros((0, self.dim or 0), np.float32)

    def put_traces(self, namespace: str, traces: Sequence[Trace], *, units_generation: int | None = None) -> None:
        """Insert or replace ``traces`` in one transaction.

        ``units_generation``: that of the units the traces were computed from (:attr:`NamespaceMemory.units_generation`);
        when another writer has added units since, nothing is written and :class:`UnitsChanged` is raised.
        """
        with self.transaction() as db:
            self._require_units_generation(db, namespace, units_generation)
            db.executemany(
                "INSERT OR REPLACE INTO traces VALUES (?, ?, ?, ?, ?, ?)",
                [(namespace, t.id, t.relation_text, json.dumps(t.member_ids), t.trajectory, t.current_id) for t in traces],
            )
            db.execute("UPDATE namespaces SET generation = generation + 1 WHERE name = ?", (namespace,))

    def finish_traces(self, namespace: str, keep_ids: set[str], *, units_generation: int | None = None) -> None:
        """Delete traces not in ``keep_ids`` and mark the namespace's traces up to date, atomically (``units_generation``: as in :meth:`put_traces`)."""
        with self.transaction() as db:
            self._require_units_generation(db, namespace, units_generation)
            stale = [r[0] for r in db.execute("SELECT id FROM traces WHERE namespace = ?", (namespace,)) if r[0] not in keep_ids]
            db.executemany("DELETE FROM traces WHERE namespace = ? AND id = ?", [(namespace, t) for t in stale])
            db.execute("UPDATE namespaces SET traces_stale = 0, generation = generation + 1 WHERE name = ?", (namespace,))

    @staticmethod
    def _require_units_generation(db: sqlite3.Connection, namespace: str, expected: int | None) -> None:
        row = db.execute("SELECT units_generation FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        if expected is not None and (row is None or row[0] != expected):
            raise UnitsChanged(f"namespace {namespace}: units changed since the traces were computed")

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
        compare with the queries'). A missing namespace is named alone: the store's other namespaces are
        other users' and stay unlisted. Everything is read in one snapshot, consistent while others write.
        """
        with self.snapshot():
            return self._load_namespace(namespace, embedder_id)

    def _load_namespace(self, namespace: str, embedder_id: str | None) -> NamespaceMemory:
        generations = self._db.execute("SELECT generation, units_generation FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        if generations is None:
            raise InputError(f"{self.path}: namespace {namespace}", "not in this store")
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
            generation=generations[0],
            units_generation=generations[1],
        )

    def _load_sentences(self, namespace: str, row_of: dict[str, int], dim: int) -> tuple[np.ndarray, np.ndarray]:
        """Sentence embeddings of ``namespace`` and the unit row of each, grouped by unit in unit order."""
        rows = self._db.execute("SELECT unit_id, emb FROM sentences WHERE namespace = ? ORDER BY unit_id, idx", (namespace,)).fetchall()
        owners = np.asarray([row_of[r[0]] for r in rows], np.int64)
        vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), dim)
        order = np.argsort(owners, kind="stable")
        return vectors[order], owners[order]
