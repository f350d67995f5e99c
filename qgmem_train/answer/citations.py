"""The labels of a final-answer chat and the units a reasoning path cites by them."""

from __future__ import annotations

from qgmem_train.answer.evidence import AnswerEvidence
from qgmem_train.answer.memory_context import cited_unit_ids
from qgmem_train.answer.prompt import first_graph_fact_number


def chat_labels(evidence: AnswerEvidence, *, text_path: bool) -> dict[str, str]:
    """Label → unit id of every label the chat shows: MEMORY_CONTEXT's, and on the text path the local graph's facts."""
    labels = dict(evidence.context.labels)
    if text_path and evidence.graph.num_edges:
        first = first_graph_fact_number(evidence.context.text)
        labels.update({f"F{first + i}": unit_id for i, unit_id in enumerate(evidence.edge_unit_ids)})
    return labels


def cited_units(reasoning_path: str, evidence: AnswerEvidence, *, text_path: bool) -> list[str]:
    """Unit ids the reasoning path cites (MU#/F#, graph facts included on the text path), in order of first citation."""
    return cited_unit_ids(reasoning_path, chat_labels(evidence, text_path=text_path))
