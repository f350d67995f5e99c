"""The one small interface every LLM backend implements.

Stages depend on this interface only, so a local transformers model, an OpenAI-compatible server and
a scripted stand-in in unit tests are interchangeable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

Message = dict[str, str]
Chat = list[Message]


def render_chat(tokenizer: Any, chat: Chat) -> str:
    """``chat`` in the model's own chat template, ready for the assistant turn (Qwen3: thinking off).

    The template runs in transformers' Jinja sandbox; one it refuses (or that fails) is the model's fault,
    reported as one :class:`~qgmem_train.errors.InputError` naming the model's ``chat_template``.
    """
    from jinja2 import TemplateError

    from qgmem_train.errors import InputError, first_line

    try:
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    except TemplateError as exc:
        why = first_line(exc)
        raise InputError(f"{getattr(tokenizer, 'name_or_path', 'model')}: chat_template", f"the sandbox refuses to render it: {why}") from None


class ChatLLM(ABC):
    """Chat in, text out; batched; yes/no relevance scoring; token counting."""

    model_id: str = ""
    revision: str | None = None
    max_new_tokens: int = 512
    """Generation budget of a call that names none."""

    @abstractmethod
    def generate(
        self,
        chats: Sequence[Chat],
        *,
        max_new_tokens: int | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> list[str]:
        """Greedy completions for a batch of chats; ``json_schema`` constrains output where supported."""

    def chat(self, messages: Chat, **kwargs: Any) -> str:
        """Completion of one chat."""
        return self.generate([messages], **kwargs)[0]

    @abstractmethod
    def score_yes_no(self, chats: Sequence[Chat]) -> list[float]:
        """p(yes) / (p(yes) + p(no)) for the next token of each chat (Qwen3-Reranker formulation)."""

    @abstractmethod
    def count_tokens(self, text: str) -> int:
        """Number of tokens of ``text`` under this model's tokenizer."""

    @property
    def supports_schema(self) -> bool:
        """Whether ``json_schema`` is enforced during decoding (else output goes through the repair parser)."""
        return False
