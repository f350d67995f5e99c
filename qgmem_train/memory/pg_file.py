"""A memory store in PostgreSQL: the SQLite store's tables with vectors in a pgvector column, a connection per
thread, and write transactions that lock the namespace they write.

The tables are those of :mod:`qgmem_train.memory.store_file` (made from the same statements: ``INTEGER`` as
``BIGINT``, ``BLOB`` as ``BYTEA``, texts in the ``"C"`` collation so that they sort as in SQLite), except that a
unit segment's vectors are rows of ``segment_vectors`` (:mod:`qgmem_train.memory.pg_vectors`) rather than sidecar
files: several servers, on several machines, share one database. The store's code runs unchanged on a
:class:`PgConnection`, which takes SQLite's ``?`` placeholders and ``json_each(?)`` lists.

Every write is one transaction that first takes an advisory lock on its namespace, so the writes of a namespace
run one at a time whichever process makes them (each decides from what it reads after the lock, as under SQLite's
write lock), while other namespaces are written at once; primary keys make a retried write (the same session id,
the same unit ids) store its rows once. Reads of a namespace run in one ``REPEATABLE READ`` snapshot. Opening
checks the schema before anything is written and refuses, in one line, a database holding other tables, columns
defined otherwise, anything else of the catalogs a store never holds (rules, triggers, functions, ...: see
:mod:`~qgmem_train.memory.pg_inventory`), or another schema version; every connection puts ``pg_catalog`` first on
its search path. An empty database (or schema, chosen with the URI's
``options=-csearch_path=...``) becomes a new store. Messages name the store by its database alone: no part of the URI,
its password least of all, appears in one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from typing import Any

from qgmem_train.errors import InputError, first_line
from qgmem_train.memory.pg_inventory import DEFINITIONS, differing_definition, foreign_object
from qgmem_train.memory.store_file import BUSY_TIMEOUT_S, SCHEMA, StoreLockedError, ThreadConnections
from qgmem_train.memory.store_uri import masked_text, shown_store, uri_parameters

SCHEMA_VERSION = 1
"""Version of the PostgreSQL layout (the tables of SQLite schema version 4, vectors in ``segment_vectors``)."""
_CREATE_LOCK = 0x716D_656D
"""Advisory lock held while a store's tables are made, so that two processes opening a new store make them once."""
VECTORS_TABLE = (
    'CREATE TABLE segment_vectors (namespace TEXT COLLATE "C" NOT NULL, seq BIGINT NOT NULL, part TEXT COLLATE "C" NOT NULL, '
    "idx INTEGER NOT NULL, embedding vector NOT NULL, PRIMARY KEY (namespace, seq, part, idx))"
)
"""One row per vector of a unit segment: its part (fact, relation, sentence, text), row in that part, and the vector."""
_ATTRIBUTES = (
    "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, COALESCE(l.collname, ''), "
    "COALESCE(pg_get_expr(d.adbin, d.adrelid), '') FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
    "LEFT JOIN pg_collation l ON l.oid = a.attcollation AND a.attcollation <> 100 "
    "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    "WHERE c.relnamespace = {schema} AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped"
)
"""Every column of the tables in a schema: table, column, type, not null, collation (other than the default), default."""
_NAMED_SCHEMA = "(SELECT oid FROM pg_namespace WHERE nspname = ?)"
_RELATIONS = f"SELECT relname, relkind FROM pg_class WHERE relnamespace = {_NAMED_SCHEMA} AND relkind IN ('r', 'v', 'm', 'p', 'f')"
_SEARCH_PATH = "SELECT current_schema(), current_setting('search_path'), current_schemas(false)"
_PIN_SEARCH_PATH = "SELECT set_config('search_path', array_to_string(ARRAY['pg_catalog'] || ARRAY(SELECT quote_ident(s) FROM unnest(%s::text[]) s), ', '), false)"
"""Puts ``pg_catalog`` first on the connection's search path, then the schemas the URI's path named that exist (and only
those: a schema made later is never searched), so that no function of the store's schemas takes a built-in's call."""


