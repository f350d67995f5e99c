"""The persistent memory store: one SQLite file (WAL mode) holding turns, units, traces and embeddings.

Every build step commits in one transaction together with its progress record, so a build killed at any
moment leaves a store that opens, and the next build resumes at the first window not yet committed.
Many processes and threads may write at once: each write decides from what it reads inside its own
transaction (see :mod:`qgmem_train.memory.store_file`), and every namespace counts its writes
(:meth:`MemoryStore.generation`) so that caches and trace consolidation notice other writers.

Units and turns are stored column by column, one segment per write (:mod:`qgmem_train.memory.segments`):
a namespace loads with a few queries, its vectors memory-mapped from per-segment sidecar files
(:mod:`qgmem_train.memory.sidecar`) and its texts decoded only when read
(:class:`~qgmem_train.memory.unit_table.UnitView`). ``unit_keys`` maps each unit id to its segment, so a
unit written again replaces the stored one.

A namespace records how its conversations were cut into windows (units mode, window, overlap): the
windows a build skips as done are those of that cut, so a build asking another cut is refused. A
namespace written before the cut was recorded (schema version 2 or older) takes the cut of the first
build that writes to it after the upgrade.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from qgmem_train.errors import InputError
from qgmem_train.memory import segments, sidecar, trace_graph_file
from qgmem_train.memory.columns import group_bounds, take_children
from qgmem_train.memory.row_stack import RowStack, row_blocks
from qgmem_train.memory.sidecar import SidecarMissing
from qgmem_train.memory.store_file import BUSY_TIMEOUT_S, StoreFile
from qgmem_train.memory.store_uri import is_store_uri
from qgmem_train.memory.trace_graph_file import graph_path
from qgmem_train.memory.turn_table import PreviousTurnMap, TurnMap, TurnTable, TurnTimeMap
from qgmem_train.memory.types import Conversation, MemoryUnit, Trace, Turn
from qgmem_train.memory.unit_table import ENTITY, LOCATION, SUBJECT, AttributeIndex, EmbeddedUnit, UnitTable, UnitView
from qgmem_train.vector_codes import CodeBlock

if TYPE_CHECKING:
    from qgmem_train.memory.pg_file import PgFile

__all__ = [
    "ENTITY", "LOCATION", "STORE_FILE", "SUBJECT", "AttributeIndex", "EmbeddedUnit", "MemoryStore", "NamespaceMemory",
    "SessionCut", "UnitsChanged", "WindowResult", "describe_cut",
]  # fmt: skip

STORE_FILE = "memory.sqlite"
OWN_FOLDERS = (sidecar.FOLDER, trace_graph_file.FOLDER)
"""The folders a store writes and removes files in, beside its SQLite file: never links, so no write reaches outside the store."""
LOAD_ATTEMPTS = 3
"""Reads of a namespace tried before giving up when writers keep replacing the segments read (see :mod:`~qgmem_train.memory.sidecar`)."""
GROWN_BLOCKS_MAX = 32
"""Vector blocks a memory grown by :meth:`MemoryStore.load_additions` holds at most; beyond, the namespace is read whole
(as the store has merged its segments), so that a long-lived index neither scans many small blocks nor keeps the
files of merged-away segments mapped."""
NAMESPACE_TABLES = ("turns", "windows", "unit_keys", "segments", "segment_parts", "traces")
"""The tables whose rows belong to one namespace (its ``namespace`` column), less those of its vectors (``segment_files``
or ``segment_vectors``, see :class:`~qgmem_train.memory.segments.VectorStorage`); ``namespaces`` holds the namespace itself."""


def incarnation_key(namespace: str) -> str:
    """The ``meta`` key of the namespace's incarnation id (see :meth:`MemoryStore.version`)."""
    return f"incarnation/{namespace}"


def describe_cut(units_mode: str, window: int | None, overlap: int | None) -> str:
    """How a namespace is cut into windows, in words (``units turns, window 6, overlap 2``)."""
    parts = [f"units {units_mode}"]
    parts += [f"window {window}, overlap {overlap}"] if window is not None else ["window and overlap not recorded"]
    return ", ".join(parts)


@dataclass
class NamespaceMemory:
    """Everything activation needs from one namespace, loaded in one read."""

    namespace: str
    units: Sequence[MemoryUnit]
    """The units in unit order (loaded: a :class:`~qgmem_train.memory.unit_table.UnitView`, decoding each unit when first read)."""
    fact_embeddings: np.ndarray | RowStack
    """(N, d) fact embeddings in unit order: one segment's mapped array, or a :class:`RowStack` of several segments' (not copied)."""
    attributes: AttributeIndex
    traces: list[Trace]
    trace_of: dict[str, str]
    turns: Mapping[str, Turn]
    """Turn by id, in conversation order."""
    turn_time: Mapping[str, str | None]
    embedder_id: str
    sentence_embeddings: np.ndarray | RowStack | None = None
    """(S, d) embeddings of the sentences of multi-sentence facts, grouped by unit in unit order (mapped, as the facts)."""
    sentence_unit: np.ndarray | None = None
    """(S,) row in ``units`` of each sentence embedding."""
    previous_turn: Mapping[str, str] = field(default_factory=dict)
    """Id of the turn before each turn in the same session (first turns have none)."""
    generation: int = 0
    """The namespace's write count when it was read (see :meth:`MemoryStore.generation`)."""
    units_generation: int = 0
    """Its count of unit writes then: traces computed from these units are stored only while it holds."""
    relation_embeddings: np.ndarray | RowStack | None = None
    """(N, d) relation embeddings in unit order, when asked for (trace consolidation reads them; retrieval does not)."""
    code_blocks: list[CodeBlock] | None = None
    """The codes of the facts and sentence vectors, from each segment's codes file (int8 mapped, product-quantised read),
    when loaded with the sentences from segments that all have one (the dense channel searches them rather than encoding)."""
    incarnation: str = ""
    """The namespace's incarnation when it was read (see :meth:`MemoryStore.version`)."""
    segments: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    """(seq, rows, level) of each unit and turn segment read, by kind: what :meth:`MemoryStore.load_additions` reads beyond."""


