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
from qgmem_train.pipeline.models import IntentMode, PipelineModels

if TYPE_CHECKING:
    from qgmem_train.llm.base import ChatLLM
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.model.module import GraphAugmentedLM
    from qgmem_train.retrieval.rerank import Reranker

MAX_QUESTION_CHARS = 4000
"""Default bound on a question's length: longer ones are refused before they reach the embedder or the prompt."""


class Predictor:
    """A QGMem model (or an API backbone) with its frozen retrieval stack, ready to build memory and answer."""

    def __init__(
        self,
        model: GraphAugmentedLM | None,
        pipeline: PipelineConfig | PipelineModels,
        *,
        llm: ChatLLM | None = None,
        embedder: Embedder | None = None,
        reranker: Reranker | None = None,
        intent: IntentMode = "llm",
        max_question_chars: int = MAX_QUESTION_CHARS,
    ) -> None:
        """``model`` is ``None`` on the text path. ``pipeline`` is the settings with their models built beside them (``llm``,
        ``embedder``, ``reranker``, ``intent``), or :class:`~qgmem_train.pipeline.PipelineModels` that build them when first
        needed; ``max_question_chars`` bounds every question ``ask`` takes."""
        if not isinstance(max_question_chars, int) or max_question_chars < 1:
            raise InputError("max_question_chars", f"is {max_question_chars!r}, expected a positive number of characters")
        if isinstance(pipeline, PipelineModels):
            self.models = pipeline
        else:
            self.models = PipelineModels.built(pipeline, llm=llm, embedder=embedder, reranker=reranker, intent=intent)
        self.model = model
        self.max_question_chars = max_question_chars

    @property
    def pipeline(self) -> PipelineConfig:
        """The pipeline settings (models, retrieval, generation)."""
        return self.models.cfg

    @property
    def llm(self) -> ChatLLM:
        """The frozen LLM: the module's backbone (adapters off) or the configured one."""
        return self.models.llm

    @property
    def embedder(self) -> Embedder:
        """The sentence embedder of units and queries."""
        return self.models.embedder

    @property
    def reranker(self) -> Reranker | None:
        """The configured reranker (``None``: the RRF order stands)."""
        return self.models.reranker

    @property
    def intent(self) -> IntentMode:
        """How query intents are parsed: the paper's LLM prompt, or rules."""
        return self.models.intent

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
