"""The frozen models of one pipeline config, built once each and only when a stage first asks for it.

Every caller that runs the pipeline (the predictor on the text path, ``ask``, ``serve``, ``eval``, data prep, the
alignment and reranker data) takes its models here, so that each picks them by the same rules: the reranker is the
configured one (``models.reranker`` and ``models.reranker_model``), never the answering LLM standing in for it.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Literal

from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError

if TYPE_CHECKING:
    from qgmem_train.llm.base import ChatLLM
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.retrieval.rerank import Reranker

IntentMode = Literal["llm", "rules"]
INTENT_MODES = ("llm", "rules")


class PipelineModels:
    """The embedder, reranker, intent parser and answering LLM of ``cfg``, each built on first use and then kept.

    ``reranker`` names a reranker kind over ``models.reranker``; ``intent`` picks the paper's LLM intent prompt or the
    rules. ``llm`` and ``embedder`` are models already in memory (an exported module's backbone) to use instead of
    building them; the ``llm`` reranker then scores with ``llm`` unless ``models.reranker_model`` names its own model.
    """

    def __init__(
        self, cfg: PipelineConfig, *, reranker: str | None = None, intent: IntentMode = "llm", llm: ChatLLM | None = None,
        embedder: Embedder | None = None,
    ) -> None:  # fmt: skip
        if intent not in INTENT_MODES:
            raise InputError("intent", f"unknown intent parser {intent!r} (llm, rules)")
        self.cfg = cfg
        self.reranker_kind = reranker or cfg.models.reranker
        self.intent = intent
        if llm is not None:
            self.llm = llm
        if embedder is not None:
            self.embedder = embedder

    @classmethod
    def built(cls, cfg: PipelineConfig, *, llm: ChatLLM, embedder: Embedder, reranker: Reranker | None, intent: IntentMode = "llm") -> PipelineModels:
        """Models the caller already holds (``reranker`` ``None``: the RRF order stands); none is built."""
        models = cls(cfg, intent=intent, llm=llm, embedder=embedder)
        models.reranker = reranker
        return models

    def build_all(self) -> PipelineModels:
        """Build every model a question needs now (a server fails at its start, not at its first question, on a bad name)."""
        for name in ("embedder", "reranker", "llm"):
            getattr(self, name)
        return self

    @cached_property
    def llm(self) -> ChatLLM:
        """The answering LLM (also intents, construction and, without ``models.reranker_model``, the ``llm`` reranker)."""
        from qgmem_train.llm import factory

        return factory.build_llm(self.cfg)

    @cached_property
    def embedder(self) -> Embedder:
        """The sentence embedder of units and queries."""
        from qgmem_train.llm import factory

        return factory.build_embedder(self.cfg)

    @cached_property
    def reranker(self) -> Reranker | None:
        """The configured reranker (``None`` for ``none``): an ``llm`` one scores with ``models.reranker_model`` when set."""
        from qgmem_train.retrieval.rerank import build_reranker

        kind = self.reranker_kind
        own_model = kind == "llm" and not self.cfg.models.reranker_model
        return build_reranker(self.cfg, kind, llm=self.llm if own_model else None)

    @property
    def intent_llm(self) -> ChatLLM | None:
        """The LLM that parses query intents; ``None`` with rule-based intents (no LLM is built for them)."""
        return self.llm if self.intent == "llm" else None

    @property
    def construction_llm(self) -> ChatLLM | None:
        """The LLM that builds memory: for the paper's units or traces; ``None`` for turns without traces."""
        construction = self.cfg.construction
        return self.llm if construction.units == "llm" or construction.traces else None
