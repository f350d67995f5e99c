"""A working memory as the answerer reads it: MEMORY_CONTEXT and the local graph of the same units."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qgmem_train.answer.memory_context import SerializedMemory, serialize_working_memory
from qgmem_train.graph.local_graph import LocalGraph, local_graph_from_units
from qgmem_train.llm.base import ChatLLM
from qgmem_train.memory.types import MemoryUnit

if TYPE_CHECKING:
    from qgmem_train.memory.store import NamespaceMemory


@dataclass
class AnswerEvidence:
    """MEMORY_CONTEXT and the local graph, whose edges carry the labels of their units in it."""

    context: SerializedMemory
    graph: LocalGraph


def answer_evidence(units: Sequence[MemoryUnit], memory: NamespaceMemory, llm: ChatLLM | None, *, max_edges: int, **graph: Any) -> AnswerEvidence:
    """MEMORY_CONTEXT of ``units`` (tokens counted with ``llm``) and their local graph of the edges of at most ``max_edges``
    units, built with the ``graph.*`` settings ``graph`` (:func:`~qgmem_train.graph.local_graph.graph_options`), each edge
    labelled as its unit is in MEMORY_CONTEXT."""
    context = serialize_working_memory(units, memory, llm)
    return AnswerEvidence(context, local_graph_from_units(units, max_edges, labels=context.label_of, **graph))
