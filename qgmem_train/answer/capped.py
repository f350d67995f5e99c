"""Schema-capped answers, shared by the text path and the graph path: each answer string is capped so that the whole
JSON closes within the token budget, and a string that reached its cap ends at a word boundary, marked as cut."""

from __future__ import annotations

import string
from typing import Any

from qgmem_train.llm.schemas import AnswerOutput
from qgmem_train.llm.structured import strict_json_schema

JSON_OVERHEAD_TOKENS = 24
"""Tokens a schema-valid answer spends outside its two strings (braces, keys, quotes), with room to spare."""
CUT_MARK = "…"
"""Ends an answer string that reached its cap, so that a reader sees it was cut."""
_TRAILING = string.whitespace + ",;:([{-"
"""Left at the end of a cut string by the word it dropped; removed before the mark."""


def answer_char_limit(max_new_tokens: int) -> int:
    """Characters each answer string may hold so that the whole answer closes within ``max_new_tokens``.

    Every token of a JSON string holds at least one character, so two strings of at most
    ``(max_new_tokens - JSON_OVERHEAD_TOKENS) // 2`` characters always close within the budget.
    """
    return max(1, (max_new_tokens - JSON_OVERHEAD_TOKENS) // 2)


def capped_answer_schema(max_new_tokens: int) -> dict[str, Any]:
    """The answer JSON schema with each string capped at :func:`answer_char_limit`: a constrained answer never ends cut off."""
    schema = strict_json_schema(AnswerOutput)
    limit = answer_char_limit(max_new_tokens)
    for field in schema["properties"].values():
        field["maxLength"] = limit
    return schema


def end_at_word(text: str, limit: int) -> str:
    """``text`` when shorter than ``limit``; else cut at its last word boundary and ended with :data:`CUT_MARK`.

    A string that reached the cap was cut by the constraint (or would overflow it): the partial last word is
    dropped, so the result holds at most ``limit`` characters. A single word longer than that is cut inside.
    """
    if len(text) < limit:
        return text
    head = text[: max(0, limit - len(CUT_MARK))]
    if not text[len(head)].isspace():
        boundary = max(head.rfind(c) for c in string.whitespace)
        head = head[:boundary] if boundary > 0 else head
    return head.rstrip(_TRAILING) + CUT_MARK


def end_cut_strings(record: AnswerOutput, max_new_tokens: int) -> AnswerOutput:
    """``record`` with each string that reached the cap of ``max_new_tokens`` ended at a word boundary, marked."""
    limit = answer_char_limit(max_new_tokens)
    return record.model_copy(update={name: end_at_word(value, limit) for name, value in record if isinstance(value, str)})
