"""Dense channel: cosine similarity between the query and the units' normalised fact embeddings.

A unit whose fact has several sentences also has one vector per sentence; its score is the best
cosine over all its vectors. Three ways to search, all returning exact float32 cosines:

- **float32 scan**: one matrix-vector product over every vector and a partial sort (small namespaces);
- **int8 scan** (from :data:`SCAN_INT8_MIN_VECTORS` vectors on, or ``scan="int8"``): the vectors are
  also kept as 8-bit codes, a quarter of the bytes, and a faiss scan over those codes picks the best
  :func:`rescore_count` vectors; those vectors are rescored exactly in float32 and each unit takes the
  best of its own. The scan reads memory at a quarter of the float32 cost; a unit whose best vector
  falls outside the candidates is missed, or scored by its best vector among them;
- **HNSW** (``approximate``): faiss graphs over inner products, one of the facts (so ``n`` units always
  come back) and one of the sentences; the units found are rescored exactly. For millions of units.

The int8 scan and HNSW need faiss-cpu (the optional ``ann`` extra); without it ``scan="auto"``
keeps the float32 scan.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

import numpy as np

from qgmem_train.errors import ModelUnavailableError
from qgmem_train.retrieval.ranking import top_n

HNSW_NEIGHBOURS = 32
"""Graph degree M of the HNSW index (faiss default range 16-64)."""
HNSW_EF_SEARCH = 256
"""Candidate list size at search time; comfortably above n=100 for high recall."""
SCAN_INT8_MIN_VECTORS = 50_000
"""From this many vectors (facts and sentences) on, ``scan="auto"`` searches the int8 codes: below it the
float32 scan takes a few milliseconds at most."""
RESCORE_MIN = 512
"""Fewest vectors the int8 scan hands to the exact float32 rescoring."""
RESCORE_PER_RESULT = 8
"""Vectors rescored per unit asked for: a unit may hold several of the best vectors (its sentences)."""
WIDEN_FACTOR = 4
"""How much a search widens its candidate vectors when they belong to fewer than the units asked for."""
_ADD_CHUNK = 65_536
"""Vectors encoded into int8 codes at a time (bounds the temporary float32 copy)."""

Scan = Literal["auto", "float32", "int8"]


def rescore_count(n: int) -> int:
    """How many int8-scan candidates (vectors) are rescored exactly for a top-``n`` search."""
    return max(RESCORE_MIN, RESCORE_PER_RESULT * n)


class DenseIndex:
    """Nearest units by inner product of L2-normalised embeddings (= cosine), best over a unit's vectors.

    ``sentence_embeddings`` are extra vectors of some units, grouped by unit; ``sentence_unit`` gives
    the unit row of each (non-decreasing). ``scan`` picks the exhaustive search: ``float32``, ``int8``
    codes with exact rescoring, or ``auto`` (int8 from :data:`SCAN_INT8_MIN_VECTORS` vectors when faiss
    is installed). ``approximate`` searches a faiss HNSW graph instead.
    """

    def __init__(
        self,
        embeddings: np.ndarray,
        sentence_embeddings: np.ndarray | None = None,
        sentence_unit: np.ndarray | None = None,
        *,
        approximate: bool = False,
        scan: Scan = "auto",
    ):
        if scan not in ("auto", "float32", "int8"):
            raise ValueError(f"unknown dense scan {scan!r} (auto, float32, int8)")
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        has_sentences = sentence_embeddings is not None and len(sentence_embeddings) > 0
        self.sentences = np.ascontiguousarray(sentence_embeddings, dtype=np.float32) if has_sentences else None
        self._owners = np.asarray(sentence_unit, np.int64) if has_sentences else np.zeros(0, np.int64)
        owners = self._owners
        self._group_start = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]]) if has_sentences else owners
        self._group_unit = owners[self._group_start]
        # Unit row of each vector of a faiss index: the facts, then the sentences.
        self._vector_unit = np.concatenate([np.arange(len(self.embeddings), dtype=np.int64), owners])
        self._hnsw = self._hnsw_sentences = self._codes = None
        self._code_scale = 1.0
        if approximate and len(self.embeddings):
            self._hnsw = _build_hnsw(self.embeddings)
            self._hnsw_sentences = _build_hnsw(self.sentences) if self.sentences is not None else None
        elif _wants_int8(scan, len(self._vector_unit)):
            self._codes, self._code_scale = build_int8_codes([self.embeddings] if self.sentences is None else [self.embeddings, self.sentences])

    @property
    def approximate(self) -> bool:
        """Whether :meth:`search` differs from a full float32 scan (HNSW graph or int8 scan): callers then search through it."""
        return self._hnsw is not None or self._codes is not None

    @property
    def scan(self) -> str:
        """The search :meth:`search` runs: ``hnsw``, ``int8`` or ``float32``."""
        return "hnsw" if self._hnsw is not None else "int8" if self._codes is not None else "float32"

    def similarities(self, query: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Exact best cosine of the query with every unit, or with the units at ``rows``."""
        query = np.asarray(query, dtype=np.float32)
        if rows is not None:
            return self._exact(query, np.asarray(rows, np.int64))
        scores = self.embeddings @ query
        if self.sentences is not None:
            best = np.maximum.reduceat(self.sentences @ query, self._group_start)
            scores[self._group_unit] = np.maximum(scores[self._group_unit], best)
        return scores

    def _exact(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Exact best cosine of the units at ``rows``, reading only their own vectors."""
        scores = self.embeddings[rows] @ query
        if self.sentences is None or len(rows) == 0:
            return scores
        starts = np.searchsorted(self._owners, rows)
        counts = np.searchsorted(self._owners, rows, side="right") - starts
        has = np.flatnonzero(counts)
        if len(has):
            counts_has = counts[has]
            offsets = np.cumsum(counts_has) - counts_has
            flat = np.repeat(starts[has] - offsets, counts_has) + np.arange(int(counts_has.sum()))
            best = np.maximum.reduceat(self.sentences[flat] @ query, offsets)
            scores[has] = np.maximum(scores[has], best)
        return scores

    def search(self, query: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and cosines of the ``n`` nearest units, best first."""
        query = np.asarray(query, dtype=np.float32)
        if self._codes is not None:
            return self._search_int8(query, n)
        if self._hnsw is None:
            return top_n(self.similarities(query), n)
        n = min(n, len(self.embeddings))
        _, fact_hits = self._hnsw.search(query[None, :], n)
        candidates = fact_hits[0][fact_hits[0] >= 0]
        if self._hnsw_sentences is not None:
            _, sentence_hits = self._hnsw_sentences.search(query[None, :], min(self._hnsw_sentences.ntotal, 2 * n))
            candidates = np.union1d(candidates, self._owners[sentence_hits[0][sentence_hits[0] >= 0]])
        rows, scores = top_n(self._exact(query, candidates), n)
        return candidates[rows], scores

    def _search_int8(self, query: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Best :func:`rescore_count` vectors by their int8 codes, rescored exactly in float32; each unit scores its best.

        Only the candidate vectors are read in float32 (a few hundred rows, not every vector of their units).
        When they belong to fewer than ``n`` units (units with many close sentences), the scan widens.
        """
        n = min(n, len(self.embeddings))
        wanted = min(self._codes.ntotal, rescore_count(n))
        # Codes hold round(scale * x) + 128; for unit vectors the L2 order to the scaled query is the cosine order.
        scaled = (query * self._code_scale + 128.0)[None, :]
        while True:
            _, hits = self._codes.search(scaled, wanted)
            vectors = hits[0][hits[0] >= 0]
            candidates, unit_of_vector = np.unique(self._vector_unit[vectors], return_inverse=True)
            if len(candidates) >= n or wanted >= self._codes.ntotal:
                break
            wanted = min(self._codes.ntotal, WIDEN_FACTOR * wanted)
        best = np.full(len(candidates), -np.inf, np.float32)
        np.maximum.at(best, unit_of_vector, self._vector_cosines(query, vectors))
        rows, scores = top_n(best, n)
        return candidates[rows], scores

    def _vector_cosines(self, query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """Exact cosines of the query with the vectors at int8-index positions ``vectors`` (the facts, then the sentences)."""
        facts = len(self.embeddings)
        is_fact = vectors < facts
        cosines = np.empty(len(vectors), np.float32)
        cosines[is_fact] = self.embeddings[vectors[is_fact]] @ query
        if self.sentences is not None:
            cosines[~is_fact] = self.sentences[vectors[~is_fact] - facts] @ query
        return cosines


def _faiss(setting: str):
    """The faiss module, or one clear error naming the ``setting`` that needs it and the extra that provides it."""
    try:
        import faiss
    except ImportError:
        raise ModelUnavailableError(f"{setting} needs faiss-cpu (pip install 'qgmem[ann]')") from None
    return faiss


def _wants_int8(scan: Scan, vectors: int) -> bool:
    """Whether to build int8 codes: asked for, or ``auto`` at :data:`SCAN_INT8_MIN_VECTORS` vectors with faiss installed."""
    if scan == "int8":
        return vectors > 0
    return scan == "auto" and vectors >= SCAN_INT8_MIN_VECTORS and has_faiss()


def has_faiss() -> bool:
    """Whether faiss-cpu (the optional ``ann`` extra) is installed."""
    return importlib.util.find_spec("faiss") is not None


def build_int8_codes(parts: list[np.ndarray]) -> tuple[object, float]:
    """A faiss index of 8-bit codes ``round(scale * x) + 128`` of the rows of ``parts`` one after the other, and ``scale``.

    ``scale`` maps the largest absolute component to 127, so no component is clipped. Searched with a
    query ``scale * q + 128``, it returns ``scale² · |x' - q|²`` for each decoded vector ``x'``.
    """
    faiss = _faiss("the int8 scan")
    largest = max(float(np.abs(p).max()) for p in parts if len(p))
    scale = 127.0 / largest if largest > 0 else 1.0
    index = faiss.IndexScalarQuantizer(parts[0].shape[1], faiss.ScalarQuantizer.QT_8bit_direct, faiss.METRIC_L2)
    for part in parts:
        for start in range(0, len(part), _ADD_CHUNK):
            index.add(np.rint(part[start : start + _ADD_CHUNK] * scale) + 128.0)
    return index, scale


def _build_hnsw(embeddings: np.ndarray):
    """A faiss HNSW index over inner products of ``embeddings``."""
    faiss = _faiss("retrieval.approximate")
    index = faiss.IndexHNSWFlat(embeddings.shape[1], HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = HNSW_EF_SEARCH
    index.add(embeddings)
    return index
