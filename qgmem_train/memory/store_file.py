"""The memory store's SQLite file: its schema and version, a connection per thread, and write transactions.

Opening reads the file before writing anything to it, so an SQLite file of another program, a store
whose schema version is not a number or is newer than this code, or one whose schema holds anything
not in ours (a trigger, view, index or table, or a table defined otherwise: a trigger would run inside
our writes; every entry of ``sqlite_schema`` is compared whole, type, exact name and SQL, and SQLite's statistics
tables pass only exactly as its ``ANALYZE`` makes them) is refused and left as it was; an older
store is upgraded in one transaction (version 2's rows of units move into segments, version 3's unit
vectors into sidecar files, see :mod:`qgmem_train.memory.store_upgrade`). Every write takes the write lock first (``BEGIN IMMEDIATE``) and
waits up to ``busy_timeout`` seconds for another writer; past that it ends in :class:`StoreLockedError`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from qgmem_train.errors import InputError
from qgmem_train.fileio import require_regular
from qgmem_train.memory import segments
from qgmem_train.memory.store_upgrade import TURN_INDEXES, upgrade_2_to_3, upgrade_3_to_4

SCHEMA_VERSION = 4
BUSY_TIMEOUT_S = 30.0
"""Seconds a write waits for other writers before the store counts as locked."""
PAGE_SIZE = 65_536
"""Bytes per database page of a new store: a vector blob then spans few overflow pages, read in few steps."""
MMAP_BYTES = 1 << 40
"""How much of the file each connection reads through a memory map (SQLite caps it at its compile-time limit)."""

SCHEMA = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE namespaces (name TEXT PRIMARY KEY, units_mode TEXT NOT NULL, traces_stale INTEGER NOT NULL DEFAULT 0, "
    "generation INTEGER NOT NULL DEFAULT 0, units_generation INTEGER NOT NULL DEFAULT 0, cut_window INTEGER, cut_overlap INTEGER)",
    "CREATE TABLE turns (namespace TEXT NOT NULL, id TEXT NOT NULL, session_id TEXT NOT NULL, position INTEGER NOT NULL, "
    "speaker TEXT NOT NULL, text TEXT NOT NULL, time TEXT, PRIMARY KEY (namespace, id))",
    *TURN_INDEXES,
    "CREATE TABLE windows (namespace TEXT NOT NULL, session_id TEXT NOT NULL, idx INTEGER NOT NULL, units INTEGER NOT NULL, "
    "dropped INTEGER NOT NULL, PRIMARY KEY (namespace, session_id, idx))",
    *segments.SCHEMA,
    *segments.FILES_SCHEMA,
    "CREATE TABLE traces (namespace TEXT NOT NULL, id TEXT NOT NULL, relation_text TEXT NOT NULL, member_ids TEXT NOT NULL, "
    "trajectory TEXT NOT NULL, current_id TEXT NOT NULL, PRIMARY KEY (namespace, id))",
]
_TABLES = {"meta", "namespaces", "turns", "windows", "unit_keys", "segments", "segment_parts", "segment_files", "traces", "units",
           "sentences"}
"""Tables of a store of any version (``units`` and ``sentences``: version 2 and older)."""


_ENTRIES = "SELECT type, name, tbl_name, sql FROM sqlite_master"
"""Every entry of a database's schema, each row of every type: (type, name, table, defining SQL)."""


@cache
def _made_entries(analysed: bool = False) -> frozenset[tuple[str, str, str, str | None]]:
    """The entries of the schema of a store of :data:`SCHEMA_VERSION` (made or upgraded alike); ``analysed``: with
    those SQLite's ``ANALYZE`` (or ``PRAGMA optimize``) adds, its query-planner statistics tables (``sqlite_stat1``
    and kin), which steer no data."""
    with closing(sqlite3.connect(":memory:")) as db:
        for statement in SCHEMA:
            db.execute(statement)
        if analysed:
            db.execute("ANALYZE")
        return frozenset(db.execute(_ENTRIES).fetchall())


def _store_entries(db: sqlite3.Connection) -> list[tuple[str, str, str, str | None]]:
    """The entries of ``db``'s schema less SQLite's statistics tables (matched whole: type, name, table and SQL)."""
    statistics = _made_entries(analysed=True) - _made_entries()
    return [entry for entry in db.execute(_ENTRIES).fetchall() if entry not in statistics]