def pg_statement(statement: str) -> str:
    """An SQLite schema statement as PostgreSQL's: 64-bit integers, byte strings, texts compared byte by byte."""
    statement = statement.replace("INTEGER", "BIGINT").replace("BLOB", "BYTEA")
    return re.sub(r"\bTEXT\b", 'TEXT COLLATE "C"', statement)


def schema() -> list[str]:
    """The statements making a PostgreSQL store: SQLite's (less its sidecar table, ``segment_files``) and ``segment_vectors``."""
    return [pg_statement(s) for s in SCHEMA if "segment_files" not in s] + [VECTORS_TABLE]


def _tables() -> set[str]:
    return {re.match(r"CREATE TABLE (\w+)", s).group(1) for s in schema() if s.startswith("CREATE TABLE")}  # type: ignore[union-attr]


@cache
def _pg_sql(sql: str) -> str:
    """``sql`` written for SQLite in PostgreSQL's placeholders: ``json_each(?)`` lists and ``?`` parameters."""
    sql = sql.replace("%", "%%").replace("json_each(?)", "json_array_elements_text(?::json)")
    return sql.replace("?", "%s")


class PgConnection:
    """A psycopg connection (autocommit: transactions are begun explicitly) that runs the store's SQLite statements."""

    def __init__(self, raw: Any, schema: str, path: list[str], search_path: str, errors: Callable[[], AbstractContextManager]) -> None:
        from qgmem_train.memory.pg_vectors import PgVectors

        self.raw = raw
        self._errors = errors
        self.schema = schema
        """The schema holding the store's tables: the first of the search path the URI gave that exists."""
        self.path = path
        """The schemas searched after ``pg_catalog`` (the store's schema first)."""
        self.search_path = search_path
        """The search path as the URI gave it (a new store's tables and extension are made with it)."""
        self.vectors = PgVectors()
        """Where this store keeps segment vectors (see :func:`~qgmem_train.memory.segments.storage_of`)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; the cursor, to fetch from or iterate."""
        params = tuple(params)
        with self._errors():
            return self.raw.execute(_pg_sql(sql) if params else sql, params or None)

    def executemany(self, sql: str, rows: Any) -> Any:
        """Run one statement for each row of parameters (pipelined)."""
        rows = [tuple(r) for r in rows]
        cursor = self.raw.cursor()
        if rows:
            with self._errors():
                cursor.executemany(_pg_sql(sql), rows)
        return cursor

    def close(self) -> None:
        """Close the connection."""
        self.raw.close()

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open on the connection."""
        from psycopg.pq import TransactionStatus

        return self.raw.info.transaction_status != TransactionStatus.IDLE


class PgFile(ThreadConnections):
    """One PostgreSQL store with a connection per thread (a psycopg connection runs one transaction at a time)."""

    def __init__(self, uri: str, busy_timeout: float = BUSY_TIMEOUT_S) -> None:
        super().__init__()
        self._uri = uri
        self.name = shown_store(uri)
        """The store as messages show it: its backend and database name, never the URI (see :mod:`~qgmem_train.memory.store_uri`)."""
        self.busy_timeout = busy_timeout

    @classmethod
    def open(cls, uri: str, *, create: bool = False, busy_timeout: float = BUSY_TIMEOUT_S) -> PgFile:
        """Connect to the store at ``uri``; ``create`` makes its tables in an empty database. Anything else is refused."""
        try:
            import psycopg  # noqa: F401
            import pgvector  # noqa: F401
        except ImportError:
            raise InputError(shown_store(uri), "a PostgreSQL store needs psycopg and pgvector: pip install 'qgmem[postgres]'") from None
        if uri_parameters(uri) is None:
            raise InputError(
                shown_store(uri),
                "not a connection URI the driver reads (postgresql://user@host:port/database?parameter=value, with @ : / ? # % in a "
                "password percent-encoded; better, the password in PGPASSWORD or ~/.pgpass)",
            )
        handle = cls(uri, busy_timeout)
        try:
            handle._create_or_check(create)
        except BaseException:
            handle.close()
            raise
        return handle

    def _connect(self, vectors: bool = True) -> PgConnection:
        import psycopg
        from pgvector.psycopg import register_vector

        try:
            raw = psycopg.connect(self._uri, autocommit=True)
        except psycopg.Error as exc:  # refused, unreachable, or a URI the driver cannot read
            raise InputError(self.name, f"cannot connect: {self._detail(exc)}") from None
        try:
            with self.errors():
                raw.execute(f"SET lock_timeout = {int(self.busy_timeout * 1000)}")
                schema, search_path, schemas = raw.execute(_SEARCH_PATH).fetchone()
                if schema is None:
                    raise InputError(self.name, f"no schema of the search path ({search_path}) exists to hold the store; make it, or name one in the URI's options")
                path = [name for name in schemas if name != "pg_catalog"]
                raw.execute(_PIN_SEARCH_PATH, (path,))
                if vectors:
                    register_vector(raw)
        except BaseException:
            raw.close()
            raise
        return PgConnection(raw, schema, path, search_path, self.errors)

    def _closed_error(self) -> Exception:
        return InputError(self.name, "the store is closed")

    def _usable(self, db: PgConnection) -> bool:
        return not db.raw.broken

    @contextmanager
    def errors(self) -> Iterator[None]:
        """The driver's errors as one line naming the store (credentials masked): a lock waited on past the busy timeout is a
        :class:`StoreLockedError`; a lost or refused connection, a value PostgreSQL cannot hold (a text with NUL) and a
        role lacking a right the store needs (one that may only read, writing) are an :class:`InputError`."""
        import psycopg

        try:
            yield
        except psycopg.errors.LockNotAvailable:
            raise StoreLockedError(
                self.name, f"locked by another writer for more than {self.busy_timeout:g} s; retry later or open the store with a longer busy_timeout"
            ) from None
        except psycopg.OperationalError as exc:
            raise InputError(self.name, f"PostgreSQL: {self._detail(exc)}") from None
        except psycopg.DataError as exc:
            raise InputError(self.name, f"a value PostgreSQL cannot hold ({self._detail(exc)})") from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise InputError(
                self.name, f"{self._detail(exc)}: the store's role needs SELECT, INSERT, UPDATE and DELETE on its tables (grant them, or connect as a role that has them)"
            ) from None

    def _detail(self, exc: Exception) -> str:
        """The first line of a driver error, every credential of the URI masked."""
        return masked_text(first_line(exc), self._uri)

    @contextmanager
    def transaction(self, namespace: str | None = None) -> Iterator[PgConnection]:
        """One atomic write, holding ``namespace``'s lock from its start: it commits whole or not at all."""
        db = self.db
        with self.errors():
            db.execute("BEGIN")
        try:
            with self.errors():
                if namespace is not None:
                    db.execute("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(?, 0))", (namespace,))
                yield db
                db.execute("COMMIT")
        except BaseException:
            if not db.raw.broken and db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @contextmanager
    def snapshot(self) -> Iterator[PgConnection]:
        """Reads that see one consistent state of the store, whatever other writers commit meanwhile."""
        db = self.db
        if db.in_transaction:
            yield db
            return
        with self.errors():
            db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            with self.errors():
                yield db
        finally:
            if not db.raw.broken and db.in_transaction:
                db.execute("ROLLBACK")  # read only: ending it either way is the same

    def erasing(self) -> nullcontext:
        """Deleting needs nothing more: PostgreSQL has no setting that overwrites deleted rows."""
        return nullcontext()

    def checkpoint(self) -> None:
        """Nothing to do after a delete (the server's VACUUM reclaims the rows' space)."""

    def _create_or_check(self, create: bool) -> None:
        """Make the tables in an empty database, or check those there are a store of this version, before any write."""
        admin = self._connect(vectors=False)
        try:
            with self.errors():
                if not admin.execute(_RELATIONS, (admin.schema,)).fetchall():
                    if not create:
                        raise InputError(self.name, "no memory store in this database; build one with `python -m qgmem_train build`")
                    self._create(admin)
                self._check(admin)
        finally:
            admin.close()

    def _create(self, admin: PgConnection) -> None:
        """Make the extension and tables and record the version, in one transaction (once, if others open it meanwhile)."""
        import psycopg

        admin.execute("BEGIN")
        try:
            admin.execute(f"SELECT pg_catalog.pg_advisory_xact_lock({_CREATE_LOCK})")
            admin.execute("SELECT pg_catalog.set_config('search_path', ?, true)", (admin.search_path,))  # made where the URI's path says
            if not admin.execute(_RELATIONS, (admin.schema,)).fetchall():
                try:
                    admin.execute("CREATE EXTENSION IF NOT EXISTS vector")
                except psycopg.Error as exc:
                    raise InputError(self.name, f"the server cannot give this database pgvector ({self._detail(exc)})") from None
                for statement in schema():
                    admin.execute(statement)
                admin.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            admin.execute("COMMIT")
        except BaseException:
            if not admin.raw.broken and admin.in_transaction:
                admin.execute("ROLLBACK")
            raise

    def _check(self, admin: PgConnection) -> None:
        """Refuse a database that is not a store of :data:`SCHEMA_VERSION`: other tables, columns or version, or anything
        else in the catalogs a store does not hold (:mod:`~qgmem_train.memory.pg_inventory`)."""
        relations = dict(admin.execute(_RELATIONS, (admin.schema,)).fetchall())
        foreign = sorted(set(relations) - _tables()) or sorted(r for r, kind in relations.items() if kind != "r")
        if foreign or "meta" not in relations:
            raise InputError(self.name, f"not a memory store: {'relation ' + foreign[0] if foreign else 'no meta table'} is not in a memory store's schema")
        row = admin.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            raise InputError(self.name, "not a memory store: no schema version")
        if not row[0].isdigit():
            raise InputError(f"{self.name}: schema_version", f"is {row[0]!r}, not a number: not a store this code can read")
        if int(row[0]) != SCHEMA_VERSION:
            raise InputError(self.name, f"PostgreSQL store schema version {row[0]}; this code reads version {SCHEMA_VERSION}")
        found = set(admin.execute(_ATTRIBUTES.format(schema=_NAMED_SCHEMA), (admin.schema,)).fetchall())
        definitions = set(admin.execute(DEFINITIONS.format(schema=_NAMED_SCHEMA), (admin.schema,)).fetchall())
        expected, expected_definitions = self._expected(admin)
        differing = sorted({(t, c) for t, c, *_ in found ^ expected})
        if differing:
            table, column = differing[0]
            raise InputError(self.name, f"not a memory store: column {table}.{column} is not as a memory store defines it; refusing to open it")
        foreign = differing_definition(definitions, expected_definitions) or foreign_object(admin, admin.schema, admin.path, _tables())
        if foreign:
            raise InputError(self.name, f"not a memory store: {foreign}; refusing to open it")

    @staticmethod
    def _expected(admin: PgConnection) -> tuple[set[tuple], set[tuple]]:
        """The columns, and the constraints and indexes, :func:`schema` makes, read from temporary tables made from it
        (and dropped) in this session."""
        admin.execute("BEGIN")
        try:
            for statement in schema():
                admin.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
            columns = admin.execute(_ATTRIBUTES.format(schema="pg_my_temp_schema()")).fetchall()
            return set(columns), set(admin.execute(DEFINITIONS.format(schema="pg_my_temp_schema()")).fetchall())
        finally:
            admin.execute("ROLLBACK")
