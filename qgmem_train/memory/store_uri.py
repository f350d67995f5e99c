"""Where a store lives: a folder (SQLite, the embedded default) or a ``postgresql://`` URI, and how messages name it.

A URI may carry credentials (a password after the user name or in a parameter; better kept in ``PGPASSWORD`` or
``~/.pgpass``, which the driver reads). No URI is ever printed or written: messages, logs, ``metrics.json`` and model
cards name a PostgreSQL store by its backend and database name alone (:func:`shown_store`), read with the driver's own
parser, and a driver's message is shown with every credential the URI holds masked (:func:`masked_text`).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

SCHEMES = ("postgresql://", "postgres://")
CREDENTIALS = ("password", "sslpassword")
"""The connection parameters (libpq's) that hold a secret."""
_SECRET_PARAM = re.compile(r"(?i)[?&;]([^=&;#\s]*)=([^&;#\s]*)")
_USERINFO = re.compile(r"://([^/]*)@")


def is_store_uri(location: object) -> bool:
    """Whether ``location`` names a PostgreSQL store rather than a folder."""
    return isinstance(location, str) and location.lower().startswith(SCHEMES)


def store_location(text: str) -> str | Path:
    """A ``--store`` value: the URI as given (``Path`` would fold its ``//``), else a folder."""
    return text if is_store_uri(text) else Path(text)


def uri_parameters(uri: str) -> dict[str, str] | None:
    """The connection parameters of ``uri`` as the driver reads them (psycopg's conninfo); None when it cannot read it
    (its message, which may quote the password, is never shown) or the driver is not installed."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return None
    try:
        return {key: str(value) for key, value in conninfo_to_dict(uri).items()}
    except Exception:  # psycopg.ProgrammingError: a URI libpq refuses
        return None


def shown_store(location: str | Path) -> str:
    """A store location as messages, logs and reports show it: a folder as written, a URI as its backend and database
    name (``postgresql database memory``), never its user, host or credentials."""
    if not is_store_uri(location):
        return str(location)
    name = (uri_parameters(str(location)) or {}).get("dbname")
    return f"postgresql database {name}" if name else "postgresql database"


def _secrets(uri: str) -> set[str]:
    """Every credential written in ``uri`` as the driver reads it and as written (after the user name, up to the
    authority's last ``@``, and in any parameter whose name decodes to one of :data:`CREDENTIALS`), raw and decoded."""
    found = {value for key, value in (uri_parameters(uri) or {}).items() if key in CREDENTIALS}
    found |= {m.group(1).split(":", 1)[1] for m in _USERINFO.finditer(uri) if ":" in m.group(1)}
    found |= {m.group(2) for m in _SECRET_PARAM.finditer(uri) if unquote(m.group(1)).lower() in CREDENTIALS}
    return {form for secret in found for form in (secret, unquote(secret)) if form}


def masked_text(text: str, uri: str) -> str:
    """``text`` (a driver's error message) with every credential of ``uri`` masked wherever it appears."""
    for secret in sorted(_secrets(uri), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
