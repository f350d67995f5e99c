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
    """rank_bm25's BM25Okapi idf: log((N - df + .5) / (df + .5)), negative values floored at epsilon × mean idf (the mean
    taken in sorted order, so that it does not depend on how the terms are numbered)."""
    idf = np.log(n_docs - doc_freq + 0.5) - np.log(doc_freq + 0.5)
    if idf.size:
        idf = np.where(idf < 0, epsilon * np.sort(idf).mean(), idf)
    return idf


class BM25Index:
    """A BM25Okapi index (k1, b, epsilon as in rank_bm25) over the (term, document) pairs of a corpus.

    ``terms[i]`` (an id into ``vocab``) occurs once in document ``docs[i]``; repeats count as repeats. Terms of
    ``vocab`` that occur nowhere are left out, so scores depend only on the documents' terms, as rank_bm25's do.
    :meth:`appended` adds documents: the statistics every score reads (idf, mean length) change, so the scores are made
    again from the kept term frequencies, and equal those of an index built over all the documents at once.
    """

    def __init__(self, vocab: Sequence[str], terms: np.ndarray, docs: np.ndarray, n_docs: int, *, k1: float = 1.5, b: float = 0.75,
                 epsilon: float = 0.25):  # fmt: skip
        self.n_docs = n_docs
        self.params = (k1, b, epsilon)
        self.vocab: dict[str, int] = {}
        self._lengths = np.zeros(n_docs, np.int64)
        self._finish(*self._postings(vocab, terms, docs, 0), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))

    def _postings(self, vocab: Sequence[str], terms: np.ndarray, docs: np.ndarray, first_doc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(term, document, term frequency) of each distinct pair of ``terms`` (ids into ``vocab``, numbered into
        :attr:`vocab` here) and ``docs`` (from ``first_doc`` on, counted into the document lengths), by term then document."""
        terms, docs = np.asarray(terms, np.int64), np.asarray(docs, np.int64)
        used = np.flatnonzero(np.bincount(terms, minlength=len(vocab)))  # a pass, not a sort: few terms go unused
        renumber = np.zeros(len(vocab), np.int64)
        renumber[used] = np.fromiter((self.vocab.setdefault(vocab[i], len(self.vocab)) for i in used.tolist()), np.int64, len(used))
        terms = renumber[terms]
        self._lengths[first_doc:] += np.bincount(docs - first_doc, minlength=self.n_docs - first_doc)
        if terms.size == 0:
            return terms, docs, terms
        pairs, term_freq = np.unique(terms * self.n_docs + docs, return_counts=True)  # sorted by term, then document
        term, doc = np.divmod(pairs, self.n_docs)
        return term, doc, term_freq

    def _finish(self, term: np.ndarray, doc: np.ndarray, term_freq: np.ndarray, old_term: np.ndarray, old_doc: np.ndarray,
                old_freq: np.ndarray) -> None:  # fmt: skip
        """The score columns of the pairs kept (``old_*``, by term then document) and those of later documents, merged."""
        if len(old_term) and len(term):
            order = np.argsort(np.concatenate([old_term, term]), kind="stable")  # a term's later documents after its earlier ones
            term, doc, term_freq = (np.concatenate(pair)[order] for pair in ((old_term, term), (old_doc, doc), (old_freq, term_freq)))
        elif len(old_term):
            term, doc, term_freq = old_term, old_doc, old_freq
        self._term, self._freq = term.astype(np.int32), term_freq.astype(np.int32)
        self._indices = doc.astype(np.int32)
        doc_freq = np.bincount(term, minlength=len(self.vocab))
        self._indptr = np.concatenate([[0], np.cumsum(doc_freq)]).astype(np.int64)
        if term.size == 0:
            self._data = np.zeros(0, np.float32)
            return
        k1, b, epsilon = self.params
        term_freq = term_freq.astype(np.int64)
        idf = okapi_idf(doc_freq.astype(np.float64), self.n_docs, epsilon)
        length_norm = k1 * (1.0 - b + b * self._lengths / self._lengths.mean())
        self._data = (idf[term] * term_freq * (k1 + 1.0) / (term_freq + length_norm[doc])).astype(np.float32)

    def appended(self, vocab: Sequence[str], terms: np.ndarray, docs: np.ndarray, n_docs: int) -> BM25Index:
        """This index with documents ``self.n_docs`` to ``n_docs - 1`` added (their pairs as in the constructor); this
        index is left as it is, for the searches still reading it."""
        grown = object.__new__(BM25Index)
        grown.n_docs, grown.params, grown.vocab = n_docs, self.params, dict(self.vocab)
        grown._lengths = np.concatenate([self._lengths, np.zeros(n_docs - self.n_docs, np.int64)])
        new = grown._postings(vocab, terms, docs, self.n_docs)
        grown._finish(*new, self._term.astype(np.int64), self._indices.astype(np.int64), self._freq.astype(np.int64))
        return grown

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
