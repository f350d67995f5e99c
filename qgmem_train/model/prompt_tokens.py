"""Token ids of an example's prompt and target, as the module builds them: computed once per example, in the loader.

The module owns what shapes them (its tokenizer, the context cut, the text path) in a :class:`PromptTokens`; the data
module's collate calls the same object, so batches carry the ids from the loader's worker processes and the training
process does not tokenise every example again in every step and validation (about 44 ms a batch of 4 at
1,000-token contexts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qgmem_train.answer.prompt import final_answer_chat
from qgmem_train.config import TEMPLATE_BUDGET_S
from qgmem_train.model.answer_target import answer_token_mask
from qgmem_train.model.fusion import PromptIds, chat_prompt_ids, target_ids, truncate_to_tokens
from qgmem_train.trajectory import TrajectoryExample


@dataclass(frozen=True)
class PromptTokens:
    """The FINAL_ANSWER prompt ids (with the graph slot) and target ids of examples, under one tokenizer and context cut."""

    tokenizer: Any
    max_context_tokens: int | None
    text_path: bool
    template_budget_s: float = TEMPLATE_BUDGET_S
    """Seconds the chat template may take to render one prompt (``models.template_budget_s`` where a predictor runs it)."""

    def prompt(self, example: TrajectoryExample) -> PromptIds:
        """Chat-templated prompt ids of one example (context cut to ``max_context_tokens``) and its graph slot."""
        context = truncate_to_tokens(self.tokenizer, example.context, self.max_context_tokens)
        chat = final_answer_chat(example.question, example.question_time, context, example.graph, text_path=self.text_path)
        return chat_prompt_ids(self.tokenizer, chat, self.template_budget_s)

    def target(self, example: TrajectoryExample) -> list[int]:
        """Ids of the example's target JSON and the end-of-turn token."""
        return target_ids(self.tokenizer, example.target_json())

    def batch(self, examples: list[TrajectoryExample]) -> dict[str, list[Any]]:
        """What a collated batch carries: ``prompts`` (:class:`PromptIds`), ``targets`` and ``answer_masks`` (which target
        tokens are the answer's, :func:`~qgmem_train.model.answer_target.answer_token_mask`), one each per example."""
        return {
            "prompts": [self.prompt(ex) for ex in examples],
            "targets": [self.target(ex) for ex in examples],
            "answer_masks": [answer_token_mask(self.tokenizer, ex) for ex in examples],
        }
