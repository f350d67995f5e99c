"""Search terms of units and turns, tokenized once when written and kept with the store's segments.

BM25 indexes each unit's :func:`lexical_text` and the :func:`turn_line` of the turns before it. A
:class:`TermLists` holds the terms of N rows as integer ids into a vocabulary of its own, so a loaded
namespace builds its index from integer arrays instead of tokenizing every text again (which took most of
the index's build time at 100k units). Stored terms carry :data:`~qgmem_train.text.TERMS_VERSION`; terms
of another version are not read, and are made anew from the texts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qgmem_train.memory.columns import TextColumn, ranges
from qgmem_train.text import TERMS_VERSION, tokenize

_PREFIX = "terms"
"""Name of the arrays a :class:`TermLists` packs into a segment's columns (``terms.ids``, ``terms.vocab.data``, ...)."""


def lexical_text(fact_text: str, source_text: str) -> str:
    """What BM25 indexes of a unit itself: its fact, and its source dialogue when that differs."""
    parts = [fact_text]
    if source_text.strip() and source_text.strip() != fact_text.strip():
        parts.append(source_text)
    return " ".join(parts)


def turn_line(speaker: str, text: str) -> str:
    """A turn as BM25 indexes it in the context of the units after it."""
    return f"{speaker}: {text}"


def unit_term_lists(fact_and_source: Iterable[tuple[str, str]]) -> TermLists:
    """The BM25 terms of units given as (fact text, source text) pairs: those of each one's :func:`lexical_text`."""
    return TermLists.from_texts(lexical_text(fact, source) for fact, source in fact_and_source)


def turn_term_lists(speaker_and_text: Iterable[tuple[str, str]]) -> TermLists:
    """The BM25 terms of turns given as (speaker, text) pairs: those of each one's :func:`turn_line`."""
    return TermLists.from_texts(turn_line(speaker, text) for speaker, text in speaker_and_text)


@dataclass
class TermLists:
    """The terms of N rows: row i's are ``vocab[ids[ends[i - 1]:ends[i]]]``, in the order the tokenizer gave them."""

    ends: np.ndarray
    ids: np.ndarray
    vocab: TextColumn

    def __len__(self) -> int:
        return len(self.ends)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> TermLists:
        """The terms of each text (:func:`~qgmem_train.text.tokenize`), each distinct term once in the vocabulary."""
        vocab: dict[str, int] = {}
        ids: list[int] = []
        ends: list[int] = []
        for text in texts:
            ids.extend(vocab.setdefault(term, len(vocab)) for term in tokenize(text))
            ends.append(len(ids))
        return cls(np.asarray(ends, np.int64), np.asarray(ids, np.int32), TextColumn.from_strings(vocab))

    @property
    def starts(self) -> np.ndarray:
        """Offset in ``ids`` of each row's first term."""
        return np.concatenate([np.zeros(1, np.int64), self.ends[:-1]])

    @property
    def lengths(self) -> np.ndarray:
        """Number of terms of each row."""
        return np.diff(self.ends, prepend=np.int64(0))

    def take(self, rows: np.ndarray) -> TermLists:
        """The rows ``rows``, in that order (the vocabulary is kept whole)."""
        rows = np.asarray(rows, np.int64)
        lengths = self.lengths[rows]
        return TermLists(np.cumsum(lengths, dtype=np.int64), self.ids[ranges(self.starts[rows], lengths)], self.vocab)

    def without_unused_terms(self) -> TermLists:
        """The lists over a vocabulary of the terms they use (rows taken out of a table leave theirs behind)."""
        used, ids = np.unique(self.ids, return_inverse=True)
        if len(used) == len(self.vocab):
            return self
        return TermLists(self.ends, ids.astype(np.int32).reshape(-1), self.vocab.take(used))

    @staticmethod
    def concat(lists: Sequence[TermLists]) -> TermLists:
        """The rows of ``lists`` one after the other, over one vocabulary (each distinct term once): the first list's,
        kept as it is, then the terms the others add (a large list grown by a small one is not encoded again)."""
        first = lists[0] if lists else None
        vocab: dict[str, int] = dict(zip(first.vocab.tolist(), range(len(first.vocab)))) if first else {}  # type: ignore[arg-type]
        kept = first is not None and len(vocab) == len(first.vocab)  # else a term repeats in it: all are numbered afresh
        ids, ends, shift = ([np.asarray(first.ids, np.int32)], [first.ends], len(first.ids)) if kept else ([], [], 0)  # type: ignore[union-attr]
        if not kept:
            vocab = {}
        for terms in lists[1:] if kept else lists:
            words = terms.vocab.tolist()
            remap = np.fromiter((vocab.setdefault(w, len(vocab)) for w in words), np.int32, len(words))  # type: ignore[arg-type]
            ids.append(remap[terms.ids])
            ends.append(terms.ends + shift)
            shift += len(terms.ids)
        words = TextColumn.concat([first.vocab, TextColumn.from_strings(list(vocab)[len(first.vocab):])]) if kept else TextColumn.from_strings(vocab)  # type: ignore[union-attr]
        return TermLists(np.concatenate([np.zeros(0, np.int64), *ends]), np.concatenate([np.zeros(0, np.int32), *ids]), words)

    def arrays(self) -> dict[str, np.ndarray]:
        """The lists as named arrays for :func:`~qgmem_train.memory.columns.pack_arrays`, with the tokenizer's version."""
        return {
            f"{_PREFIX}.version": np.frombuffer(TERMS_VERSION.encode("utf-8"), np.uint8),
            f"{_PREFIX}.ends": self.ends,
            f"{_PREFIX}.ids": self.ids,
            **self.vocab.arrays(f"{_PREFIX}.vocab"),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> TermLists | None:
        """The lists stored by :meth:`arrays`; None when there are none, or they were made by another tokenizer version."""
        version = arrays.get(f"{_PREFIX}.version")
        if version is None or version.tobytes().decode("utf-8") != TERMS_VERSION:
            return None
        return cls(arrays[f"{_PREFIX}.ends"], arrays[f"{_PREFIX}.ids"], TextColumn.from_arrays(arrays, f"{_PREFIX}.vocab"))
