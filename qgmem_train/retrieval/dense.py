"""Dense channel: cosine similarity between the query and the units' normalised fact embeddings.

A unit whose fact has several sentences also has one vector per sentence; its score is the best
cosine over all its vectors. Three ways to search, all returning exact float32 cosines:

- **float32 scan**: one matrix-vector product over every vector and a partial sort (small namespaces);
- **code scan** (from :data:`SCAN_INT8_MIN_VECTORS` vectors on, or ``scan="int8"`` / ``"pq"``): the vectors
  are also kept as codes (:mod:`qgmem_train.vector_codes`): 8-bit codes, a quarter of the bytes, or in blocks
  of many vectors product-quantised ones, a sixteenth. A loaded namespace has its segments' codes as the store
  wrote them (large segments product-quantised); one encoded in memory gets int8 codes, or ``pq`` ones when
  asked. A faiss scan over the codes picks the best :func:`rescore_count` vectors; those vectors are rescored
  exactly in float32 and each unit takes the best of its own. A unit whose best vector falls outside the
  candidates is missed, or scored by its best vector among them;
- **HNSW** (``approximate``): faiss graphs over inner products, one of the facts (so ``n`` units always
  come back) and one of the sentences; the units found are rescored exactly. For millions of units.

The code scans and HNSW need faiss-cpu (the optional ``ann`` extra); without it ``scan="auto"``
keeps the float32 scan.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from qgmem_train.memory.row_stack import RowStack, row_blocks
from qgmem_train.retrieval.ranking import top_n
from qgmem_train.vector_codes import CodeBlock, build_int8_codes, build_pq_codes, faiss_module, has_faiss

HNSW_NEIGHBOURS = 32
"""Graph degree M of the HNSW index (faiss default range 16-64)."""
HNSW_EF_SEARCH = 256
"""Candidate list size at search time; comfortably above n=100 for high recall."""
SCAN_INT8_MIN_VECTORS = 50_000
"""From this many vectors (facts and sentences) on, ``scan="auto"`` searches codes: below it the
float32 scan takes a few milliseconds at most."""
RESCORE_MIN = 512
"""Fewest vectors the int8 scan hands to the exact float32 rescoring."""
RESCORE_PER_RESULT = 8
"""Vectors rescored per unit asked for: a unit may hold several of the best vectors (its sentences)."""
PQ_RESCORE_MIN = 2_048
"""Fewest vectors a scan with product-quantised codes hands to the rescoring: their order is coarser than int8's."""
PQ_RESCORE_PER_RESULT = 20
"""Vectors rescored per unit asked for when some codes are product-quantised."""
BLOCK_SLACK = 16
"""Codes asked of each block beyond its share of the candidates (see :meth:`DenseIndex._nearest_codes`)."""
WIDEN_FACTOR = 4
"""How much a search widens its candidate vectors when they belong to fewer than the units asked for."""

Scan = Literal["auto", "float32", "int8", "pq"]


def rescore_count(n: int, pq: bool = False) -> int:
    """How many code-scan candidates (vectors) are rescored exactly for a top-``n`` search (more when some codes are ``pq``)."""
    if pq:
        return max(PQ_RESCORE_MIN, PQ_RESCORE_PER_RESULT * n)
    return max(RESCORE_MIN, RESCORE_PER_RESULT * n)


