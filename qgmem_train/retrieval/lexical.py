"""Lexical channel: BM25 over memory units, with rank_bm25's BM25Okapi scores at bm25s speed.

Text in any language is tokenised (:func:`tokenize`); scores then depend only on the tokens.

bm25s precomputes one sparse column of per-document scores for each vocabulary term; a query sums
the columns of its terms. Its "robertson" scores equal BM25Okapi's divided by (k1 + 1), and it floors
negative idf at 0 where BM25Okapi floors it at ``epsilon`` times the mean idf. We build bm25s's matrix
with an idf that is never zero (its "lucene" idf) and rescale each term's column to
``(k1 + 1) * idf_okapi / idf_lucene``, so every score equals BM25Okapi's on the same tokens.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache

import bm25s
import numpy as np


STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most my
    myself no nor not now of off on once only or other our ours ourselves out over own same she should so
    some such than that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your yours
    yourself yourselves s t d ll m re ve""".split()
)
_CJK = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
"""Kana and Han (CJK ideographs): scripts written without spaces between words."""
_TOKEN = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")
"""A run of CJK characters, or a word of letters and digits in any other script."""
_VOWEL = re.compile(r"[aeiouy]")


@lru_cache(maxsize=200_000)
def light_stem(word: str) -> str:
    """A light suffix stripper (plural -s/-es/-ies, -ing, -ed, final -e) so inflections of a word meet."""
    if len(word) > 4 and word.endswith("ies") and not word.endswith(("eies", "aies")):
        word = word[:-3] + "y"
    elif word.endswith(("sses", "ches", "shes", "xes", "zes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) >= 3 and _VOWEL.search(stem):
            word = stem[:-1] if stem[-1] == stem[-2] and stem[-1] not in "lsz" else stem
            break
    if len(word) > 3 and word.endswith("e") and not word.endswith("ee"):
        word = word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """BM25 terms of ``text`` in any script: NFKC-normalised and casefolded words of letters and digits.

    Words of space-separated scripts ("Zürich", "Москва") are kept whole, English stopwords dropped and
    the rest lightly stemmed. Chinese and Japanese put no spaces between words, so a run of Han or Kana
    gives each character and each pair of adjacent characters: one-character words still match, and a
    two-character word ("北京", "東京") matches its own pair, so it outranks its characters met apart.
    """
    terms = []
    for cjk, word in _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold()):
        if cjk:
            terms += list(cjk) + [cjk[i : i + 2] for i in range(len(cjk) - 1)]
        elif word not in STOPWORDS:
            terms.append(light_stem(word))
    return terms


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
