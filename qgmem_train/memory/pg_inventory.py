"""What a handed-over PostgreSQL store may hold besides its tables: nothing that runs code on a write, keeps rows a
delete removes, or copies rows elsewhere.

:mod:`~qgmem_train.memory.pg_file` compares the store's tables and columns with its schema; this module reads the
rest of the catalogs. Refused: any rule, trigger, row-level security policy, inheritance, publication or access
method other than ``heap`` on the store's tables; constraints and indexes other than the schema's own (compared by
definition, so a CHECK calling a function or an index on an expression differs); and, in every schema on the
connection's search path, any relation, function, operator, type, collation, operator class or family, conversion,
text-search object or extension that is not the store's own or pgvector's (pgvector's functions only in C or
internal code, which only a superuser can install). Connections put ``pg_catalog`` first on their search path, so a
function of a built-in's name and types cannot take its calls.
"""

from __future__ import annotations

from typing import Any

_VECTOR_MEMBER = (
    "{oid} IN (SELECT d.objid FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid WHERE d.refclassid = 'pg_extension'::regclass "
    "AND d.deptype = 'e' AND e.extname = 'vector' AND d.classid = '{catalog}'::regclass)"
)
"""Whether a catalog row is a member of the ``vector`` extension."""
_PGVECTOR_ALLOWS = {
    "pg_proc": _VECTOR_MEMBER.format(oid="x.oid", catalog="pg_proc") + " AND x.prolang IN (SELECT oid FROM pg_language WHERE lanname IN ('c', 'internal'))",
    "pg_type": "(x.typrelid IN (SELECT oid FROM own) OR " + _VECTOR_MEMBER.format(oid="x.oid", catalog="pg_type") + " OR (x.typsubscript = 'array_subscript_handler'::regproc AND "
    "(x.typelem IN (SELECT reltype FROM pg_class WHERE oid IN (SELECT oid FROM own)) OR " + _VECTOR_MEMBER.format(oid="x.typelem", catalog="pg_type") + ")))",
}
"""What of a catalog pgvector (or the store's tables, for their row types and those types' arrays) may hold; others: its members."""
_SCHEMA_OBJECTS = (
    ("function", "pg_proc", "proname", "pronamespace"),
    ("operator", "pg_operator", "oprname", "oprnamespace"),
    ("type", "pg_type", "typname", "typnamespace"),
    ("collation", "pg_collation", "collname", "collnamespace"),
    ("operator class", "pg_opclass", "opcname", "opcnamespace"),
    ("operator family", "pg_opfamily", "opfname", "opfnamespace"),
    ("conversion", "pg_conversion", "conname", "connamespace"),
    ("text search configuration", "pg_ts_config", "cfgname", "cfgnamespace"),
    ("text search dictionary", "pg_ts_dict", "dictname", "dictnamespace"),
    ("text search parser", "pg_ts_parser", "prsname", "prsnamespace"),
    ("text search template", "pg_ts_template", "tmplname", "tmplnamespace"),
)
"""(what it is called, catalog, name column, schema column) of each kind of object a schema holds besides relations."""
_TABLE_OBJECTS = (
    "SELECT 1, 'rule ' || r.rulename || ' on ' || o.relname FROM pg_rewrite r JOIN own o ON o.oid = r.ev_class",
    "SELECT 1, 'trigger ' || t.tgname || ' on ' || o.relname FROM pg_trigger t JOIN own o ON o.oid = t.tgrelid",
    "SELECT 1, 'policy ' || p.polname || ' on ' || o.relname FROM pg_policy p JOIN own o ON o.oid = p.polrelid",
    "SELECT 1, 'row-level security on ' || o.relname FROM own o JOIN pg_class c ON c.oid = o.oid WHERE c.relrowsecurity OR c.relforcerowsecurity",
    "SELECT 1, 'inheritance of ' || o.relname FROM pg_inherits i JOIN own o ON o.oid IN (i.inhrelid, i.inhparent)",
    "SELECT 1, 'access method ' || a.amname || ' of ' || o.relname FROM own o JOIN pg_class c ON c.oid = o.oid JOIN pg_am a ON a.oid = c.relam "
    "WHERE a.amname <> 'heap'",
    "SELECT 1, 'publication ' || p.pubname || ' of ' || o.relname FROM pg_publication_rel r JOIN own o ON o.oid = r.prrelid "
    "JOIN pg_publication p ON p.oid = r.prpubid",
    "SELECT 2, 'relation ' || n.nspname || '.' || c.relname FROM pg_class c JOIN path n ON n.oid = c.relnamespace "
    "WHERE c.oid NOT IN (SELECT oid FROM own) AND c.relkind NOT IN ('i', 'I')",
    "SELECT 4, 'extension ' || e.extname FROM pg_extension e JOIN path n ON n.oid = e.extnamespace WHERE e.extname <> 'vector'",
)
"""Objects on or beside the store's tables that a store never has (the first column orders what is named first)."""
_FOREIGN = (
    "WITH own AS (SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(store)s AND c.relkind = 'r' AND c.relname = ANY(%(tables)s)), "
    "path AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = ANY(%(path)s)) "
    + " UNION ALL ".join(
        [
            *_TABLE_OBJECTS,
            *(
                f"SELECT 3, '{kind} ' || n.nspname || '.' || x.{name} FROM {catalog} x JOIN path n ON n.oid = x.{schema} "
                f"WHERE NOT ({_PGVECTOR_ALLOWS.get(catalog) or _VECTOR_MEMBER.format(oid='x.oid', catalog=catalog)})"
                for kind, catalog, name, schema in _SCHEMA_OBJECTS
            ),
        ]
    )
    + " ORDER BY 1, 2"
)
DEFINITIONS = (
    "WITH s AS (SELECT {schema} AS oid) SELECT 'constraint', k.conname, c.relname, pg_get_constraintdef(k.oid) FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
    "WHERE c.relnamespace = (SELECT oid FROM s) AND c.relkind = 'r' UNION ALL "
    "SELECT 'index', i.relname, c.relname, replace(pg_get_indexdef(x.indexrelid), "
    "' ON ' || CASE c.relpersistence WHEN 't' THEN 'pg_temp' ELSE quote_ident(n.nspname) END || '.' || quote_ident(c.relname) || ' ', "
    "' ON ' || quote_ident(c.relname) || ' ') "
    "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class c ON c.oid = x.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relnamespace = (SELECT oid FROM s) AND c.relkind = 'r'"
)
"""Every constraint and index on the tables of a schema: (kind, name, table, definition without the schema's name)."""


def foreign_object(db: Any, store_schema: str, path: list[str], tables: set[str]) -> str | None:
    """The first object the catalogs hold on the store's ``tables`` (in ``store_schema``) or in the schemas of the
    search ``path`` that a store never has, in words (``rule wipe on turns is not in ...``); None when there is none."""
    row = db.raw.execute(_FOREIGN, {"store": store_schema, "path": path, "tables": sorted(tables)}).fetchone()
    return f"{row[1]} is not in a memory store's schema" if row else None


def differing_definition(found: set[tuple], expected: set[tuple]) -> str | None:
    """The first constraint or index that differs between the store's (``found``) and the schema's (``expected``),
    in words; None when they agree."""
    for kind, name, table, _ in sorted(found - expected):
        return f"{kind} {name} on {table} is not in a memory store's schema"
    for kind, name, table, _ in sorted(expected - found):
        return f"{kind} {name} on {table} of a memory store's schema is missing"
    return None
