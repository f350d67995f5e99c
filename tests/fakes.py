"""A scripted stand-in LLM for unit tests of parsing and error paths (never the only test of a stage)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from qgmem_train.llm.base import Chat, ChatLLM


class ScriptedLLM(ChatLLM):
    """Replies from a list (consumed in order) or a function of the chat; records every chat and each call's batch size."""

    model_id = "scripted"

    def __init__(self, replies: Sequence[str] | Callable[[Chat], str], yes_scores: Callable[[Chat], float] | None = None):
        self._replies = list(replies) if not callable(replies) else replies
        self._yes = yes_scores or (lambda chat: 0.5)
        self.calls: list[Chat] = []
        self.batches: list[int] = []

    def generate(self, chats: Sequence[Chat], *, max_new_tokens: int | None = None, json_schema: dict[str, Any] | None = None) -> list[str]:
        out = []
        self.batches.append(len(chats))
        for chat in chats:
            self.calls.append(chat)
            out.append(self._replies(chat) if callable(self._replies) else self._replies.pop(0))
        return out

    def score_yes_no(self, chats: Sequence[Chat]) -> list[float]:
        return [self._yes(c) for c in chats]

    def count_tokens(self, text: str) -> int:
        return len(text.split())
