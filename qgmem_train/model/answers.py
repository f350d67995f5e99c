"""Scoring generated final answers: strict JSON validity against AnswerOutput and normalised exact match."""

from __future__ import annotations

import re
import string

from pydantic import ValidationError

from qgmem_train.llm.schemas import AnswerOutput

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def parse_answer(text: str) -> AnswerOutput | None:
    """The generated JSON as :class:`AnswerOutput`, or ``None`` when it is not exactly such a JSON object."""
    try:
        return AnswerOutput.model_validate_json(text.strip())
    except ValidationError:
        return None


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the SQuAD normalisation)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, reference: str) -> bool:
    """Whether two answers are equal after :func:`normalize_answer`."""
    return normalize_answer(prediction) == normalize_answer(reference)
