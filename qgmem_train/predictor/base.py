"""What a memory handle needs of its predictor: the model, the frozen retrieval stack and the question bound.

:class:`Predictor` holds them; :class:`~qgmem_train.predictor.loading.QGMemPredictor` adds the ways to load
one, and :class:`~qgmem_train.predictor.memory.PredictorMemory` uses them, so neither module imports the other's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError

if TYPE_CHECKING:
    from qgmem_train.llm.base import ChatLLM
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.model.module import GraphAugmentedLM
    from qgmem_train.retrieval.rerank import Reranker

IntentMode = Literal["llm", "rules"]
MAX_QUESTION_CHARS = 4000
"""Default bound on a question's length: longer ones are refused before they reach the embedder or the prompt."""


class Predictor:
    """A QGMem model (or an API backbone) with its frozen retrieval stack, ready to build memory and answer."""

    def __init__(
        self,
        model: GraphAugmentedLM | None,
        pipeline: PipelineConfig,
        *,
        llm: ChatLLM,
        embedder: Embedder,
        reranker: Reranker | None,
        intent: IntentMode = "llm",
        max_question_chars: int = MAX_QUESTION_CHARS,
    ) -> None:
        """``model`` is ``None`` on the text path; ``max_question_chars`` bounds every question ``ask`` takes."""
        if intent not in ("llm", "rules"):
            raise InputError("intent", f"unknown intent parser {intent!r} (llm, rules)")
        if not isinstance(max_question_chars, int) or max_question_chars < 1:
            raise InputError("max_question_chars", f"is {max_question_chars!r}, expected a positive number of characters")
        self.model = model
        self.pipeline = pipeline
        self.llm = llm
        self.embedder = embedder
        self.reranker = reranker
        self.intent = intent
        self.max_question_chars = max_question_chars

    @property
    def path(self) -> Literal["graph", "text"]:
        """``graph`` when a local module answers, ``text`` for an API backbone."""
        return "graph" if self.model is not None else "text"

    @contextlib.contextmanager
    def frozen_pipeline(self) -> Iterator[None]:
        """LoRA adapters off while the shared LLM parses intents, reranks or builds memory (the pipeline is frozen)."""
        disable = getattr(self.model.llm, "disable_adapter", None) if self.model is not None else None
        with disable() if disable is not None else contextlib.nullcontext():
            yield