@dataclass
class WindowResult:
    """What one window produced: its kept units, and how many outputs were dropped on the way."""

    session_id: str
    index: int
    units: list[EmbeddedUnit]
    dropped: int = 0
    new_turns: frozenset[str] = frozenset()
    """Ids of the window's new turns: when the window was committed before (its session grew since), the units it had
    from these turns are replaced by ``units``."""


class SessionCut(NamedTuple):
    """What a build records of a namespace it writes: units mode, embedder and dimension, window and overlap."""

    units_mode: str
    embedder_id: str
    dim: int
    window: int | None
    overlap: int | None


class _RolledBack(Exception):
    """Ends :meth:`MemoryStore.plan_session`'s transaction (rolling it back) with the positions it found."""

    def __init__(self, positions: dict[str, int]) -> None:
        super().__init__("rolled back")
        self.positions = positions


class UnitsChanged(Exception):
    """Traces computed from a namespace's units were not stored: another writer has added units since they were read."""


class MemoryStore:
    """A directory holding ``memory.sqlite``, or a PostgreSQL database; namespaces separate users or conversations.

    One handle may serve many threads (each gets its own connection); many processes may open the same store.
    """

    def __init__(self, path: Path | str, file: StoreFile | PgFile, folder: Path | None = None) -> None:
        self.path = path
        """What messages call the store: its folder, or ``postgresql database <name>`` (never the URI, see :func:`~qgmem_train.memory.store_uri.shown_store`)."""
        self.folder = folder
        """The store's folder (None for a PostgreSQL store: it keeps no files)."""
        self._file = file

    @classmethod
    def open(cls, path: str | Path, *, create: bool = False, busy_timeout: float = BUSY_TIMEOUT_S) -> MemoryStore:
        """Open the store in directory ``path``, or the PostgreSQL store at a ``postgresql://`` URI
        (:mod:`qgmem_train.memory.pg_file`); ``create`` makes it when missing (in a new or empty folder only).

        A store whose ``vectors/`` or ``trace_graphs/`` is a link is refused: writes remove and replace files there.

        A write waits up to ``busy_timeout`` seconds for other writers, then fails with
        :class:`~qgmem_train.memory.store_file.StoreLockedError` (an :class:`InputError`).
        """
        if is_store_uri(path):
            from qgmem_train.memory.pg_file import PgFile

            file = PgFile.open(str(path), create=create, busy_timeout=busy_timeout)
            return cls(file.name, file)
        path = Path(path)
        file = path / STORE_FILE
        if not file.exists():
            if not create:
                raise InputError(str(path), f"no memory store here (expected {STORE_FILE}); build one with `python -m qgmem_train build`")
            if path.exists() and (not path.is_dir() or any(path.iterdir())):
                raise InputError(str(path), f"not a memory store, and not empty (no {STORE_FILE}); name a new or empty folder for the store")
            path.mkdir(parents=True, exist_ok=True)
        for folder in OWN_FOLDERS:
            if (path / folder).is_symlink():
                raise InputError(str(path / folder), f"a link to {os.readlink(path / folder)}; a store's folders must be its own (replace the link with the folder it names)")
        return cls(path, StoreFile.open(file, busy_timeout), path)

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
    def transaction(self, namespace: str | None = None) -> Iterator[sqlite3.Connection]:
        """One atomic write holding the write lock from its first read: everything inside commits together or not at all.

        ``namespace``: the one it writes (an SQLite store locks the whole file; a PostgreSQL store locks the namespace).
        """
        with self._file.transaction(namespace) as db:
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

    def has_namespace(self, namespace: str) -> bool:
        """Whether ``namespace`` is in the store (one row looked up)."""
        return self._db.execute("SELECT 1 FROM namespaces WHERE name = ?", (namespace,)).fetchone() is not None

    def namespaces_page(self, names: Collection[str], prefixes: Sequence[str], after: str | None, limit: int) -> list[str]:
        """At most ``limit`` namespaces named in ``names`` or starting with one of ``prefixes``, in name order after
        ``after`` (a key cursor: the last name of the page before)."""
        if not names and not prefixes:
            return []
        matches = ["name IN (" + ", ".join("?" * len(names)) + ")"] if names else []
        matches += ["substr(name, 1, ?) = ?"] * len(prefixes)
        params: list[object] = [*names, *(value for prefix in prefixes for value in (len(prefix), prefix))]
        query = f"SELECT name FROM namespaces WHERE ({' OR '.join(matches)}) AND name > ? ORDER BY name LIMIT ?"
        return [r[0] for r in self._db.execute(query, (*params, after or "", limit))]

    def units_page(self, namespace: str, offset: int, limit: int) -> list[MemoryUnit]:
        """At most ``limit`` units of ``namespace`` from ``offset``, in the order of their segments then ids: only the
        segments holding them are read, without vectors."""
        with self.snapshot() as db:
            keys = db.execute("SELECT id, seq FROM unit_keys WHERE namespace = ? ORDER BY seq, id LIMIT ? OFFSET ?", (namespace, limit, offset)).fetchall()
            if not keys:
                return []
            table = segments.read_units(db, namespace, self.dim or 0, (), min(seq for _, seq in keys), max(seq for _, seq in keys))
        row_of = {unit_id: row for row, unit_id in enumerate(table.ids.tolist())}
        view = UnitView(table)
        return [view[row_of[unit_id]] for unit_id, _ in keys]

    def count_sessions(self, namespace: str) -> int:
        """Number of sessions with turns stored in ``namespace``."""
        return int(self._db.execute("SELECT COUNT(DISTINCT session_id) FROM turns WHERE namespace = ?", (namespace,)).fetchone()[0])

    def sessions_page(self, namespace: str, offset: int, limit: int) -> list[dict[str, object]]:
        """At most ``limit`` sessions of ``namespace`` from ``offset`` in id order: ``{session_id, turns, time}`` each."""
        query = "SELECT session_id, COUNT(*), MIN(time) FROM turns WHERE namespace = ? GROUP BY session_id ORDER BY session_id LIMIT ? OFFSET ?"
        return [{"session_id": r[0], "turns": int(r[1]), "time": r[2]} for r in self._db.execute(query, (namespace, limit, offset))]

    def session_summary(self, namespace: str, session_id: str) -> dict[str, object] | None:
        """``{session_id, turns, time}`` of one session, or None when it has no turns in ``namespace``."""
        row = self._db.execute("SELECT COUNT(*), MIN(time) FROM turns WHERE namespace = ? AND session_id = ?", (namespace, session_id)).fetchone()
        return {"session_id": session_id, "turns": int(row[0]), "time": row[1]} if row[0] else None

    def session_turns(self, namespace: str, session_id: str, offset: int = 0, limit: int | None = None) -> list[dict[str, str | None]]:
        """The turns of one session in order (``{id, speaker, text, time}``): ``limit`` of them from ``offset``, or all (None)."""
        query = "SELECT id, speaker, text, time FROM turns WHERE namespace = ? AND session_id = ? ORDER BY position"
        params: tuple[object, ...] = (namespace, session_id)
        if limit is not None:
            query, params = f"{query} LIMIT ? OFFSET ?", (*params, limit, offset)
        return [{"id": r[0], "speaker": r[1], "text": r[2], "time": r[3]} for r in self._db.execute(query, params)]

    def ensure_namespace(
        self, namespace: str, units_mode: str, embedder_id: str, dim: int, *, window: int | None = None, overlap: int | None = None
    ) -> None:
        """Create ``namespace`` (and record the embedder and the cut); refuse a different embedder or cut.

        ``window`` and ``overlap`` are the build's windows (none for writers that cut no windows); a
        namespace without a recorded cut takes them.
        """
        with self.transaction(namespace) as db:
            self._ensure_namespace(db, namespace, units_mode, embedder_id, dim, window, overlap)

    def _ensure_namespace(self, db: sqlite3.Connection, namespace: str, units_mode: str, embedder_id: str, dim: int, window: int | None, overlap: int | None) -> None:
        db.execute("INSERT INTO meta VALUES ('embedder_id', ?) ON CONFLICT DO NOTHING", (embedder_id,))
        db.execute("INSERT INTO meta VALUES ('dim', ?) ON CONFLICT DO NOTHING", (str(dim),))
        known_embedder = self.embedder_id  # read after writing it, so that a writer of another namespace that recorded it first is seen
        if known_embedder != embedder_id or self.dim != dim:
            raise InputError(str(self.path), f"store was built with embedder {known_embedder} ({self.dim}-d), not {embedder_id} ({dim}-d)")
        self._refuse_another_cut(db, namespace, units_mode, window, overlap)
        db.execute("INSERT INTO namespaces (name, units_mode) VALUES (?, ?) ON CONFLICT DO NOTHING", (namespace, units_mode))
        db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT DO NOTHING", (incarnation_key(namespace), uuid.uuid4().hex))
        if window is not None:
            db.execute("UPDATE namespaces SET cut_window = ?, cut_overlap = ? WHERE name = ? AND cut_window IS NULL", (window, overlap, namespace))

    def plan_session(self, namespace: str, cut: SessionCut, conversation: Conversation, *, grow: bool = False) -> dict[str, int]:
        """The turn positions :meth:`commit_session` will give ``conversation``'s turns, found by making its checks and
        writes (the namespace's embedder and cut, the turns) in a transaction that is rolled back: nothing is written.
        ``grow``: as in :meth:`put_turns`."""
        try:
            with self.transaction(namespace) as db:
                self._ensure_namespace(db, namespace, *cut)
                positions = self._put_turns(db, namespace, conversation, grow=grow)
                raise _RolledBack(positions)
        except _RolledBack as planned:
            return planned.positions

    def commit_session(
        self, namespace: str, cut: SessionCut, conversation: Conversation, results: Sequence[WindowResult], positions: dict[str, int], *, grow: bool = False
    ) -> None:
        """The namespace (made when new), ``conversation``'s turns and the units of its windows in one transaction, so a
        writer killed before it commits leaves no trace of the session, not even a new namespace. ``positions`` are
        :meth:`plan_session`'s: a store that gave the turns others meanwhile is refused (the retried call builds again).
        ``grow``: as in :meth:`put_turns`."""
        with self.transaction(namespace) as db:
            self._ensure_namespace(db, namespace, *cut)
            if self._put_turns(db, namespace, conversation, grow=grow) != positions:
                raise InputError(f"{self.path}: namespace {namespace}", "turns were added by another writer while this session was built; send it again")
            self._add_windows(db, namespace, results)

    def check_cut(self, namespace: str, units_mode: str, window: int, overlap: int) -> None:
        """Refuse, before anything is written, a build of ``namespace`` cut otherwise than the namespace was."""
        with self.snapshot() as db:
            self._refuse_another_cut(db, namespace, units_mode, window, overlap)

    def _refuse_another_cut(self, db: sqlite3.Connection, namespace: str, units_mode: str, window: int | None, overlap: int | None) -> None:
        row = db.execute("SELECT units_mode, cut_window, cut_overlap FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        if row is None:
            return
        stored_units, stored_window, stored_overlap = row
        other_windows = None not in (window, stored_window) and (stored_window, stored_overlap) != (window, overlap)
        if stored_units != units_mode or other_windows:
            raise InputError(
                f"{self.path}: namespace {namespace}",
                f"cut with {describe_cut(stored_units, stored_window, stored_overlap)}; this build asks {describe_cut(units_mode, window, overlap)} "
                "(build into another namespace or store, or with the namespace's settings)",
            )

    def put_turns(self, namespace: str, conversation: Conversation, *, grow: bool = False) -> dict[str, int]:
        """Record the conversation's turns (new ones after the existing ones); return the position of each of them.

        Turns already stored with the same session and text are kept as they are, so a retried call adds nothing.
        A stored session given turns it lacks is refused, unless ``grow``: then they are appended to it (its turns
        stay together, in order, in the namespace's turn segments).
        """
        with self.transaction(namespace) as db:
            return self._put_turns(db, namespace, conversation, grow=grow)

    @classmethod
    def _put_turns(cls, db: sqlite3.Connection, namespace: str, conversation: Conversation, *, grow: bool = False) -> dict[str, int]:
        listed = "(SELECT value FROM json_each(?))"
        ids = json.dumps([t.id for s in conversation.sessions for t in s.turns])
        rows = db.execute(f"SELECT id, session_id, text, position FROM turns WHERE namespace = ? AND id IN {listed}", (namespace, ids))
        known = {r[0]: r for r in rows}
        sessions = json.dumps([s.id for s in conversation.sessions])
        query = f"SELECT DISTINCT session_id FROM turns WHERE namespace = ? AND session_id IN {listed}"
        stored_sessions = {r[0] for r in db.execute(query, (namespace, sessions))}
        position = db.execute("SELECT COALESCE(MAX(position), -1) + 1 FROM turns WHERE namespace = ?", (namespace,)).fetchone()[0]
        new, grown = [], []
        for session in conversation.sessions:
            fresh = [t for t in session.turns if t.id not in known]
            if fresh and session.id in stored_sessions and grow:
                grown.append(session.id)
            elif fresh and session.id in stored_sessions:
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
            rows = [(r[1], r[2], r[4], r[5], r[6]) for r in new if r[2] not in grown]
            for session_id in grown:
                cls._drop_session_turns(db, namespace, session_id)
                query = "SELECT id, session_id, speaker, text, time FROM turns WHERE namespace = ? AND session_id = ? ORDER BY position"
                rows += db.execute(query, (namespace, session_id)).fetchall()
            segments.append(db, namespace, TurnTable.from_rows(rows))
            segments.merge(db, namespace, segments.TURNS, 0)
            db.execute("UPDATE namespaces SET generation = generation + 1 WHERE name = ?", (namespace,))
        return {**{turn_id: r[3] for turn_id, r in known.items()}, **{r[1]: r[3] for r in new}}

    def done_windows(self, namespace: str) -> set[tuple[str, int]]:
        """(session id, window index) of every window already committed."""
        return {(r[0], r[1]) for r in self._db.execute("SELECT session_id, idx FROM windows WHERE namespace = ?", (namespace,))}

    def add_windows(self, namespace: str, results: Sequence[WindowResult]) -> None:
        """Commit the units of finished windows together with their progress rows.

        A unit whose id is already stored replaces the stored one (as does a later one in ``results``).
        """
        with self.transaction(namespace) as db:
            self._add_windows(db, namespace, results)

    def _add_windows(self, db: sqlite3.Connection, namespace: str, results: Sequence[WindowResult]) -> None:
        latest: dict[str, tuple[EmbeddedUnit, int]] = {}
        for result in results:
            for sub, item in enumerate(result.units):
                latest.pop(item.unit.id, None)
                latest[item.unit.id] = (item, sub)
        segments.remove_unused_sidecars(db)
        redone = [r for r in results if r.new_turns and db.execute(
            "SELECT 1 FROM windows WHERE namespace = ? AND session_id = ? AND idx = ?", (namespace, r.session_id, r.index)).fetchone()]  # fmt: skip
        for result in redone:  # a window of a grown session, built again: the units it had and no longer makes go
            self._remove_units(db, namespace, [u for u in self._session_unit_ids(db, namespace, result.session_id, result.new_turns) if u not in latest])
        if latest:
            dim = self.dim or 0
            table = UnitTable.from_embedded([i for i, _ in latest.values()], [sub for _, sub in latest.values()], dim).in_unit_order()
            if self._drop_units(db, namespace, list(latest), dim):  # what was loaded of it is no longer a part of it
                self._new_incarnation(db, namespace)
            seq = segments.append(db, namespace, table)
            db.executemany(
                "INSERT INTO unit_keys VALUES (?, ?, ?) ON CONFLICT (namespace, id) DO UPDATE SET seq = excluded.seq",
                [(namespace, unit_id, seq) for unit_id in latest],
            )
            for lo, hi in segments.merge(db, namespace, segments.UNITS, dim):
                db.execute("UPDATE unit_keys SET seq = ? WHERE namespace = ? AND seq BETWEEN ? AND ?", (lo, namespace, lo, hi))
        db.executemany(
            "INSERT INTO windows VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (namespace, session_id, idx) DO UPDATE SET units = excluded.units, dropped = excluded.dropped",
            [(namespace, r.session_id, r.index, len(r.units), r.dropped) for r in results],
        )
        db.execute(
            "UPDATE namespaces SET traces_stale = 1, generation = generation + 1, units_generation = units_generation + 1 WHERE name = ?",
            (namespace,),
        )

    @staticmethod
    def _new_incarnation(db: sqlite3.Connection, namespace: str) -> None:
        """Give ``namespace`` a new incarnation: a write that takes units out of it (it did not only grow, see :meth:`version`)."""
        db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", (incarnation_key(namespace), uuid.uuid4().hex))

    @staticmethod
    def _drop_units(db: sqlite3.Connection, namespace: str, ids: list[str], dim: int) -> bool:
        """Take the stored units with these ids out of their segments (they are about to be written again); whether any was stored."""
        found = db.execute(
            "SELECT seq, id FROM unit_keys WHERE namespace = ? AND id IN (SELECT value FROM json_each(?))", (namespace, json.dumps(ids))
        ).fetchall()
        gone: dict[int, set[str]] = {}
        for seq, unit_id in found:
            gone.setdefault(seq, set()).add(unit_id)
        levels = dict(db.execute("SELECT seq, level FROM segments WHERE namespace = ? AND kind = ?", (namespace, segments.UNITS)))
        for seq, unit_ids in gone.items():
            table = segments.read_units(db, namespace, dim, lo=seq, hi=seq)
            keep = np.flatnonzero([unit_id not in unit_ids for unit_id in table.ids.tolist()])
            segments.delete(db, namespace, segments.UNITS, seq, seq)
            if len(keep):
                segments.append(db, namespace, table.take(keep).without_unused_texts(), seq=seq, level=levels[seq])
        return bool(found)

    @staticmethod
    def _drop_session_turns(db: sqlite3.Connection, namespace: str, session_id: str) -> None:
        """Take the turns of ``session_id`` out of the namespace's turn segments (not out of the ``turns`` rows)."""
        for seq, _, level in segments.listing(db, namespace, segments.TURNS):
            table = segments.read_turns(db, namespace, seq, seq)
            keep = np.flatnonzero([s != session_id for s in table.session_ids.tolist()])
            if len(keep) == len(table):
                continue
            segments.delete(db, namespace, segments.TURNS, seq, seq)
            if len(keep):
                segments.append(db, namespace, table.take(keep), seq=seq, level=level)

    def _session_unit_ids(self, db: sqlite3.Connection, namespace: str, session_id: str, turn_ids: Collection[str] | None = None) -> list[str]:
        """Ids of the stored units of ``session_id`` (only those whose source turns are all in ``turn_ids``, when given)."""
        table = segments.read_units(db, namespace, self.dim or 0, ())
        turns, (starts, ends) = table.turn_ids.tolist(), group_bounds(table.turn_owner, len(table))
        return [
            unit_id for unit_id, sid, a, b in zip(table.ids.tolist(), table.session_ids.tolist(), starts.tolist(), ends.tolist())
            if sid == session_id and (turn_ids is None or set(turns[a:b]) <= set(turn_ids))
        ]  # fmt: skip

    def _remove_units(self, db: sqlite3.Connection, namespace: str, ids: list[str]) -> None:
        """Delete the units ``ids`` and the traces holding any of them (the namespace's traces are then stale)."""
        if not ids:
            return
        if self._drop_units(db, namespace, ids, self.dim or 0):
            self._new_incarnation(db, namespace)
        db.execute("DELETE FROM unit_keys WHERE namespace = ? AND id IN (SELECT value FROM json_each(?))", (namespace, json.dumps(ids)))
        gone = set(ids)
        traces = [r[0] for r in db.execute("SELECT id, member_ids FROM traces WHERE namespace = ?", (namespace,)) if gone & set(json.loads(r[1]))]
        db.executemany("DELETE FROM traces WHERE namespace = ? AND id = ?", [(namespace, t) for t in traces])
        db.execute("UPDATE namespaces SET traces_stale = 1, units_generation = units_generation + 1 WHERE name = ?", (namespace,))

    def delete_session(self, namespace: str, session_id: str) -> bool:
        """Delete one session of ``namespace`` in one transaction: its turns, its windows, the units built from it and
        the traces holding any of those (the namespace's traces are then stale: the next consolidation remakes them).
        Return whether it was stored. Erased as :meth:`delete_namespace` erases; the namespace stays, with its other sessions."""
        with self._file.erasing(), self.transaction(namespace) as db:
            if db.execute("SELECT 1 FROM turns WHERE namespace = ? AND session_id = ? LIMIT 1", (namespace, session_id)).fetchone() is None:
                return False
            self._remove_units(db, namespace, self._session_unit_ids(db, namespace, session_id))
            self._drop_session_turns(db, namespace, session_id)
            db.execute("DELETE FROM turns WHERE namespace = ? AND session_id = ?", (namespace, session_id))
            db.execute("DELETE FROM windows WHERE namespace = ? AND session_id = ?", (namespace, session_id))
            db.execute("UPDATE namespaces SET generation = generation + 1 WHERE name = ?", (namespace,))
            self._new_incarnation(db, namespace)  # its turns are gone too, with or without units
        with self.transaction() as db:
            segments.remove_unused_sidecars(db)
        self._file.checkpoint()
        return True

    def count_units(self, namespace: str) -> int:
        """Number of units stored in ``namespace``."""
        return int(self._db.execute("SELECT COUNT(*) FROM unit_keys WHERE namespace = ?", (namespace,)).fetchone()[0])

    def count_traces(self, namespace: str) -> int:
        """Number of traces stored in ``namespace``."""
        return int(self._db.execute("SELECT COUNT(*) FROM traces WHERE namespace = ?", (namespace,)).fetchone()[0])

    def dropped_outputs(self, namespace: str) -> int:
        """Outputs dropped over all committed windows of ``namespace``."""
        return int(self._db.execute("SELECT COALESCE(SUM(dropped), 0) FROM windows WHERE namespace = ?", (namespace,)).fetchone()[0])

    def generation(self, namespace: str) -> int:
        """How many writes ``namespace`` has had, by any process: equal generations (and equal :attr:`deletions`) mean the same content."""
        row = self._db.execute("SELECT generation FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        return int(row[0]) if row else 0

    def version(self, namespace: str) -> tuple[str, int] | None:
        """(incarnation, generation) of ``namespace``, ``None`` when it is not stored: equal versions mean the same content.

        The incarnation is written when the namespace is created and goes with its delete, so a namespace deleted and
        made again is another one; one created before incarnations were written stands for the store's
        :attr:`deletions` count instead (it then changes with any namespace's delete, as every cache's key once did).
        """
        found = self._generations(namespace)
        return None if found is None else (found[2], found[0])

    @property
    def deletions(self) -> int:
        """Namespaces deleted from the store, by any process: a namespace deleted and written again may reach its old
        :meth:`generation`, so caches key on both."""
        return int(self._meta("deletions") or 0)

    def traces_stale(self, namespace: str) -> bool:
        """Whether units were added since the traces were last consolidated."""
        row = self._db.execute("SELECT traces_stale FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        return bool(row and row[0])

    def put_traces(self, namespace: str, traces: Sequence[Trace], *, units_generation: int | None = None) -> None:
        """Insert or replace ``traces`` in one transaction.

        ``units_generation``: that of the units the traces were computed from (:attr:`NamespaceMemory.units_generation`);
        when another writer has added units since, nothing is written and :class:`UnitsChanged` is raised.
        """
        with self.transaction(namespace) as db:
            self._require_units_generation(db, namespace, units_generation)
            db.executemany(
                "INSERT INTO traces VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, id) DO UPDATE SET relation_text = excluded.relation_text, "
                "member_ids = excluded.member_ids, trajectory = excluded.trajectory, current_id = excluded.current_id",
                [(namespace, t.id, t.relation_text, json.dumps(t.member_ids), t.trajectory, t.current_id) for t in traces],
            )
            db.execute("UPDATE namespaces SET generation = generation + 1 WHERE name = ?", (namespace,))

    def finish_traces(self, namespace: str, keep_ids: set[str], *, units_generation: int | None = None) -> None:
        """Delete traces not in ``keep_ids`` and mark the namespace's traces up to date, atomically (``units_generation``: as in :meth:`put_traces`)."""
        with self.transaction(namespace) as db:
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

    def delete_namespace(self, namespace: str) -> bool:
        """Delete ``namespace`` and everything stored of it in one transaction; return whether it existed.

        In an SQLite store, deleted rows are overwritten in the file (``secure_delete``) and the log checkpointed,
        the namespace's vector sidecars and trace-graph cache removed, so no file of the store keeps its content
        (the log keeps it only while another process holds an older read open). A PostgreSQL store deletes its
        rows (vectors included) in the same transaction; the server reclaims their space at its next VACUUM.
        """
        with self._file.erasing(), self.transaction(namespace) as db:
            if db.execute("SELECT 1 FROM namespaces WHERE name = ?", (namespace,)).fetchone() is None:
                return False
            for table in NAMESPACE_TABLES:
                db.execute(f"DELETE FROM {table} WHERE namespace = ?", (namespace,))
            segments.storage_of(db).delete(db, namespace, 0, segments.LAST_SEQ)
            db.execute("DELETE FROM namespaces WHERE name = ?", (namespace,))
            self._require_deleted(db, namespace)
            db.execute("DELETE FROM meta WHERE key = ?", (incarnation_key(namespace),))
            db.execute("INSERT INTO meta VALUES ('deletions', '1') ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(meta.value AS INTEGER) + 1 AS TEXT)")
        if self.folder is not None:
            graph_path(self.folder, namespace).unlink(missing_ok=True)
        with self.transaction() as db:
            segments.remove_unused_sidecars(db)
        self._file.checkpoint()
        return True

    def _require_deleted(self, db: sqlite3.Connection, namespace: str) -> None:
        """Refuse to report ``namespace`` deleted while a row of it stays (a rule or policy of the database may keep them)."""
        for table in (*NAMESPACE_TABLES, segments.storage_of(db).table, "namespaces"):
            column = "name" if table == "namespaces" else "namespace"
            if db.execute(f"SELECT 1 FROM {table} WHERE {column} = ? LIMIT 1", (namespace,)).fetchone() is not None:
                raise InputError(f"{self.path}: namespace {namespace}", f"its rows in {table} were not deleted (the database kept them); nothing was deleted")

    def require_namespaces(self, namespaces: Iterable[str]) -> None:
        """Refuse, before any model loads, a run over namespaces this store does not hold."""
        missing = sorted(set(namespaces) - set(self.namespaces()))
        if missing:
            raise InputError(f"{self.path}: namespace {missing[0]}", "not in the store (build it from the same input first)")

    def load_namespace(
        self, namespace: str, *, embedder_id: str | None = None, sentences: bool = True, relations: bool = False
    ) -> NamespaceMemory:
        """All units, embeddings, attributes, traces and turns of ``namespace``.

        With ``embedder_id``, a namespace built with another embedder is refused (its vectors would not
        compare with the queries'). Without ``sentences`` the sentence vectors (most of a turns-mode
        namespace's bytes) are not read, for readers that do not use them (trace consolidation, retrieval
        with ``retrieval.sentence_vectors`` off); with ``relations`` the relation vectors are read too, in
        the same pass. A missing namespace is named alone: the store's other namespaces are other users'
        and stay unlisted. Everything is read in one snapshot, consistent while others write.
        """
        for _ in range(LOAD_ATTEMPTS - 1):
            try:
                with self.snapshot():
                    return self._load_namespace(namespace, embedder_id, sentences, relations)
            except SidecarMissing:
                continue
        with self.snapshot():
            return self._load_namespace(namespace, embedder_id, sentences, relations)

    def _load_namespace(self, namespace: str, embedder_id: str | None, sentences: bool, relations: bool) -> NamespaceMemory:
        generations = self._generations(namespace)
        if generations is None:
            raise InputError(f"{self.path}: namespace {namespace}", "not in this store")
        if embedder_id is not None and self.embedder_id != embedder_id:
            raise InputError(f"{self.path}: namespace {namespace}", f"built with embedder {self.embedder_id!r}, configured {embedder_id!r}")
        listings = {kind: segments.listing(self._db, namespace, kind) for kind in (segments.UNITS, segments.TURNS)}
        table, codes = self._read_units(namespace, sentences, relations)
        order = table.unit_order()
        code_blocks = None if codes is None else _code_blocks(codes, *_final_rows(table, order))
        return self._memory(namespace, table.in_unit_order(order), segments.read_turns(self._db, namespace), generations, listings,
                            code_blocks, sentences=sentences, relations=relations)  # fmt: skip

    def load_additions(self, memory: NamespaceMemory) -> NamespaceMemory | None:
        """``memory`` with what its namespace gained since it was read appended, reading only the segments written or
        merged since; ``None`` when that is not the namespace as :meth:`load_namespace` reads it now (deleted, a unit
        written again, or units added that sort before some read: read it whole), ``memory`` itself when unchanged.

        A namespace only grows while its incarnation holds: writes add units and turns (a merge keeps its segments'
        rows, the older first), and a write that replaces or removes units or turns gives the namespace a new incarnation.
        """
        for _ in range(LOAD_ATTEMPTS - 1):
            try:
                with self.snapshot():
                    return self._load_additions(memory)
            except SidecarMissing:
                continue
        with self.snapshot():
            return self._load_additions(memory)

    def _load_additions(self, memory: NamespaceMemory) -> NamespaceMemory | None:
        namespace = memory.namespace
        generations = self._generations(namespace)
        if generations is None or generations[2] != memory.incarnation or not isinstance(memory.units, UnitView) or not isinstance(memory.turns, TurnMap):
            return None
        if generations[0] == memory.generation:
            return memory
        if len(row_blocks(memory.fact_embeddings)) >= GROWN_BLOCKS_MAX:
            return None
        listings = {kind: segments.listing(self._db, namespace, kind) for kind in (segments.UNITS, segments.TURNS)}
        known, now = memory.segments[segments.UNITS], listings[segments.UNITS]
        same = _common_prefix(known, now)
        sentences, relations = memory.sentence_embeddings is not None, memory.relation_embeddings is not None
        old = memory.units.table
        table, code_blocks = old, memory.code_blocks
        if same < len(now):
            read, codes = self._read_units(namespace, sentences, relations, lo=now[same][0])
            row_of = {unit_id: row for row, unit_id in enumerate(old.ids.tolist())}
            unit_row = np.fromiter((row_of.get(unit_id, -1) for unit_id in read.ids.tolist()), np.int64, len(read))
            added = np.flatnonzero(unit_row < 0)
            if len(read) - len(added) != sum(rows for _, rows, _ in known[same:]) or (codes is None) != (code_blocks is None):
                return None
            order = added[read.take(added).unit_order()]
            if len(old) and len(order) and _unit_key(old, len(old) - 1) >= _unit_key(read, int(order[0])):
                return None  # the new units would sort among the old ones
            unit_row[order] = len(old) + np.arange(len(order))
            table = UnitTable.concat([old, read.take(order).without_unused_texts()]) if len(order) else old
            if codes is not None:
                code_blocks = [*memory.code_blocks[:same], *_code_blocks(codes, unit_row, _sentence_rows(read, unit_row, table))]  # type: ignore[index]
        turns = memory.turns.table
        known, now = memory.segments[segments.TURNS], listings[segments.TURNS]
        same = _common_prefix(known, now)
        if same < len(now):
            read_turns = segments.read_turns(self._db, namespace, lo=now[same][0])
            kept = sum(rows for _, rows, _ in known[same:])
            turns = TurnTable.concat([turns, read_turns.take(np.arange(kept, len(read_turns)))])
        return self._memory(namespace, table, turns, generations, listings, code_blocks, sentences=sentences, relations=relations)

    def _generations(self, namespace: str) -> tuple[int, int, str] | None:
        """(generation, units generation, incarnation) of ``namespace``, ``None`` when it is not stored."""
        query = "SELECT n.generation, n.units_generation, m.value FROM namespaces n LEFT JOIN meta m ON m.key = ? WHERE n.name = ?"
        row = self._db.execute(query, (incarnation_key(namespace), namespace)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), row[2] if row[2] is not None else f"deletions {self.deletions}")

    def _read_units(self, namespace: str, sentences: bool, relations: bool, lo: int = 0) -> tuple[UnitTable, list[tuple[object, float, int]] | None]:
        """The unit segments from ``lo`` on (in seq order) with the vector parts retrieval reads, and their codes when the
        sentences are read (see :func:`~qgmem_train.memory.segments.read_units_and_codes`)."""
        dim = self.dim or 0
        parts = ("fact", "text", *(("sentence",) if sentences else ()), *(("relation",) if relations else ()))
        if sentences:
            return segments.read_units_and_codes(self._db, namespace, dim, parts, lo=lo)
        return segments.read_units(self._db, namespace, dim, parts, lo=lo), None

    def _memory(self, namespace: str, table: UnitTable, turns: TurnTable, generations: tuple[int, int, str], listings: dict[str, list[tuple[int, int, int]]],
                code_blocks: list[CodeBlock] | None, *, sentences: bool, relations: bool) -> NamespaceMemory:  # fmt: skip
        """The namespace read as ``table`` (in unit order), ``turns`` and its traces as stored now."""
        traces = self.load_traces(namespace)
        return NamespaceMemory(
            namespace=namespace,
            units=UnitView(table),
            fact_embeddings=table.vectors["fact"],
            attributes=table.attribute_index(),
            traces=traces,
            trace_of={m: t.id for t in traces for m in t.member_ids},
            turns=TurnMap(turns),
            turn_time=TurnTimeMap(turns),
            embedder_id=self.embedder_id or "",
            sentence_embeddings=table.vectors["sentence"] if sentences else None,
            sentence_unit=table.sentence_owner if sentences else None,
            previous_turn=PreviousTurnMap(turns),
            generation=generations[0],
            units_generation=generations[1],
            relation_embeddings=table.vectors["relation"] if relations else None,
            code_blocks=code_blocks,
            incarnation=generations[2],
            segments=listings,
        )


def _common_prefix(known: Sequence[tuple[int, int, int]], now: Sequence[tuple[int, int, int]]) -> int:
    """How many segments, oldest first, are listed alike in both listings."""
    same = 0
    while same < min(len(known), len(now)) and tuple(known[same]) == tuple(now[same]):
        same += 1
    return same


def _unit_key(table: UnitTable, row: int) -> tuple[int, int, str]:
    """The unit's place in unit order (:meth:`UnitTable.unit_order`): serial, index in its window, id."""
    return int(table.serials[row]), int(table.subs[row]), table.ids[row]


def _final_rows(table: UnitTable, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The unit row and the sentence row of each of ``table``'s units and sentences once its rows are put in unit ``order``."""
    unit_row = np.empty(len(order), np.int64)
    unit_row[order] = np.arange(len(order))
    moved, _ = take_children(table.sentence_owner, len(table), order)
    sentence_row = np.empty(len(moved), np.int64)
    sentence_row[moved] = np.arange(len(moved))
    return unit_row, sentence_row


def _sentence_rows(read: UnitTable, unit_row: np.ndarray, table: UnitTable) -> np.ndarray:
    """The row in ``table``'s sentence vectors of each sentence of ``read``, whose units are at ``unit_row`` in ``table``."""
    owner = np.asarray(read.sentence_owner, np.int64)
    read_start, _ = group_bounds(owner, len(read))
    table_start, _ = group_bounds(np.asarray(table.sentence_owner, np.int64), len(table))
    return table_start[unit_row[owner]] + np.arange(len(owner)) - read_start[owner]


def _code_blocks(codes: list[tuple[object, float, int]], unit_row: np.ndarray, sentence_row: np.ndarray) -> list[CodeBlock]:
    """Each segment's codes (``codes``: index, scale and unit count of the segments read one after the other) as a
    block naming the unit rows and sentence rows it codes: those at ``unit_row`` and ``sentence_row`` of the rows read."""
    blocks, units, sentences = [], 0, 0
    for index, scale, count in codes:
        own_sentences = index.ntotal - count
        fact_rows, sentence_rows = unit_row[units : units + count], sentence_row[sentences : sentences + own_sentences]
        blocks.append(CodeBlock(index, scale, fact_rows, sentence_rows))
        units, sentences = units + count, sentences + own_sentences
    return blocks
