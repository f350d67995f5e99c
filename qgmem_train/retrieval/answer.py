"""Answering from the serialized working memory with the paper's FINAL_ANSWER prompt (text path)."""

from __future__ import annotations

from collections.abc import Sequence

from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.schemas import AnswerOutput
from qgmem_train.llm.structured import ParseStats, generate_structured
from qgmem_train.model.prompt import final_answer_chat
from qgmem_train.retrieval.serialization import SerializedMemory


def answer_questions(
    llm: ChatLLM,
    questions: Sequence[tuple[str, str | None, SerializedMemory]],
    *,
    max_new_tokens: int | None = None,
    stats: ParseStats | None = None,
) -> list[AnswerOutput | None]:
    """{reasoning_path, answer} for each (question, question time, MEMORY_CONTEXT); None where the output was dropped.

    The chat is the one training and the predictor use (:func:`final_answer_chat`); MEMORY_CONTEXT already
    lists every unit's triple as a labelled fact, so no graph is appended.
    """
    chats = [
        final_answer_chat(question, question_time, context.text, LocalGraph(), text_path=False)
        for question, question_time, context in questions
    ]
    return generate_structured(llm, chats, AnswerOutput, max_new_tokens=max_new_tokens, stats=stats)
