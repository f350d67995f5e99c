"""Lexical channel: BM25 over memory units, with rank_bm25's BM25Okapi scores.

Text in any language is tokenised (:func:`~qgmem_train.text.tokenize`); scores then depend only on the tokens.

The index precomputes one sparse column of per-document scores for each vocabulary term (as bm25s does); a query
sums the columns of its terms. The columns are built with numpy from the (term, document) pairs, 6x faster than
bm25s's build from token lists (which took 11 of the 35 s a loaded 100k-unit namespace spent on its index); a loaded
namespace passes the pairs of the terms its store kept (:mod:`qgmem_train.memory.search_terms`), tokenizing nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np


def okapi_idf(doc_freq: np.ndarray, n_docs: int, epsilon: float = 0.25) -> np.ndarray:
    """rank_bm25's BM25Okapi idf: log((N - df + .5) / (df + .5)), negative values floored at epsilon × mean idf."""
    idf = np.log(n_docs - doc_freq + 0.5) - np.log(doc_freq + 0.5)
    if idf.size:
        idf = np.where(idf < 0, epsilon * idf.mean(), idf)
    return idf


class BM25Index:
    """A BM25Okapi index (k1, b, epsilon as in rank_bm25) over the (term, document) pairs of a corpus.

    ``terms[i]`` (an id into ``vocab``) occurs once in document ``docs[i]``; repeats count as repeats. Terms of
    ``vocab`` that occur nowhere are left out, so scores depend only on the documents' terms, as rank_bm25's do.
    """

    def __init__(self, vocab: Sequence[str], terms: np.ndarray, docs: np.ndarray, n_docs: int, *, k1: float = 1.5, b: float = 0.75,
                 epsilon: float = 0.25):  # fmt: skip
        self.n_docs = n_docs
        terms = np.asarray(terms, np.int64)
        used = np.flatnonzero(np.bincount(terms, minlength=len(vocab)))  # a pass, not a sort: few terms go unused
        self.vocab: dict[str, int] = {vocab[i]: k for k, i in enumerate(used.tolist())}
        if len(used) < len(vocab):
            renumber = np.zeros(len(vocab), np.int64)
            renumber[used] = np.arange(len(used))
            terms = renumber[terms]
        if terms.size == 0:
            self._data = np.zeros(0, np.float32)
            self._indices = np.zeros(0, np.int32)
            self._indptr = np.zeros(1, np.int64)
            return
        docs = np.asarray(docs, np.int64)
        lengths = np.bincount(docs, minlength=n_docs)
        pairs, term_freq = np.unique(terms * n_docs + docs, return_counts=True)  # sorted by term, then document
        term, doc = np.divmod(pairs, n_docs)
        doc_freq = np.bincount(term, minlength=len(used))
        idf = okapi_idf(doc_freq.astype(np.float64), n_docs, epsilon)
        length_norm = k1 * (1.0 - b + b * lengths / lengths.mean())
        self._data = (idf[term] * term_freq * (k1 + 1.0) / (term_freq + length_norm[doc])).astype(np.float32)
        self._indices = doc.astype(np.int32)
        self._indptr = np.concatenate([[0], np.cumsum(doc_freq)]).astype(np.int64)

    @classmethod
    def from_tokens(cls, corpus_tokens: Sequence[Sequence[str]], **params: float) -> BM25Index:
        """The index of tokenized documents (a list of terms each)."""
        vocab: dict[str, int] = {}
        flat = [vocab.setdefault(term, len(vocab)) for term in chain.from_iterable(corpus_tokens)]
        lengths = np.fromiter(map(len, corpus_tokens), np.int64, len(corpus_tokens))
        docs = np.repeat(np.arange(len(corpus_tokens), dtype=np.int64), lengths)
        return cls(list(vocab), np.asarray(flat, np.int64), docs, len(corpus_tokens), **params)

    def scores(self, query_tokens: Sequence[str]) -> np.ndarray:
        """BM25Okapi score of every document; repeated query terms count once per repetition."""
        ids = [self.vocab[t] for t in query_tokens if t in self.vocab]
        if not ids:
            return np.zeros(self.n_docs, np.float32)
        starts, ends = self._indptr[ids], self._indptr[np.asarray(ids) + 1]
        rows = np.concatenate([self._indices[s:e] for s, e in zip(starts, ends)])
        weights = np.concatenate([self._data[s:e] for s, e in zip(starts, ends)])
        return np.bincount(rows, weights=weights, minlength=self.n_docs).astype(np.float32)
