"""A working memory as the answerer reads it: MEMORY_CONTEXT and the local graph of the same units."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qgmem_train.answer.memory_context import SerializedMemory, serialize_working_memory
from qgmem_train.graph.local_graph import LocalGraph, local_graph_from_units, unit_edges
from qgmem_train.llm.base import ChatLLM
from qgmem_train.memory.types import MemoryUnit

if TYPE_CHECKING:
    from qgmem_train.memory.store import NamespaceMemory


@dataclass
class AnswerEvidence:
    """MEMORY_CONTEXT, the local graph, and the id of the unit behind each graph edge (edge order)."""

    context: SerializedMemory
    graph: LocalGraph
    edge_unit_ids: list[str]


def answer_evidence(units: Sequence[MemoryUnit], memory: NamespaceMemory, llm: ChatLLM | None, *, max_edges: int, **graph: Any) -> AnswerEvidence:
    """MEMORY_CONTEXT of ``units`` (tokens counted with ``llm``) and their local graph of the edges of at most ``max_edges``
    units, built with the ``graph.*`` settings ``graph`` (:func:`~qgmem_train.graph.local_graph.graph_options`)."""
    graph_ = local_graph_from_units(units, max_edges, **graph)
    return AnswerEvidence(serialize_working_memory(units, memory, llm), graph_, edge_unit_ids(units, max_edges=max_edges, **graph))


def edge_unit_ids(units: Sequence[MemoryUnit], *, max_edges: int, **graph: Any) -> list[str]:
    """The id of the unit behind each edge of the local graph, in edge order (a unit repeats for its attribute and time edges)."""
    return [unit.id for unit, edges in unit_edges(units, max_edges, **graph) for _ in edges]
