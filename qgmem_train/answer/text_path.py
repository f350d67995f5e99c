"""The text path: a frozen LLM answers the final-answer chat with the local graph written as facts (paper III-D1)."""

from __future__ import annotations

from collections.abc import Sequence

from qgmem_train.answer.capped import capped_answer_schema, end_cut_strings
from qgmem_train.answer.evidence import AnswerEvidence
from qgmem_train.answer.prompt import final_answer_chat
from qgmem_train.llm.base import Chat, ChatLLM
from qgmem_train.llm.schemas import AnswerOutput
from qgmem_train.llm.structured import ParseStats, generate_structured


def frozen_answer_chat(question: str, question_time: str | None, evidence: AnswerEvidence) -> Chat:
    """The chat every frozen LLM answers (ask, eval answers, the predictor without an exported model, data prep)."""
    return final_answer_chat(question, question_time, evidence.context.text, evidence.graph, text_path=True)


def answer_chats(llm: ChatLLM, chats: Sequence[Chat], *, max_new_tokens: int | None = None, stats: ParseStats | None = None) -> list[AnswerOutput | None]:
    """{reasoning_path, answer} of each final-answer chat, schema-checked; None where the output was dropped.

    Decoded under the graph path's string cap (:mod:`qgmem_train.answer.capped`), so that an answer closes within
    the budget (``max_new_tokens``, default the LLM's); a string that reached the cap ends at a word boundary, marked.
    """
    budget = max_new_tokens or llm.max_new_tokens
    records = generate_structured(llm, chats, AnswerOutput, max_new_tokens=budget, stats=stats, json_schema=capped_answer_schema(budget))
    return [end_cut_strings(record, budget) if record is not None else None for record in records]


def chat_tokens(llm: ChatLLM, chat: Chat) -> int:
    """Tokens of a chat's messages as ``llm`` counts them: what one online call reads."""
    return sum(llm.count_tokens(message["content"]) for message in chat if message.get("content"))
