"""The final answer as generated text: strict JSON against :class:`AnswerOutput`."""

from __future__ import annotations

from pydantic import ValidationError

from qgmem_train.llm.schemas import AnswerOutput


def parse_answer(text: str) -> AnswerOutput | None:
    """The generated JSON as :class:`AnswerOutput`, or ``None`` when it is not exactly such a JSON object."""
    try:
        return AnswerOutput.model_validate_json(text.strip())
    except ValidationError:
        return None
