"""Vector sidecars: a unit segment's float32 vectors in a file of their own next to the store, read through a memory map.

A sidecar is written (fsync'd, renamed into place) by the transaction that adds its segment, before
that transaction commits, under a name no other write uses; the segment's row records the name, the
size and a random token that the file also holds, so a load checks the file against its store and
refuses one that does not match. A write killed before its commit leaves an unreferenced file and the
store as it was; the next write (which holds the write lock, so no other write is half done) removes
such files, and the files of segments that earlier writes replaced.

With faiss installed, a sidecar also has a codes file (:mod:`qgmem_train.vector_codes`: a faiss index of the
codes of the segment's facts and sentences, int8 or, for a large segment, product-quantised), written before it
under the same token; the sidecar records the codes file's size and scale (``code_bytes``, ``code_scale``). A
sidecar without them (one written without faiss, or before codes were kept), or whose codes file is gone (removed
by a writer that keeps none), has its codes encoded at load; a codes file of another size is refused.
"""

from __future__ import annotations

import mmap
import os
import secrets
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from qgmem_train import vector_codes
from qgmem_train.errors import InputError
from qgmem_train.fileio import atomic_output
from qgmem_train.memory.columns import pack_arrays, unpack_arrays

FOLDER = "vectors"
"""The sidecars' folder, next to the store's SQLite file."""
SUFFIX = ".vec"
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
    codes: dict[str, np.ndarray] = {}
    if coded and vector_codes.has_faiss():
        size, scale = vector_codes.write(codes_path(folder, name), [arrays[key] for key in coded])
        codes = {CODE_BYTES: np.asarray([size], np.int64), CODE_SCALE: np.asarray([scale], np.float64)}
    blob = pack_arrays({_TOKEN: np.frombuffer(bytes.fromhex(token), np.uint8), **arrays, **codes})
    with atomic_output(folder / name, "wb") as handle:
        handle.write(blob)
    return name, len(blob), token


def read(folder: Path, name: str, size: int, token: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of sidecar ``name``, as read-only views of a memory map; one that does not match its record is an :class:`InputError`."""
    path = folder / name
    try:
        with open(path, "rb") as handle:
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


def remove_unreferenced(folder: Path, referenced: set[str]) -> None:
    """Delete the files of ``folder`` (sidecars and their codes) that no committed segment references (call under the store's write lock)."""
    if not folder.is_dir():
        return
    for entry in os.scandir(folder):
        if entry.is_file() and Path(entry.name).stem + SUFFIX not in referenced:
            Path(entry.path).unlink(missing_ok=True)
