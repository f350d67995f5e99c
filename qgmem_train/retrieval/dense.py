"""Dense channel: cosine similarity between the query and the units' normalised fact embeddings.

Exact search is one matrix-vector product and a partial sort. For millions of units, ``approximate``
builds a faiss HNSW graph over inner products instead (faiss-cpu is the optional ``ann`` extra).
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
    """Nearest units by inner product of L2-normalised embeddings (= cosine)."""

    def __init__(self, embeddings: np.ndarray, *, approximate: bool = False):
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        self._hnsw = _build_hnsw(self.embeddings) if approximate and len(self.embeddings) else None

    @property
    def approximate(self) -> bool:
        """Whether searches go through the HNSW graph."""
        return self._hnsw is not None

    def similarities(self, query: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Exact cosine of the query with every unit, or with the units at ``rows``."""
        matrix = self.embeddings if rows is None else self.embeddings[rows]
        return matrix @ np.asarray(query, dtype=np.float32)

    def search(self, query: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and cosines of the ``n`` nearest units, best first."""
        if self._hnsw is None:
            return top_n(self.similarities(query), n)
        n = min(n, len(self.embeddings))
        scores, rows = self._hnsw.search(np.asarray(query, dtype=np.float32)[None, :], n)
        keep = rows[0] >= 0
        return rows[0][keep].astype(np.int64), scores[0][keep]


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
