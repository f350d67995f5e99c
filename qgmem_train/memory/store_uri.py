"""Where a store lives: a folder (SQLite, the embedded default) or a ``postgresql://`` URI, and that URI as messages show it.

A URI may carry a password (better kept in ``PGPASSWORD`` or ``~/.pgpass``, which the driver reads); it is never
shown: :func:`masked_uri` replaces it in everything the store and the CLI print.
"""

from __future__ import annotations

import re
from pathlib import Path

SCHEMES = ("postgresql://", "postgres://")
_PASSWORD_PARAM = re.compile(r"(?i)(password=)([^&;\s]*)")
_USERINFO = re.compile(r"://([^/?#]*)@")


def is_store_uri(location: object) -> bool:
    """Whether ``location`` names a PostgreSQL store rather than a folder."""
    return isinstance(location, str) and location.lower().startswith(SCHEMES)


def store_location(text: str) -> str | Path:
    """A ``--store`` value: the URI as given (``Path`` would fold its ``//``), else a folder."""
    return text if is_store_uri(text) else Path(text)


def shown_store(location: str | Path) -> str:
    """A store location as reports and messages show it: a folder as written, a URI with its password masked."""
    return masked_uri(location) if is_store_uri(location) else str(location)


def _passwords(uri: str) -> list[str]:
    """The passwords written in ``uri``: after the user name (up to the authority's last ``@``, read even from a URI
    the driver would refuse) and in ``password=`` parameters."""
    found = [m.group(1).split(":", 1)[1] for m in _USERINFO.finditer(uri) if ":" in m.group(1)]
    return [p for p in found + [m.group(2) for m in _PASSWORD_PARAM.finditer(uri)] if p]


def masked_uri(uri: str) -> str:
    """``uri`` with its password (after the user name or in a ``password=`` parameter) replaced by ``***``."""
    masked = _PASSWORD_PARAM.sub(lambda m: m.group(1) + ("***" if m.group(2) else ""), uri)
    user, _, password = _USERINFO.search(masked).group(1).partition(":") if _USERINFO.search(masked) else ("", "", "")
    return _USERINFO.sub(lambda _: f"://{user}:***@", masked, count=1) if password else masked


def masked_text(text: str, uri: str) -> str:
    """``text`` (a driver's error message) with every password of ``uri`` masked wherever it appears."""
    for password in sorted(_passwords(uri), key=len, reverse=True):
        text = text.replace(password, "***")
    return text
