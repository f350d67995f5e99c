"""Build the configured LLM, reranker LLM and embedder once per process."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, TypeVar

from qgmem_train.config import GenerationConfig, ModelsConfig, PipelineConfig
from qgmem_train.errors import ModelUnavailableError
from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.embedder import Embedder

T = TypeVar("T")
_BUILT: dict[str, Any] = {}


def _cached(key: tuple, build: Callable[[], T]) -> T:
    """One instance per distinct settings in this process (models are large; load them once)."""
    name = json.dumps(key, sort_keys=True, default=str)
    if name not in _BUILT:
        _BUILT[name] = build()
    return _BUILT[name]


def build_llm(cfg: PipelineConfig) -> ChatLLM:
    """The pipeline LLM of ``cfg.models`` (local transformers or OpenAI-compatible HTTP); cached per process."""
    m = cfg.models
    return _cached(("llm", m.llm, m.llm_revision, dataclasses.asdict(m), dataclasses.asdict(cfg.generation)),
                   lambda: _make_llm(m.llm, m.llm_revision, m, cfg.generation))  # fmt: skip


def build_reranker_llm(cfg: PipelineConfig) -> ChatLLM:
    """The yes/no reranker LLM: ``models.reranker_model`` when set, else the pipeline LLM itself."""
    m = cfg.models
    if not m.reranker_model or m.reranker_model == m.llm:
        return build_llm(cfg)
    return _cached(("llm", m.reranker_model, None, dataclasses.asdict(m), dataclasses.asdict(cfg.generation)),
                   lambda: _make_llm(m.reranker_model, None, m, cfg.generation))  # fmt: skip


def build_embedder(cfg: PipelineConfig) -> Embedder:
    """The sentence embedder of ``cfg.models``; cached per process."""
    m = cfg.models
    return _cached(("embedder", m.embedder, m.device, m.cache_dir, m.trust_remote_code),
                   lambda: Embedder(m.embedder, device=m.device, cache_dir=m.cache_dir, trust_remote_code=m.trust_remote_code))  # fmt: skip


def _make_llm(ref: str, revision: str | None, m: ModelsConfig, g: GenerationConfig) -> ChatLLM:
    if m.backend == "openai":
        from qgmem_train.llm.http import OpenAICompatibleLLM

        if not m.base_url:
            raise ModelUnavailableError("models.backend is openai but models.base_url is not set")
        return OpenAICompatibleLLM(
            m.base_url, ref, api_key_env=m.api_key_env, allow_insecure_http=m.allow_insecure_http, max_concurrency=m.max_concurrency, timeout_s=m.timeout_s,
            max_retries=m.max_retries, deadline_s=m.deadline_s, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
            constrained=g.constrained,
        )  # fmt: skip
    from qgmem_train.llm.local import TransformersLLM

    return TransformersLLM(
        ref, revision=revision, dtype=m.dtype, device=m.device, quantization=m.quantization, cache_dir=m.cache_dir,
        trust_remote_code=m.trust_remote_code, max_new_tokens=g.max_new_tokens, batch_size=g.batch_size,
        temperature=g.temperature, constrained=g.constrained, template_budget_s=m.template_budget_s,
    )  # fmt: skip
