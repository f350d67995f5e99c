"""Vector sidecars: a unit segment's float32 vectors in a file of their own next to the store, read through a memory map.

A sidecar is written (fsync'd, renamed into place) by the transaction that adds its segment, before
that transaction commits, under a name no other write uses; the segment's row records the name, the
size and a random token that the file also holds, so a load checks the file against its store and
refuses one that does not match. Before writing a sidecar, a write records its token in the folder's
:data:`WRITTEN` file. A write killed before its commit leaves an unreferenced file and the store as it
was; the next write (which holds the write lock, so no other write is half done) removes such files, and
the files of segments that earlier writes replaced: only files of the store's own names whose token it
recorded, so a file anyone else put in the folder is never removed. Every file is opened only once it is known to
be a regular file (a FIFO in its place is refused in one line rather than block the write or the load).

With faiss installed, a sidecar also has a codes file (:mod:`qgmem_train.vector_codes`: a faiss index of the
codes of the segment's facts and sentences, int8 or, for a large segment, product-quantised), written before it
under the same token; the sidecar records the codes file's size and scale (``code_bytes``, ``code_scale``). A
sidecar without them (one written without faiss, or before codes were kept), or whose codes file is gone (removed
by a writer that keeps none), has its codes encoded at load; a codes file of another size is refused.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from qgmem_train import vector_codes
from qgmem_train.errors import InputError
from qgmem_train.fileio import atomic_output, open_regular
from qgmem_train.memory.columns import pack_arrays, unpack_arrays

FOLDER = "vectors"
"""The sidecars' folder, next to the store's SQLite file."""
SUFFIX = ".vec"
WRITTEN = "written.tokens"
"""The tokens of the sidecars this store wrote and has not removed, one a line: the only files a write removes."""
_TOKEN_FORM = re.compile(r"[0-9a-f]{32}")
_NAME_FORM = re.compile(rf"({_TOKEN_FORM.pattern}){re.escape(SUFFIX)}")
_TOKEN = "token"
"""Name of the array holding the file's token inside the sidecar."""
CODE_BYTES, CODE_SCALE = "code_bytes", "code_scale"
"""Names of the arrays recording the codes file's size and scale inside the sidecar."""


class SidecarMissing(InputError):
    """A segment's sidecar is gone: a later write replaced the segment after this read's snapshot began (read again)."""


def folder_of(db: sqlite3.Connection) -> Path:
    """The sidecar folder of the store ``db`` is connected to."""
    return Path(db.execute("PRAGMA database_list").fetchone()[2]).parent / FOLDER


def write(folder: Path, arrays: Mapping[str, np.ndarray], coded: Sequence[str] = ()) -> tuple[str, int, str]:
    """Write ``arrays`` as a new sidecar in ``folder``, with the codes of the ``coded`` arrays one after the other
    when faiss is installed; return its name, size in bytes and token."""
    token = secrets.token_hex(16)
    name = f"{token}{SUFFIX}"
    _record_written(folder, token)
    codes: dict[str, np.ndarray] = {}
    if coded and vector_codes.has_faiss():
        size, scale = vector_codes.write(codes_path(folder, name), [arrays[key] for key in coded])
        codes = {CODE_BYTES: np.asarray([size], np.int64), CODE_SCALE: np.asarray([scale], np.float64)}
    blob = pack_arrays({_TOKEN: np.frombuffer(bytes.fromhex(token), np.uint8), **arrays, **codes})
    with atomic_output(folder / name, "wb") as handle:
        handle.write(blob)
    return name, len(blob), token


def read(folder: Path, name: str, size: int, token: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of sidecar ``name``, as read-only views of a memory map; one that does not match its record is an :class:`InputError`.

    A name that is not the store's own form for ``token`` (``<token>.vec``) is refused before anything is opened:
    a handed-over store's records name no file outside its folder.
    """
    if token_of(name) != token:
        raise InputError(str(folder), f"vector sidecar of {what} is named {name!r}, not one of the store's own (its token followed by {SUFFIX}); refusing to open it")
    path = folder / name
    try:
        with open_regular(path) as handle:
            actual = os.fstat(handle.fileno()).st_size
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if actual else b""
    except FileNotFoundError:
        raise SidecarMissing(str(path), f"vector sidecar of {what} is missing") from None
    if actual != size:
        raise InputError(str(path), f"vector sidecar of {what} holds {actual} bytes, its store records {size}: not this store's file")
    arrays = unpack_arrays(mapped)
    if _TOKEN not in arrays or arrays[_TOKEN].tobytes().hex() != token:
        raise InputError(str(path), f"vector sidecar of {what} does not carry its store's token: not this store's file")
    return {key: value for key, value in arrays.items() if key != _TOKEN}


def codes_path(folder: Path, name: str) -> Path:
    """The codes file of sidecar ``name``."""
    return folder / (Path(name).stem + vector_codes.SUFFIX)


def token_of(name: str) -> str | None:
    """The token of a sidecar name of the store's own form (``<32 hex digits>.vec``); None for any other name."""
    match = _NAME_FORM.fullmatch(name)
    return match.group(1) if match else None


def _record_written(folder: Path, token: str) -> None:
    """Add ``token`` to the folder's record of written sidecars (fsync'd before any of its files exists)."""
    folder.mkdir(exist_ok=True)
    with open_regular(folder / WRITTEN, "a") as handle:
        handle.write(f"{token}\n")
        handle.flush()
        os.fsync(handle.fileno())


def _written(folder: Path) -> set[str]:
    """The tokens recorded in the folder's :data:`WRITTEN` file (lines of another form, such as one cut short, are not)."""
    try:
        with open_regular(folder / WRITTEN) as handle:
            lines = handle.read().decode("ascii", "replace").splitlines()
    except FileNotFoundError:
        return set()
    return {line for line in lines if _TOKEN_FORM.fullmatch(line)}


def remove_unreferenced(folder: Path, referenced: set[str]) -> None:
    """Delete the sidecars (and their codes and staging files) this store wrote that no committed segment references,
    and keep the record of written tokens to those referenced (call under the store's write lock)."""
    if not folder.is_dir():
        return
    kept = {token for token in map(token_of, referenced) if token is not None}
    written = _written(folder)
    for token in written - kept:
        for suffix in (SUFFIX, vector_codes.SUFFIX):
            (folder / f"{token}{suffix}").unlink(missing_ok=True)
            for staging in folder.glob(f".{token}{suffix}.*"):  # a write killed inside atomic_output
                staging.unlink(missing_ok=True)
    if written != kept:
        with atomic_output(folder / WRITTEN, "w") as handle:
            handle.write("".join(f"{token}\n" for token in sorted(kept)))
