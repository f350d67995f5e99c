"""Lexical channel: BM25 over memory units, with rank_bm25's BM25Okapi scores at bm25s speed.

Text in any language is tokenised (:func:`~qgmem_train.text.tokenize`); scores then depend only on the tokens.

bm25s precomputes one sparse column of per-document scores for each vocabulary term; a query sums
the columns of its terms. Its "robertson" scores equal BM25Okapi's divided by (k1 + 1), and it floors
negative idf at 0 where BM25Okapi floors it at ``epsilon`` times the mean idf. We build bm25s's matrix
with an idf that is never zero (its "lucene" idf) and rescale each term's column to
``(k1 + 1) * idf_okapi / idf_lucene``, so every score equals BM25Okapi's on the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import bm25s
import numpy as np


def okapi_idf(doc_freq: np.ndarray, n_docs: int, epsilon: float = 0.25) -> np.ndarray:
    """rank_bm25's BM25Okapi idf: log((N - df + .5) / (df + .5)), negative values floored at epsilon × mean idf."""
    idf = np.log(n_docs - doc_freq + 0.5) - np.log(doc_freq + 0.5)
    if idf.size:
        idf = np.where(idf < 0, epsilon * idf.mean(), idf)
    return idf


class BM25Index:
    """A BM25Okapi index (k1, b, epsilon as in rank_bm25) over pre-tokenized documents."""

    def __init__(self, corpus_tokens: Sequence[Sequence[str]], *, k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25):
        self.n_docs = len(corpus_tokens)
        self.vocab: dict[str, int] = {}
        if self.n_docs == 0 or not any(corpus_tokens):
            self._data = np.zeros(0, np.float32)
            self._indices = np.zeros(0, np.int32)
            self._indptr = np.zeros(1, np.int64)
            return
        engine = bm25s.BM25(k1=k1, b=b, method="robertson", idf_method="lucene")
        engine.index([list(doc) for doc in corpus_tokens], create_empty_token=False, show_progress=False)
        self.vocab = engine.vocab_dict
        data, indices, indptr = engine.scores["data"], engine.scores["indices"], engine.scores["indptr"]
        doc_freq = np.diff(indptr).astype(np.float64)
        lucene = np.log(1.0 + (self.n_docs - doc_freq + 0.5) / (doc_freq + 0.5))
        factor = (k1 + 1.0) * okapi_idf(doc_freq, self.n_docs, epsilon) / lucene
        self._data = (data * np.repeat(factor, np.diff(indptr))).astype(np.float32)
        self._indices = indices
        self._indptr = indptr

    def scores(self, query_tokens: Sequence[str]) -> np.ndarray:
        """BM25Okapi score of every document; repeated query terms count once per repetition."""
        ids = [self.vocab[t] for t in query_tokens if t in self.vocab]
        if not ids:
            return np.zeros(self.n_docs, np.float32)
        starts, ends = self._indptr[ids], self._indptr[np.asarray(ids) + 1]
        rows = np.concatenate([self._indices[s:e] for s, e in zip(starts, ends)])
        weights = np.concatenate([self._data[s:e] for s, e in zip(starts, ends)])
        return np.bincount(rows, weights=weights, minlength=self.n_docs).astype(np.float32)
