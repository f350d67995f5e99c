"""Codes of unit vectors, as faiss indexes the dense scans search: encoded in memory, or written to a file and read back.

Two kinds of block:

- **int8**: ``round(scale * x) + 128`` per component (one byte each), ``scale`` mapping the block's largest
  absolute component to 127, searched by L2 distance to ``scale * q + 128``; a load maps the file (faiss
  ``IO_FLAG_MMAP_IFC``: the index's codes are a view of it), so nothing is encoded or copied;
- **pq** (blocks of :data:`PQ_MIN_VECTORS` vectors and more): product quantisation, one 4-bit code for every two
  components (a quarter of int8's bytes), searched by inner product with faiss's fast-scan kernels; trained on
  the block's own rows when it is written, read into memory at load (faiss cannot map these). Its order is
  coarser, so a search rescores more of its candidates exactly (:func:`~qgmem_train.retrieval.dense.rescore_count`).
  Inner products order unit vectors better than L2 distances do here: a reconstruction's norm error does not
  enter them (on 400,000 random unit vectors, exact top 100 found 0.994 against 0.958 with 2,048 rescored).

The store writes the codes of each unit segment (its facts, then its sentences) into a file next to the segment's
vector sidecar. Everything here needs faiss-cpu (the optional ``ann`` extra).
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
PQ_MIN_VECTORS = 20_000
"""From this many vectors a block on, its codes are product-quantised: below it int8 scans take a few milliseconds and a
codebook would learn from few rows."""
PQ_TRAIN_VECTORS = 16_384
"""Rows (drawn with a fixed seed) a block's product quantiser learns its codebooks from."""
PQ_TRAIN_ITERATIONS = 10
"""k-means iterations of each codebook (faiss's default 25 took 2.5x as long for the same exact top 10 and top 100
found on 131,072 random unit vectors)."""
_PQ_CENTROIDS = 16
"""Centroids of each codebook (4-bit codes): the fewest rows a product quantiser can learn from."""


@dataclass
class CodeBlock:
    """The codes of one run of vectors (a segment's facts, then its sentences) and where those vectors are."""

    index: object
    """faiss index of the codes: IndexScalarQuantizer (8-bit direct, L2) or IndexPQFastScan (inner product)."""
    scale: float
    """The int8 codes' scale (1 for product-quantised ones)."""
    fact_rows: np.ndarray
    """Unit row of each of the block's facts (its first codes)."""
    sentence_rows: np.ndarray
    """Row, in the namespace's sentence vectors, of each of the block's sentences (its codes after the facts)."""

    @property
    def kind(self) -> str:
        """``pq`` for product-quantised codes, ``int8`` otherwise."""
        return "pq" if type(self.index).__name__ == "IndexPQFastScan" else "int8"


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


def build_pq_codes(parts: list[np.ndarray]) -> tuple[object, float]:
    """A faiss fast-scan product quantiser (4 bits for every two components, inner product) of the rows of ``parts``
    one after the other, trained on at most :data:`PQ_TRAIN_VECTORS` of them, and the scale 1."""
    faiss = faiss_module("the pq scan")
    dim, total = parts[0].shape[1], sum(len(p) for p in parts)
    if dim % 2 or total < _PQ_CENTROIDS:
        raise ValueError(f"product-quantised codes need an even dimension and at least {_PQ_CENTROIDS} vectors, not {total} {dim}-d")
    picks = np.sort(np.random.default_rng(0).choice(total, min(total, PQ_TRAIN_VECTORS), replace=False))
    starts = np.cumsum([0] + [len(p) for p in parts])
    sample = np.concatenate([parts[k][picks[(picks >= lo) & (picks < hi)] - lo] for k, (lo, hi) in enumerate(zip(starts[:-1], starts[1:]))])
    index = faiss.IndexPQFastScan(dim, dim // 2, 4, faiss.METRIC_INNER_PRODUCT)  # 4 bits: _PQ_CENTROIDS
    index.pq.cp.niter = PQ_TRAIN_ITERATIONS
    index.train(np.ascontiguousarray(sample, np.float32))
    for part in parts:
        for start in range(0, len(part), _ADD_CHUNK):
            index.add(np.ascontiguousarray(part[start : start + _ADD_CHUNK], np.float32))
    return index, 1.0


def can_pq(dim: int, vectors: int) -> bool:
    """Whether a block of ``vectors`` ``dim``-d vectors gets product-quantised codes (an even dimension, :data:`PQ_MIN_VECTORS` on)."""
    return dim % 2 == 0 and vectors >= PQ_MIN_VECTORS


def build_codes(parts: list[np.ndarray]) -> tuple[object, float]:
    """The codes a block of these rows gets: product-quantised where :func:`can_pq` allows, int8 otherwise."""
    if can_pq(parts[0].shape[1], sum(len(p) for p in parts)):
        return build_pq_codes(parts)
    return build_int8_codes(parts)


def encode_blocks(facts: np.ndarray, sentences: np.ndarray | None, layout: list[tuple[np.ndarray, np.ndarray]]) -> list[CodeBlock]:
    """Blocks encoded in memory as the store writes them (:func:`build_codes`), one per (unit rows of its facts, rows of
    its sentences) of ``layout``."""
    blocks = []
    for fact_rows, sentence_rows in layout:
        parts = [facts[fact_rows]] + ([sentences[sentence_rows]] if sentences is not None else [])
        index, scale = build_codes(parts)
        blocks.append(CodeBlock(index, scale, np.asarray(fact_rows, np.int64), np.asarray(sentence_rows, np.int64)))
    return blocks


def write(path: Path, parts: list[np.ndarray]) -> tuple[int, float]:
    """Encode ``parts`` (:func:`build_codes`) into a codes file at ``path`` (fsync'd, renamed into place); return its size in bytes and scale."""
    faiss = faiss_module("writing vector codes")
    index, scale = build_codes(parts)
    blob = faiss.serialize_index(index)
    with atomic_output(path, "wb") as handle:
        handle.write(blob.tobytes())
    return len(blob), scale


def read(path: Path, size: int, vectors: int, dim: int, what: str) -> object:
    """The codes file at ``path`` (int8 codes mapped, product-quantised ones read); one whose size or shape is not what its
    sidecar records is an :class:`InputError`."""
    faiss = faiss_module("reading vector codes")
    actual = path.stat().st_size if path.exists() else None
    if actual != size:
        found = "is missing" if actual is None else f"holds {actual} bytes"
        raise InputError(str(path), f"vector codes of {what} {found}, its sidecar records {size}: not this segment's codes")
    try:
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)
    except RuntimeError:
        raise InputError(str(path), f"vector codes of {what} do not read as a faiss index: not this segment's codes") from None
    if not isinstance(index, (faiss.IndexScalarQuantizer, faiss.IndexPQFastScan)) or (index.ntotal, index.d) != (vectors, dim):
        raise InputError(str(path), f"vector codes of {what} hold {index.ntotal} {index.d}-d vectors, the segment has {vectors} {dim}-d: not this segment's codes")
    return index