def _foreign_entry(entries: list[tuple[str, str, str, str | None]], version: int) -> str | None:
    """What a store of ``version`` would not hold among ``entries``, in words: any trigger or view; at the current
    version, any entry not exactly the schema's, or one of the schema's missing (older versions differ in tables and indexes)."""
    expected = _made_entries()
    for entry in sorted(entries, key=lambda e: e[:2]):
        kind, name = entry[:2]
        if kind not in ("table", "index") or (version == SCHEMA_VERSION and entry not in expected):
            defined_otherwise = any(e[:2] == (kind, name) for e in expected)
            return f"{kind} {name}{' as defined here' if defined_otherwise else ''} is not in a memory store's schema"
    missing = sorted(e[:2] for e in expected - set(entries)) if version == SCHEMA_VERSION else []
    return f"{missing[0][0]} {missing[0][1]} of a memory store's schema is missing" if missing else None


def _upgrade_1_to_2(db: sqlite3.Connection) -> None:
    """Version 2 counts each namespace's writes."""
    db.execute("ALTER TABLE namespaces ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE namespaces ADD COLUMN units_generation INTEGER NOT NULL DEFAULT 0")


_UPGRADES: dict[int, Callable[[sqlite3.Connection], None]] = {1: _upgrade_1_to_2, 2: upgrade_2_to_3, 3: upgrade_3_to_4}
"""The step that brings a store of schema version ``key`` to ``key + 1``, inside the upgrade's transaction."""


class StoreLockedError(InputError):
    """Another writer held the store's write lock for longer than the busy timeout."""


class ThreadConnections:
    """A database connection per thread, opened on its first use, all closed together: a connection runs one
    transaction at a time, so threads must not share one mid-transaction."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._connections: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self) -> Any:
        """A new connection for the calling thread."""
        raise NotImplementedError

    def _closed_error(self) -> Exception:
        """What using the handle after :meth:`close` raises."""
        raise NotImplementedError

    def _usable(self, db: Any) -> bool:
        """Whether the thread's connection can still run statements (one the server dropped is replaced)."""
        return True

    @property
    def db(self) -> Any:
        """The calling thread's connection, opened on its first use."""
        db = getattr(self._local, "db", None)
        if db is None or not self._usable(db):
            with self._lock:
                if self._closed:
                    raise self._closed_error()
                db = self._connect()
                self._connections.append(db)
            self._local.db = db
        return db

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            self._closed = True
            for db in self._connections:
                db.close()
            self._connections.clear()


