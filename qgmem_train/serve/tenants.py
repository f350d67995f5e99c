"""Tenants of ``serve``: bearer tokens, from a file or the environment, mapped to the namespaces each may touch.

The tenants file (YAML or JSON) lists ``tenants``, each with a ``name`` (for logs and metrics; never the
token), its token as ``token`` or as ``token_env`` (the variable holding it), and what it may touch:
``namespaces`` (exact names) and ``prefixes`` (every namespace starting with one). The same text may be
given in the environment variable :data:`TENANTS_ENV` instead of a file. Errors name the tenant and field,
never a token's value.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from qgmem_train.errors import InputError

TENANTS_ENV = "QGMEM_SERVE_TENANTS"
"""Environment variable holding the tenants file's text, when no file is given."""
MIN_TOKEN_BITS = 128
"""Least randomness a token must be able to hold: 32 hex or 22 base64url characters."""
TOKEN_ALPHABETS = ((16, frozenset(string.hexdigits)), (64, frozenset(string.ascii_letters + string.digits + "-_+/=")),
                   (94, frozenset(string.printable[:94])))  # fmt: skip
"""The usual alphabets of generated tokens, smallest first, with their sizes."""
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


@dataclass(frozen=True)
class Tenant:
    """A caller of the API: the namespaces it may read and write, and nothing else."""

    name: str
    namespaces: frozenset[str]
    prefixes: tuple[str, ...]

    def may(self, namespace: str) -> bool:
        """Whether this tenant may touch ``namespace`` (existing or not)."""
        return namespace in self.namespaces or namespace.startswith(self.prefixes)


class Tenants:
    """Tenants by token; tokens are kept only as SHA-256 digests and compared in constant time."""

    def __init__(self, by_token: Mapping[str, Tenant]) -> None:
        self._by_digest = {_digest(token): tenant for token, tenant in by_token.items()}

    def authenticate(self, token: str | None) -> Tenant | None:
        """The tenant of ``token``, or None for a missing or unknown one (every digest is compared, so timing tells nothing)."""
        if not token:
            return None
        digest = _digest(token)
        found = None
        for known, tenant in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                found = tenant
        return found

    @classmethod
    def load(cls, path: Path | None, environ: Mapping[str, str] = os.environ) -> Tenants:
        """Tenants from the file ``path``, else from :data:`TENANTS_ENV`; neither is an error."""
        if path is not None:
            try:
                text, where = Path(path).read_text(encoding="utf-8"), str(path)
            except (OSError, UnicodeDecodeError) as exc:
                raise InputError(str(path), f"cannot read the tenants file: {exc}") from None
        elif environ.get(TENANTS_ENV):
            text, where = environ[TENANTS_ENV], TENANTS_ENV
        else:
            raise InputError("--tenants", f"no tenants: give a tenants file or set {TENANTS_ENV} (see docs/serve.md)")
        try:
            document = yaml.safe_load(text)
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer past Python's digit limit
            raise InputError(where, f"not YAML or JSON: {str(exc).splitlines()[0]}") from None
        return cls.from_records(document, where, environ)

    @classmethod
    def from_records(cls, document: Any, where: str, environ: Mapping[str, str] = os.environ) -> Tenants:
        """Tenants from the parsed file ``{"tenants": [...]}``; anything malformed is one :class:`InputError`."""
        records = document.get("tenants") if isinstance(document, dict) else None
        if not isinstance(records, list) or not records:
            raise InputError(where, "expected `tenants:` with a list of tenants")
        by_token: dict[str, Tenant] = {}
        names: set[str] = set()
        for number, record in enumerate(records, start=1):
            token, tenant = _tenant(record, f"{where}: tenant {number}", environ)
            if tenant.name in names:
                raise InputError(f"{where}: tenant {number}", f"name {tenant.name!r} used twice")
            if token in by_token:
                raise InputError(f"{where}: tenant {tenant.name}", f"same token as tenant {by_token[token].name}")
            names.add(tenant.name)
            by_token[token] = tenant
        _refuse_shared_namespaces(list(by_token.values()), where)
        return cls(by_token)


def _refuse_shared_namespaces(tenants: list[Tenant], where: str) -> None:
    """Refuse two tenants that could both touch some namespace: one's prefix starting the other's prefix or name, or
    the same name listed by both. Each namespace belongs to one tenant; a shared one would let each read and delete
    the other's memories."""
    for number, first in enumerate(tenants):
        for second in tenants[number + 1:]:
            shared = _shared_grant(first, second) or _shared_grant(second, first)
            if shared:
                raise InputError(where, f"tenants {first.name!r} and {second.name!r} overlap ({shared}): give each tenant namespaces no other tenant may touch")


def _shared_grant(owner: Tenant, other: Tenant) -> str | None:
    """How ``owner``'s grants cover one of ``other``'s (its prefix, or a name ``owner`` also lists), or None."""
    for prefix in owner.prefixes:
        for covered in other.prefixes:
            if covered.startswith(prefix):
                return f"prefix {prefix!r} of {owner.name!r} covers prefix {covered!r} of {other.name!r}"
        for covered in sorted(other.namespaces):
            if covered.startswith(prefix):
                return f"prefix {prefix!r} of {owner.name!r} covers namespace {covered!r} of {other.name!r}"
    both = sorted(owner.namespaces & other.namespaces)
    return f"both list namespace {both[0]!r}" if both else None


def _tenant(record: Any, where: str, environ: Mapping[str, str]) -> tuple[str, Tenant]:
    """One tenant record: its token and what it may touch."""
    if not isinstance(record, dict):
        raise InputError(where, "expected a mapping with name, token or token_env, namespaces or prefixes")
    unknown = sorted(set(record) - {"name", "token", "token_env", "namespaces", "prefixes"})
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", "unknown field")
    name = record.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"{where}.name", "expected a non-empty string")
    where = f"{where} ({name})"
    if ("token" in record) == ("token_env" in record):
        raise InputError(where, "give exactly one of token and token_env")
    if "token_env" in record:
        token = environ.get(str(record["token_env"]), "")
        if not token:
            raise InputError(f"{where}.token_env", f"variable {record['token_env']} is not set")
    else:
        token = record["token"]
    if not isinstance(token, str) or token_bits(token) < MIN_TOKEN_BITS:
        raise InputError(f"{where}.token", f"expected a random string of at least {MIN_TOKEN_BITS} bits (32 hex or 22 base64url characters, "
                         f"not a word or a repeated pattern); make one with {MAKE_TOKEN}")
    lists = {}
    for key in ("namespaces", "prefixes"):
        value = record.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise InputError(f"{where}.{key}", "expected a list of non-empty strings")
        lists[key] = value
    if not lists["namespaces"] and not lists["prefixes"]:
        raise InputError(where, "may touch nothing: give namespaces or prefixes")
    return token, Tenant(name, frozenset(lists["namespaces"]), tuple(lists["prefixes"]))


def token_bits(token: str) -> float:
    """An upper bound on the bits of randomness of ``token``: its length times the bits of a character of the smallest
    usual alphabet holding it, counting at most four characters for each distinct one (``aaaa…`` or ``abab…`` is no
    stronger for being long); 0 for a token outside every alphabet (spaces, other characters)."""
    size = next((size for size, alphabet in TOKEN_ALPHABETS if set(token) <= alphabet), 0)
    return min(len(token), 4 * len(set(token))) * math.log2(size) if size else 0.0


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
