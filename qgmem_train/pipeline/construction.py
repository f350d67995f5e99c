"""Build conversations into a store with a config's models: the ``build`` command's work, and the reranker data's store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from qgmem_train.pipeline.models import PipelineModels

if TYPE_CHECKING:
    from qgmem_train.config import PipelineConfig
    from qgmem_train.memory.construct import BuildReport, Progress
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.memory.types import Conversation


def refuse_unbuildable(store: MemoryStore, conversations: Sequence[Conversation], cfg: PipelineConfig, namespace: str | None = None) -> None:
    """Refuse a turn over ``construction.max_turn_chars``, or a namespace cut otherwise than ``construction`` asks, before
    any model loads or anything is written."""
    from qgmem_train.memory.construct import refuse_long_turns

    cc = cfg.construction
    for conversation in conversations:
        refuse_long_turns(conversation, cc.max_turn_chars)
    for conversation in conversations:
        store.check_cut(namespace or conversation.id, cc.units, cc.window, cc.overlap)


def build_conversations(
    store: MemoryStore, conversations: Sequence[Conversation], models: PipelineModels, *, namespace: str | None = None,
    limit_sessions: int | None = None, progress: Progress | None = None,
) -> list[BuildReport]:  # fmt: skip
    """Build or extend each conversation into ``namespace`` (default: one per conversation id), resuming what is stored;
    what :func:`refuse_unbuildable` refuses is refused first."""
    from qgmem_train.memory.construct import build_conversation

    refuse_unbuildable(store, conversations, models.cfg, namespace)
    return [
        build_conversation(store, conversation, models.cfg, models.embedder, namespace=namespace, llm=models.construction_llm,
                           limit_sessions=limit_sessions, progress=progress)
        for conversation in conversations
    ]  # fmt: skip