class StoreFile(ThreadConnections):
    """One SQLite file with a connection per thread: SQLite connections must not be shared by threads mid-transaction."""

    def __init__(self, file: Path, busy_timeout: float = BUSY_TIMEOUT_S) -> None:
        super().__init__()
        self.file = file
        self.busy_timeout = busy_timeout

    @classmethod
    def open(cls, file: Path, busy_timeout: float = BUSY_TIMEOUT_S) -> StoreFile:
        """Open ``file`` (an empty or missing file becomes a new store); refuse anything that is not a store this code reads
        (a FIFO or device in place of the file or its log, before SQLite's read of it could block)."""
        for path in (file, file.with_name(f"{file.name}-wal"), file.with_name(f"{file.name}-shm")):
            require_regular(path)
        handle = cls(file, busy_timeout)
        try:
            if handle._version() != SCHEMA_VERSION:
                handle._create_or_upgrade()
        except BaseException:
            handle.close()
            raise
        return handle

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.file, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
        return db

    def _closed_error(self) -> Exception:
        return sqlite3.ProgrammingError(f"{self.file}: the store is closed")

    @contextmanager
    def busy_as_error(self) -> Iterator[None]:
        """Turn SQLite's "database is locked" past the busy timeout into a :class:`StoreLockedError`."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            if (code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)) if code is not None else "locked" in str(exc):
                raise StoreLockedError(
                    str(self.file),
                    f"locked by another writer for more than {self.busy_timeout:g} s; retry later or open the store with a longer busy_timeout",
                ) from None
            raise

    @contextmanager
    def corruption_as_error(self) -> Iterator[None]:
        """Turn SQLite's "database disk image is malformed" (a damaged page met mid-read) into one :class:`InputError`."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                raise InputError(str(self.file), f"the store is damaged ({exc}); restore it from a backup or build it again") from None
            raise

    @contextmanager
    def transaction(self, namespace: str | None = None) -> Iterator[sqlite3.Connection]:
        """One atomic write holding the write lock from its first read: it commits whole or not at all (the lock is the
        whole file's, whatever ``namespace`` it writes)."""
        db = self.db
        with self.busy_as_error():
            db.execute("BEGIN IMMEDIATE")
        try:
            with self.corruption_as_error():
                yield db
            with self.busy_as_error():
                db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """Reads that see one consistent state of the store, whatever other writers commit meanwhile."""
        db = self.db
        if db.in_transaction:
            yield db
            return
        db.execute("BEGIN")
        try:
            with self.corruption_as_error():
                yield db
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")  # a read-only snapshot: ending it either way is the same, and rollback survives a damaged page
            raise
        db.execute("COMMIT")

    @contextmanager
    def erasing(self) -> Iterator[None]:
        """Rows deleted inside are overwritten in the file (``secure_delete``), whatever the connection's setting."""
        db = self.db
        secure = db.execute("PRAGMA secure_delete").fetchone()[0]
        db.execute("PRAGMA secure_delete=ON")
        try:
            yield
        finally:
            db.execute(f"PRAGMA secure_delete={secure}")

    def checkpoint(self) -> None:
        """Copy the log into the file and empty it, so that deleted content stays in neither."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _version(self) -> int | None:
        """The stored schema version, ``None`` for a new (empty) file; anything that is not a store is an error."""
        try:
            with self.busy_as_error():
                entries = _store_entries(self.db)
                tables = {name for kind, name, _, _ in entries if kind == "table"}
                if not entries:
                    return None
                if "meta" not in tables or not tables <= _TABLES:
                    raise InputError(str(self.file), "not a memory store: an SQLite database with other tables")
                value = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if value is None:
                    if all(self.db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() is None for t in tables):
                        return None  # created by a build killed before its first write: empty, made anew
                    raise InputError(str(self.file), "not a memory store: no schema version")
        except sqlite3.DatabaseError as exc:
            action = "cannot open" if str(exc).startswith("unable to open") else "not a memory store"
            raise InputError(str(self.file), f"{action}: {exc}") from None
        try:
            version = int(value[0])
        except ValueError:
            raise InputError(f"{self.file}: schema_version", f"is {value[0]!r}, not a number: not a store this code can read") from None
        if version > SCHEMA_VERSION:
            raise InputError(str(self.file), f"schema version {version} is newer than this code reads ({SCHEMA_VERSION}); open it with a newer qgmem")
        if version < 1:
            raise InputError(f"{self.file}: schema_version", f"is {version}, not a store version")
        self._refuse_foreign_entries(entries, version)
        return version

    def _refuse_foreign_entries(self, entries: list[tuple[str, str, str, str | None]], version: int) -> None:
        """Refuse a store whose schema holds an entry a store of ``version`` has not (see :func:`_foreign_entry`)."""
        foreign = _foreign_entry(entries, version)
        if foreign is not None:
            raise InputError(str(self.file), f"not a memory store: {foreign}; refusing to open it")

    def _create_or_upgrade(self) -> None:
        """Make a new store, or bring an older one to :data:`SCHEMA_VERSION`, in one transaction."""
        with self.busy_as_error():
            self.db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect on a file with nothing written yet
            self.db.execute("PRAGMA journal_mode=WAL")
        with self.transaction() as db:
            version = self._version()  # again under the write lock: another process may have done it meanwhile
            if version is None:
                for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                    db.execute(f"DROP TABLE {table}")
                for statement in SCHEMA:
                    db.execute(statement)
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif version < SCHEMA_VERSION:
                for step in range(version, SCHEMA_VERSION):
                    _UPGRADES[step](db)
                db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            self._refuse_foreign_entries(_store_entries(db), SCHEMA_VERSION)
