"""Answer metrics: exact match, token F1 and BLEU-1 of an answer against its reference, over normalised tokens.

The deterministic metrics LoCoMo and Mem0 report beside the judge; training's validation and ``eval answers`` both
score with them (parsing the answer JSON: :mod:`qgmem_train.answer.parsing`).

One normalisation (:func:`normalize_answer`) serves all three. It is LoCoMo's minus two details of its
script: LoCoMo also drops the word "and" and Porter-stems each token before F1; we keep SQuAD's article
set and plain tokens (no nltk dependency), so scores can differ slightly from LoCoMo's on the same answers.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the SQuAD normalisation)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, reference: str) -> bool:
    """Whether two answers are equal after :func:`normalize_answer`."""
    return normalize_answer(prediction) == normalize_answer(reference)


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split()


def token_f1(prediction: str, reference: str) -> float:
    """Token F1 over normalised tokens, the shared tokens counted as a multiset (LoCoMo, SQuAD).

    Both empty after normalisation: 1.0 (they agree, as :func:`exact_match` says); one empty: 0.0.
    """
    pred, ref = _tokens(prediction), _tokens(reference)
    if not pred or not ref:
        return float(pred == ref)
    shared = sum((Counter(pred) & Counter(ref)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(pred), shared / len(ref)
    return 2 * precision * recall / (precision + recall)


def bleu1(prediction: str, reference: str) -> float:
    """BLEU-1 over normalised tokens: clipped unigram precision times the brevity penalty.

    The value of nltk's ``sentence_bleu([ref], pred, weights=(1, 0, 0, 0))`` (Mem0's BLEU-1): the brevity
    penalty is 1 when the prediction is longer than the reference, else exp(1 - len(ref) / len(pred)).
    Both empty after normalisation: 1.0 (nltk gives 0; we follow exact match); one empty: 0.0.
    """
    pred, ref = _tokens(prediction), _tokens(reference)
    if not pred or not ref:
        return float(pred == ref)
    clipped = sum((Counter(pred) & Counter(ref)).values())
    brevity = 1.0 if len(pred) > len(ref) else math.exp(1 - len(ref) / len(pred))
    return brevity * clipped / len(pred)


def answer_scores(prediction: str, reference: str) -> dict[str, float]:
    """``{"f1", "bleu1", "exact_match"}`` of one answer against its reference, each a float in [0, 1]."""
    return {"f1": token_f1(prediction, reference), "bleu1": bleu1(prediction, reference), "exact_match": float(exact_match(prediction, reference))}
