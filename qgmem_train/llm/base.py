"""The one small interface every LLM backend implements.

Stages depend on this interface only, so a local transformers model, an OpenAI-compatible server and
a scripted stand-in in unit tests are interchangeable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from qgmem_train.config import TEMPLATE_BUDGET_S

Message = dict[str, str]
Chat = list[Message]


def render_chat(tokenizer: Any, chat: Chat, budget_s: float = TEMPLATE_BUDGET_S) -> str:
    """``chat`` in the model's own chat template, ready for the assistant turn (Qwen3: thinking off).

    The template runs in transformers' Jinja sandbox within ``budget_s`` seconds (:func:`~qgmem_train.time_budget.run_within`);
    one the sandbox refuses, that fails or that runs past its budget (stopped) is the model's fault, reported as one
    :class:`~qgmem_train.errors.InputError` naming the model's ``chat_template``.
    """
    from jinja2 import TemplateError

    from qgmem_train.errors import InputError, first_line
    from qgmem_train.time_budget import OutOfTime, run_within

    require_chat_template(tokenizer, getattr(tokenizer, "name_or_path", "model"))
    where = f"{getattr(tokenizer, 'name_or_path', 'model')}: chat_template"
    try:
        return run_within(lambda: tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, enable_thinking=False), budget_s)
    except TemplateError as exc:
        raise InputError(where, f"the sandbox refuses to render it: {first_line(exc)}") from None
    except OutOfTime:
        raise InputError(where, f"rendering takes more than its {budget_s:g} s budget (models.template_budget_s); stopped") from None


def require_chat_template(tokenizer: Any, ref: str) -> None:
    """Refuse, in one line, a model whose tokenizer has no chat template (a GGUF without ``tokenizer.chat_template``, such
    as the registry's Gemma-3-270M), naming the file that supplies one, instead of transformers' ``ValueError``."""
    from qgmem_train.errors import ModelUnavailableError
    from qgmem_train.llm.resolver import CHAT_TEMPLATE_FILE

    if not getattr(tokenizer, "chat_template", None):
        raise ModelUnavailableError(
            f"model {ref!r} has no chat template (no tokenizer.chat_template in its GGUF, no {CHAT_TEMPLATE_FILE} in its folder): "
            f"put the model's Jinja chat template in {CHAT_TEMPLATE_FILE} beside its GGUF file or in its folder, or name an instruction-tuned model"
        )


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