class DenseIndex:
    """Nearest units by inner product of L2-normalised embeddings (= cosine), best over a unit's vectors.

    ``sentence_embeddings`` are extra vectors of some units, grouped by unit; ``sentence_unit`` gives
    the unit row of each (non-decreasing). ``scan`` picks the exhaustive search: ``float32``, ``int8`` or
    ``pq`` codes with exact rescoring, or ``auto`` (codes from :data:`SCAN_INT8_MIN_VECTORS` vectors when
    faiss is installed). ``approximate`` searches a faiss HNSW graph instead. ``code_blocks`` are codes
    already made (a loaded namespace's, read from its segments' codes files, of either kind); without them
    the scan encodes the vectors as one block, product-quantised for ``pq`` and int8 otherwise. The vectors may be
    a :class:`~qgmem_train.memory.row_stack.RowStack` (a loaded namespace's segments, mapped): the scans and the
    rescoring read them where they lie.
    """

    def __init__(
        self,
        embeddings: np.ndarray | RowStack,
        sentence_embeddings: np.ndarray | RowStack | None = None,
        sentence_unit: np.ndarray | None = None,
        *,
        approximate: bool = False,
        scan: Scan = "auto",
        code_blocks: list[CodeBlock] | None = None,
    ):
        if scan not in ("auto", "float32", "int8", "pq"):
            raise ValueError(f"unknown dense scan {scan!r} (auto, float32, int8, pq)")
        self.embeddings = _float32_rows(embeddings)
        has_sentences = sentence_embeddings is not None and len(sentence_embeddings) > 0
        self.sentences = _float32_rows(sentence_embeddings) if has_sentences else None
        self._owners = np.asarray(sentence_unit, np.int64) if has_sentences else np.zeros(0, np.int64)
        owners = self._owners
        self._group_start = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]]) if has_sentences else owners
        self._group_unit = owners[self._group_start]
        # Unit row of each vector of a faiss index: the facts, then the sentences.
        self._vector_unit = np.concatenate([np.arange(len(self.embeddings), dtype=np.int64), owners])
        self._hnsw = self._hnsw_sentences = self._codes = None
        if approximate and len(self.embeddings):
            self._hnsw = _build_hnsw(self.embeddings)
            self._hnsw_sentences = _build_hnsw(self.sentences) if self.sentences is not None else None
        elif _wants_codes(scan, len(self._vector_unit)):
            self._codes = self._code_blocks(code_blocks, scan == "pq")
        self._pq = self._codes is not None and any(block.kind == "pq" for block, _ in self._codes)

    def _code_blocks(self, blocks: list[CodeBlock] | None, pq: bool) -> list[tuple[CodeBlock, np.ndarray]]:
        """Each code block with the vector (fact row, or fact count + sentence row) of each code; one block encoded now
        (product-quantised when ``pq``) when none are given."""
        if blocks is None:
            build = build_pq_codes if pq else build_int8_codes
            index, scale = build(row_blocks(self.embeddings) + (row_blocks(self.sentences) if self.sentences is not None else []))
            blocks = [CodeBlock(index, scale, np.arange(len(self.embeddings)), np.arange(len(self._owners)))]
        facts = len(self.embeddings)
        if sum(len(b.fact_rows) for b in blocks) != facts or sum(len(b.sentence_rows) for b in blocks) != len(self._owners):
            raise ValueError("the code blocks do not cover the index's facts and sentences once each")
        return [(b, np.concatenate([b.fact_rows, facts + b.sentence_rows]).astype(np.int64)) for b in blocks]

    @property
    def approximate(self) -> bool:
        """Whether :meth:`search` differs from a full float32 scan (HNSW graph or code scan): callers then search through it."""
        return self._hnsw is not None or self._codes is not None

    @property
    def scan(self) -> str:
        """The search :meth:`search` runs: ``hnsw``, ``pq`` (some codes product-quantised), ``int8`` or ``float32``."""
        if self._hnsw is not None:
            return "hnsw"
        return "float32" if self._codes is None else "pq" if self._pq else "int8"

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
            return self._search_codes(query, n)
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

    def _search_codes(self, query: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Best :func:`rescore_count` vectors by their codes, rescored exactly in float32; each unit scores its best.

        Only the candidate vectors are read in float32 (a few hundred rows, not every vector of their units).
        When they belong to fewer than ``n`` units (units with many close sentences), the scan widens.
        """
        n = min(n, len(self.embeddings))
        total = len(self._vector_unit)
        wanted = min(total, rescore_count(n, self._pq))
        while True:
            vectors = self._nearest_codes(query, wanted)
            candidates, unit_of_vector = np.unique(self._vector_unit[vectors], return_inverse=True)
            if len(candidates) >= n or wanted >= total:
                break
            wanted = min(total, WIDEN_FACTOR * wanted)
        best = np.full(len(candidates), -np.inf, np.float32)
        np.maximum.at(best, unit_of_vector, self._vector_cosines(query, vectors))
        rows, scores = top_n(best, n)
        return candidates[rows], scores

    def _nearest_codes(self, query: np.ndarray, wanted: int) -> np.ndarray:
        """The ``wanted`` vectors nearest ``query`` by their decoded codes, over every block.

        Each block is first asked for its share of ``wanted`` (twice its share of the vectors, and
        :data:`BLOCK_SLACK` more): a short heap per block, not ``wanted`` each. A block whose last one found
        is still nearer than the ``wanted``-th overall may hold more of them, and is asked again for
        ``wanted``; the result is the ``wanted`` nearest of all codes, as one index over them all gives.
        """
        total = len(self._vector_unit)
        found = [self._search_block(query, block, vector_of_code, self._block_share(block, wanted, total)) for block, vector_of_code in self._codes]
        if len(found) == 1:
            return found[0][1]
        cutoff = _kth_smallest(np.concatenate([d for d, _ in found]), wanted)
        for k, (block, vector_of_code) in enumerate(self._codes):
            distances = found[k][0]
            if len(distances) < min(wanted, block.index.ntotal) and len(distances) and distances[-1] <= cutoff:
                found[k] = self._search_block(query, block, vector_of_code, wanted)
        distances, vectors = np.concatenate([d for d, _ in found]), np.concatenate([v for _, v in found])
        return vectors if len(vectors) <= wanted else vectors[np.argpartition(distances, wanted - 1)[:wanted]]

    @staticmethod
    def _block_share(block: CodeBlock, wanted: int, total: int) -> int:
        """How many of a block's nearest codes to ask for first (see :meth:`_nearest_codes`)."""
        return min(block.index.ntotal, wanted, -(-2 * wanted * block.index.ntotal // total) + BLOCK_SLACK)

    @staticmethod
    def _search_block(query: np.ndarray, block: CodeBlock, vector_of_code: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Squared distances to the decoded codes (ascending) and vectors of the block's ``k`` nearest codes.

        int8 codes hold ``round(scale * x) + 128``: the L2 distance to the scaled query, over ``scale²``. Product-quantised
        codes give inner products ``s``; for unit vectors ``|x - q|² = 2 - 2s``, so both kinds of block compare.
        """
        k = min(k, block.index.ntotal)
        if block.kind == "pq":
            similarities, hits = block.index.search(query[None, :], k)
            kept = hits[0] >= 0
            return 2.0 - 2.0 * similarities[0][kept], vector_of_code[hits[0][kept]]
        found, hits = block.index.search((query * block.scale + 128.0)[None, :], k)
        kept = hits[0] >= 0
        return found[0][kept] / block.scale**2, vector_of_code[hits[0][kept]]

    def _vector_cosines(self, query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """Exact cosines of the query with ``vectors`` (fact rows, then the fact count plus sentence rows)."""
        facts = len(self.embeddings)
        is_fact = vectors < facts
        cosines = np.empty(len(vectors), np.float32)
        cosines[is_fact] = self.embeddings[vectors[is_fact]] @ query
        if self.sentences is not None:
            cosines[~is_fact] = self.sentences[vectors[~is_fact] - facts] @ query
        return cosines


def _float32_rows(vectors: np.ndarray | RowStack) -> np.ndarray | RowStack:
    """``vectors`` as contiguous float32 rows; a float32 :class:`RowStack` as it is (its blocks are read in place)."""
    if isinstance(vectors, RowStack) and vectors.dtype == np.float32:
        return vectors
    return np.ascontiguousarray(vectors, dtype=np.float32)


def _kth_smallest(values: np.ndarray, k: int) -> float:
    """The ``k``-th smallest of ``values`` (the largest when there are fewer)."""
    if len(values) <= k:
        return float(values.max(initial=-np.inf))
    return float(np.partition(values, k - 1)[k - 1])


def _wants_codes(scan: Scan, vectors: int) -> bool:
    """Whether to search codes: asked for, or ``auto`` at :data:`SCAN_INT8_MIN_VECTORS` vectors with faiss installed."""
    if scan in ("int8", "pq"):
        return vectors > 0
    return scan == "auto" and vectors >= SCAN_INT8_MIN_VECTORS and has_faiss()


def _build_hnsw(embeddings: np.ndarray | RowStack):
    """A faiss HNSW index over inner products of ``embeddings``."""
    faiss = faiss_module("retrieval.approximate")
    index = faiss.IndexHNSWFlat(embeddings.shape[1], HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = HNSW_EF_SEARCH
    index.add(np.ascontiguousarray(embeddings))
    return index
