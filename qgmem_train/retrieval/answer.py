"""Answering from the serialized working memory with the paper's FINAL_ANSWER prompt (text path)."""

from __future__ import annotations

from collections.abc import Sequence

from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.prompts import FINAL_ANSWER
from qgmem_train.llm.schemas import AnswerOutput
from qgmem_train.llm.structured import ParseStats, generate_structured
from qgmem_train.retrieval.serialization import SerializedMemory


def answer_questions(
    llm: ChatLLM,
    questions: Sequence[tuple[str, str | None, SerializedMemory]],
    *,
    max_new_tokens: int | None = None,
    stats: ParseStats | None = None,
) -> list[AnswerOutput | None]:
    """{reasoning_path, answer} for each (question, question time, MEMORY_CONTEXT); None where the output was dropped."""
    chats = [
        FINAL_ANSWER.render(query=question, question_time=question_time or "unknown", serialized_graph=context.text)
        for question, question_time, context in questions
    ]
    return generate_structured(llm, chats, AnswerOutput, max_new_tokens=max_new_tokens, stats=stats)
