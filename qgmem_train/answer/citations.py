"""The units a reasoning path cites by the labels of a final-answer chat."""

from __future__ import annotations

from qgmem_train.answer.evidence import AnswerEvidence
from qgmem_train.answer.memory_context import cited_unit_ids


def cited_units(reasoning_path: str, evidence: AnswerEvidence) -> list[str]:
    """Unit ids the reasoning path cites (MU#/F#), in order of first citation: the local graph's facts carry their units'
    MEMORY_CONTEXT labels, so one label map serves every prompt, with or without the graph as text."""
    return cited_unit_ids(reasoning_path, evidence.context.labels)
