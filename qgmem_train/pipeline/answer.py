"""Answer searched questions on the text path: the frozen LLM reads each final-answer chat, schema-checked.

The predictor without an exported model (``ask``, ``serve``), ``eval`` and data prep answer here; the graph-token
path (an exported module's ``generate``) stays with the predictor.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qgmem_train.pipeline.search import Retrieval

if TYPE_CHECKING:
    from qgmem_train.llm.base import Chat, ChatLLM
    from qgmem_train.llm.schemas import AnswerOutput
    from qgmem_train.llm.structured import ParseStats


@dataclass
class TextAnswer:
    """One question's final-answer chat, the parsed answer (``None`` when dropped), its raw output and token counts."""

    chat: Chat
    parsed: AnswerOutput | None
    generated: str
    prompt_tokens: int
    generated_tokens: int


def answer_text_path(
    llm: ChatLLM, found: Sequence[Retrieval], *, max_new_tokens: int, batch_size: int | None = None, stats: ParseStats | None = None
) -> list[TextAnswer]:
    """Answer every retrieval with ``llm``, ``batch_size`` chats a call (default: all in one call).

    Each retrieval's ``seconds["generate"]`` becomes its share of the call that answered it.
    """
    from qgmem_train.answer.text_path import answer_chats, chat_tokens, frozen_answer_chat

    chats = [frozen_answer_chat(item.question, item.question_time, item.evidence) for item in found]
    size = max(1, batch_size or len(chats) or 1)
    answers: list[TextAnswer] = []
    for start in range(0, len(chats), size):
        batch = chats[start : start + size]
        began = time.perf_counter()
        parsed = answer_chats(llm, batch, max_new_tokens=max_new_tokens, stats=stats)
        share = (time.perf_counter() - began) / len(batch)
        for item, chat, output in zip(found[start : start + size], batch, parsed):
            item.seconds["generate"] = share
            generated = output.model_dump_json() if output is not None else ""
            answers.append(TextAnswer(chat, output, generated, chat_tokens(llm, chat), llm.count_tokens(generated) if generated else 0))
    return answers
