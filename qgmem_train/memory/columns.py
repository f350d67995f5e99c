"""Columnar building blocks of the store: packed strings, child rows grouped by owner, arrays packed into one blob.

A column of N strings is two arrays (UTF-8 bytes and each string's end offset) rather than N Python
objects, so a namespace loads by copying bytes; a string is decoded only when it is read.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

_ALIGN = 8
"""Byte alignment of each array inside a packed blob (the widest dtype stored is 8 bytes)."""


class TextColumn(Sequence):
    """N strings (or None where ``missing``) as UTF-8 bytes and the end offset of each; decoded on access."""

    def __init__(self, data: np.ndarray, ends: np.ndarray, missing: np.ndarray | None = None) -> None:
        self.data = np.asarray(data, np.uint8)
        self.ends = np.asarray(ends, np.int64)
        self.missing = None if missing is None or not np.any(missing) else np.asarray(missing, bool)
        self._buffer = memoryview(self.data)

    @classmethod
    def from_strings(cls, texts: Iterable[str | None]) -> TextColumn:
        """Pack ``texts`` (None allowed)."""
        texts = list(texts)
        encoded = [b"" if t is None else t.encode("utf-8") for t in texts]
        ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
        missing = np.fromiter((t is None for t in texts), bool, len(texts))
        return cls(np.frombuffer(b"".join(encoded), np.uint8), ends, missing)

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, index: int) -> str | None:  # type: ignore[override]
        i = operator.index(index)
        if i < 0:
            i += len(self.ends)
        if not 0 <= i < len(self.ends):
            raise IndexError(index)
        if self.missing is not None and self.missing[i]:
            return None
        return str(self._buffer[int(self.ends[i - 1]) if i else 0 : int(self.ends[i])], "utf-8")

    def __iter__(self) -> Iterator[str | None]:
        return iter(self.tolist())

    def tolist(self) -> list[str | None]:
        """Every string, decoded in one pass (one slice of one decoded text when it is all ASCII)."""
        raw = self.data.tobytes()
        text = raw.decode("utf-8")
        bounds = self.ends.tolist()
        starts = [0, *bounds[:-1]]
        if len(text) == len(raw):
            out: list[str | None] = [text[a:b] for a, b in zip(starts, bounds)]
        else:
            out = [raw[a:b].decode("utf-8") for a, b in zip(starts, bounds)]
        if self.missing is not None:
            for i in np.flatnonzero(self.missing).tolist():
                out[i] = None
        return out

    def take(self, rows: np.ndarray) -> TextColumn:
        """The strings at ``rows``, in that order."""
        rows = np.asarray(rows, np.int64)
        starts = np.concatenate([[0], self.ends[:-1]])[rows] if len(self.ends) else np.zeros(0, np.int64)
        lengths = self.ends[rows] - starts if len(rows) else np.zeros(0, np.int64)
        missing = self.missing[rows] if self.missing is not None else None
        return TextColumn(self.data[ranges(starts, lengths)], np.cumsum(lengths, dtype=np.int64), missing)

    @staticmethod
    def concat(columns: Sequence[TextColumn]) -> TextColumn:
        """The columns one after the other."""
        shifts = np.cumsum([0] + [len(c.data) for c in columns[:-1]], dtype=np.int64)
        ends = np.concatenate([np.zeros(0, np.int64), *(c.ends + s for c, s in zip(columns, shifts))])
        missing = None
        if any(c.missing is not None for c in columns):
            missing = np.concatenate([c.missing if c.missing is not None else np.zeros(len(c), bool) for c in columns])
        return TextColumn(np.concatenate([np.zeros(0, np.uint8), *(c.data for c in columns)]), ends, missing)

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        """The column as named arrays for :func:`pack_arrays`."""
        out = {f"{name}.data": self.data, f"{name}.ends": self.ends}
        if self.missing is not None:
            out[f"{name}.missing"] = self.missing
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], name: str) -> TextColumn:
        """The column ``name`` stored by :meth:`arrays`."""
        return cls(arrays[f"{name}.data"], arrays[f"{name}.ends"], arrays.get(f"{name}.missing"))


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, without the Python loop."""
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    before = np.cumsum(lengths) - lengths
    return np.repeat(starts - before, lengths) + np.arange(total, dtype=np.int64)


def group_bounds(owner: np.ndarray, n_owners: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each owner's rows in ``owner`` (sorted: child rows are grouped by owner)."""
    keys = np.arange(n_owners + 1)
    edges = np.searchsorted(owner, keys)
    return edges[:-1], edges[1:]


def take_children(owner: np.ndarray, n_owners: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Child rows of the owners ``rows`` (grouped in that order) and their new owner index (position in ``rows``)."""
    starts, ends = group_bounds(owner, n_owners)
    counts = ends[rows] - starts[rows]
    return ranges(starts[rows], counts), np.repeat(np.arange(len(rows), dtype=np.int64), counts)


def pack_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Named arrays as one blob: a JSON header (name, dtype, shape of each) and the arrays' bytes, each aligned."""
    header, chunks, at = [], [], 0
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        header.append([name, array.dtype.str, list(array.shape), at])
        raw = array.tobytes()
        pad = -len(raw) % _ALIGN
        chunks.append(raw + b"\0" * pad)
        at += len(raw) + pad
    head = json.dumps(header).encode("utf-8")
    head += b" " * (-len(head) % _ALIGN)
    return len(head).to_bytes(8, "little") + head + b"".join(chunks)


def unpack_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """The arrays of :func:`pack_arrays`, as read-only views of ``blob``."""
    size = int.from_bytes(blob[:8], "little")
    base = 8 + size
    out = {}
    for name, dtype, shape, at in json.loads(blob[8:base]):
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = np.frombuffer(blob, dtype, count, base + at).reshape(shape)
    return out
