"""Where a store lives: a folder (SQLite, the embedded default) or a ``postgresql://`` URI, and that URI as messages show it.

A URI may carry a password (better kept in ``PGPASSWORD`` or ``~/.pgpass``, which the driver reads); it is never
shown: :func:`masked_uri` replaces it in everything the store and the CLI print.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

SCHEMES = ("postgresql://", "postgres://")
_PASSWORD_PARAM = re.compile(r"(?i)(password=)[^&;\s]*")


def is_store_uri(location: object) -> bool:
    """Whether ``location`` names a PostgreSQL store rather than a folder."""
    return isinstance(location, str) and location.lower().startswith(SCHEMES)


def store_location(text: str) -> str | Path:
    """A ``--store`` value: the URI as given (``Path`` would fold its ``//``), else a folder."""
    return text if is_store_uri(text) else Path(text)


def masked_uri(uri: str) -> str:
    """``uri`` with its password (in the netloc or a ``password=`` parameter) replaced by ``***``."""
    masked = _PASSWORD_PARAM.sub(r"\1***", uri)
    try:
        password = urlsplit(uri).password
    except ValueError:
        password = None
    if password:
        masked = masked.replace(f":{password}@", ":***@", 1)
    return masked


def masked_text(text: str, uri: str) -> str:
    """``text`` (a driver's error message) with the password of ``uri`` masked wherever it appears."""
    try:
        password = urlsplit(uri).password
    except ValueError:
        password = None
    text = text.replace(uri, masked_uri(uri))
    for match in _PASSWORD_PARAM.finditer(uri):
        secret = match.group(0).split("=", 1)[1]
        if secret:
            text = text.replace(secret, "***")
    return text.replace(password, "***") if password else text
