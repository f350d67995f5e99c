"""Dense channel: cosine similarity between the query and the units' normalised fact embeddings.

A unit whose fact has several sentences also has one vector per sentence; its score is the best
cosine over all its vectors. Exact search is one matrix-vector product and a partial sort. For
millions of units, ``approximate`` builds a faiss HNSW graph over inner products instead (faiss-cpu
is the optional ``ann`` extra).
"""

from __future__ import annotations

import numpy as np

from qgmem_train.errors import ModelUnavailableError
from qgmem_train.retrieval.ranking import top_n

HNSW_NEIGHBOURS = 32
"""Graph degree M of the HNSW index (faiss default range 16-64)."""
HNSW_EF_SEARCH = 256
"""Candidate list size at search time; comfortably above n=100 for high recall."""


class DenseIndex:
    """Nearest units by inner product of L2-normalised embeddings (= cosine), best over a unit's vectors.

    ``sentence_embeddings`` are extra vectors of some units, grouped by unit; ``sentence_unit`` gives
    the unit row of each (non-decreasing).
    """

    def __init__(
        self,
        embeddings: np.ndarray,
        sentence_embeddings: np.ndarray | None = None,
        sentence_unit: np.ndarray | None = None,
        *,
        approximate: bool = False,
    ):
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        has_sentences = sentence_embeddings is not None and len(sentence_embeddings) > 0
        self.sentences = np.ascontiguousarray(sentence_embeddings, dtype=np.float32) if has_sentences else None
        owners = np.asarray(sentence_unit, np.int64) if has_sentences else np.zeros(0, np.int64)
        self._group_start = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]]) if has_sentences else owners
        self._group_unit = owners[self._group_start]
        self._hnsw = self._vector_unit = None
        if approximate and len(self.embeddings):
            self._hnsw = _build_hnsw(self.embeddings if self.sentences is None else np.concatenate([self.embeddings, self.sentences]))
            # Unit row of each vector in the HNSW index: the facts, then the sentences.
            self._vector_unit = np.concatenate([np.arange(len(self.embeddings), dtype=np.int64), owners])

    @property
    def approximate(self) -> bool:
        """Whether searches go through the HNSW graph."""
        return self._hnsw is not None

    def similarities(self, query: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Exact best cosine of the query with every unit, or with the units at ``rows``."""
        query = np.asarray(query, dtype=np.float32)
        if rows is not None and self.sentences is None:
            return self.embeddings[rows] @ query
        scores = self.embeddings @ query
        if self.sentences is not None:
            best = np.maximum.reduceat(self.sentences @ query, self._group_start)
            scores[self._group_unit] = np.maximum(scores[self._group_unit], best)
        return scores if rows is None else scores[rows]

    def search(self, query: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and cosines of the ``n`` nearest units, best first."""
        if self._hnsw is None:
            return top_n(self.similarities(query), n)
        n = min(n, len(self.embeddings))
        vectors = self._hnsw.ntotal
        wanted = n if self.sentences is None else min(vectors, 2 * n)
        scores, hits = self._hnsw.search(np.asarray(query, dtype=np.float32)[None, :], wanted)
        keep = hits[0] >= 0
        units = self._vector_unit[hits[0][keep]]
        first = np.sort(np.unique(units, return_index=True)[1])[:n]
        return units[first], scores[0][keep][first]


def _build_hnsw(embeddings: np.ndarray):
    """A faiss HNSW index over inner products of ``embeddings``."""
    try:
        import faiss
    except ImportError:
        raise ModelUnavailableError("retrieval.approximate needs faiss-cpu (pip install 'qgmem[ann]')") from None
    index = faiss.IndexHNSWFlat(embeddings.shape[1], HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = HNSW_EF_SEARCH
    index.add(embeddings)
    return index
