"""The final answer as generated text: strict JSON against :class:`AnswerOutput`."""

from __future__ import annotations

from pydantic import ValidationError

from qgmem_train.answer.capped import end_cut_strings
from qgmem_train.llm.schemas import AnswerOutput


def parse_answer(text: str, max_new_tokens: int | None = None) -> AnswerOutput | None:
    """The generated JSON as :class:`AnswerOutput`, or ``None`` when it is not exactly such a JSON object.

    With ``max_new_tokens`` (the budget it was generated under), a string that reached its cap ends at a word
    boundary, marked as cut (:func:`qgmem_train.answer.capped.end_cut_strings`).
    """
    try:
        record = AnswerOutput.model_validate_json(text.strip())
    except ValidationError:
        return None
    return end_cut_strings(record, max_new_tokens) if max_new_tokens is not None else record
