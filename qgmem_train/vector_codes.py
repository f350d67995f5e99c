"""8-bit codes of unit vectors, as faiss indexes the int8 scans search: encoded in memory, or written to a file and mapped.

A code is ``round(scale * x) + 128`` per component, ``scale`` mapping the block's largest absolute component to
127. The store writes the codes of each unit segment (its facts, then its sentences) into a file next to the
segment's vector sidecar, and a load maps it (faiss ``IO_FLAG_MMAP_IFC``: the index's codes are a view of the
file), so nothing is encoded or copied at load. Everything here needs faiss-cpu (the optional ``ann`` extra).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.fileio import atomic_output

SUFFIX = ".i8"
"""File name suffix of a segment's codes."""
_ADD_CHUNK = 65_536
"""Vectors encoded at a time (bounds the temporary float32 copy)."""


@dataclass
class CodeBlock:
    """The codes of one run of vectors (a segment's facts, then its sentences) and where those vectors are."""

    index: object
    """faiss IndexScalarQuantizer (8-bit direct, L2) of the codes."""
    scale: float
    fact_rows: np.ndarray
    """Unit row of each of the block's facts (its first codes)."""
    sentence_rows: np.ndarray
    """Row, in the namespace's sentence vectors, of each of the block's sentences (its codes after the facts)."""


def has_faiss() -> bool:
    """Whether faiss-cpu (the optional ``ann`` extra) is installed."""
    return importlib.util.find_spec("faiss") is not None


def faiss_module(setting: str):
    """The faiss module, or one clear error naming the ``setting`` that needs it and the extra that provides it."""
    try:
        import faiss
    except ImportError:
        raise ModelUnavailableError(f"{setting} needs faiss-cpu (pip install 'qgmem[ann]')") from None
    return faiss


def build_int8_codes(parts: list[np.ndarray]) -> tuple[object, float]:
    """A faiss index of 8-bit codes ``round(scale * x) + 128`` of the rows of ``parts`` one after the other, and ``scale``.

    ``scale`` maps the largest absolute component to 127, so no component is clipped. Searched with a
    query ``scale * q + 128``, it returns ``scale² · |x' - q|²`` for each decoded vector ``x'``.
    """
    faiss = faiss_module("the int8 scan")
    largest = max((float(np.abs(p).max()) for p in parts if len(p)), default=0.0)
    scale = 127.0 / largest if largest > 0 else 1.0
    index = faiss.IndexScalarQuantizer(parts[0].shape[1], faiss.ScalarQuantizer.QT_8bit_direct, faiss.METRIC_L2)
    for part in parts:
        for start in range(0, len(part), _ADD_CHUNK):
            index.add(np.rint(part[start : start + _ADD_CHUNK] * scale) + 128.0)
    return index, scale


def encode_blocks(facts: np.ndarray, sentences: np.ndarray | None, layout: list[tuple[np.ndarray, np.ndarray]]) -> list[CodeBlock]:
    """Blocks encoded in memory, one per (unit rows of its facts, rows of its sentences) of ``layout``."""
    blocks = []
    for fact_rows, sentence_rows in layout:
        parts = [facts[fact_rows]] + ([sentences[sentence_rows]] if sentences is not None else [])
        index, scale = build_int8_codes(parts)
        blocks.append(CodeBlock(index, scale, np.asarray(fact_rows, np.int64), np.asarray(sentence_rows, np.int64)))
    return blocks


def write(path: Path, parts: list[np.ndarray]) -> tuple[int, float]:
    """Encode ``parts`` into a codes file at ``path`` (fsync'd, renamed into place); return its size in bytes and scale."""
    faiss = faiss_module("writing int8 codes")
    index, scale = build_int8_codes(parts)
    blob = faiss.serialize_index(index)
    with atomic_output(path, "wb") as handle:
        handle.write(blob.tobytes())
    return len(blob), scale


def read(path: Path, size: int, vectors: int, dim: int, what: str) -> object:
    """The codes file at ``path``, mapped; one whose size or shape is not what its sidecar records is an :class:`InputError`."""
    faiss = faiss_module("the int8 scan")
    actual = path.stat().st_size if path.exists() else None
    if actual != size:
        found = "is missing" if actual is None else f"holds {actual} bytes"
        raise InputError(str(path), f"int8 codes of {what} {found}, its sidecar records {size}: not this segment's codes")
    try:
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)
    except RuntimeError:
        raise InputError(str(path), f"int8 codes of {what} do not read as a faiss index: not this segment's codes") from None
    if not isinstance(index, faiss.IndexScalarQuantizer) or (index.ntotal, index.d) != (vectors, dim):
        raise InputError(str(path), f"int8 codes of {what} hold {index.ntotal} {index.d}-d vectors, the segment has {vectors} {dim}-d: not this segment's codes")
    return index
