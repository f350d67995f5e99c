"""The working memory as the final-answer prompt's MEMORY_CONTEXT (paper appendix F1, text path).

Two parts, as the final-answer prompt describes them:

- **Evidence Clusters**: for working-memory units that belong to a dynamic memory trace, one cluster
  per trace (in order of the trace's first unit in the working memory) with its ``trajectory`` and its
  activated units, oldest first, labelled ``MU1``, ``MU2``, ..., each marked ``[state: current]`` (the
  trace's current member) or ``[state: superseded by MU#]`` (``[state: superseded]`` when the current
  member is not in the working memory);
- **Facts**: every other unit in working-memory order, labelled ``F1``, ``F2``, ..., as its
  subject | predicate | object triple followed by the fact text.

Each unit shows its utterance time (``serial-N`` when the dialogue has no dates) and fact time, so
the answerer can order evidence. Labels map back to unit ids for citations; the local graph's facts carry the same
labels (:attr:`SerializedMemory.label_of`), one scheme for every prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qgmem_train.llm.base import ChatLLM
from qgmem_train.memory.types import MemoryUnit, Trace
from qgmem_train.retrieval.rerank import format_spans

if TYPE_CHECKING:
    from qgmem_train.memory.store import NamespaceMemory

_LABEL = re.compile(r"\b(MU|F)(\d+)\b")


@dataclass
class SerializedMemory:
    """MEMORY_CONTEXT text, its label → unit id map, and its length in the answering LLM's tokens."""

    text: str
    labels: dict[str, str]
    n_tokens: int

    @property
    def label_of(self) -> dict[str, str]:
        """Unit id → its label: what the local graph's edges are labelled with, so a label names one unit in every prompt."""
        return {unit_id: label for label, unit_id in self.labels.items()}


def _times(unit: MemoryUnit) -> str:
    utterance = unit.utterance_time or f"serial-{unit.serial}"
    return f"utterance_time: {utterance}; fact_time: {format_spans(unit.fact_time)}"


def _state(unit: MemoryUnit, trace: Trace, label_of: dict[str, str]) -> str:
    """``current``, or ``superseded by`` the current member's label (just ``superseded`` when it is not in the working memory)."""
    if unit.id == trace.current_id:
        return "current"
    return f"superseded by {label_of[trace.current_id]}" if trace.current_id in label_of else "superseded"


def serialize_working_memory(units: Sequence[MemoryUnit], memory: NamespaceMemory, llm: ChatLLM | None = None) -> SerializedMemory:
    """MEMORY_CONTEXT for ``units`` (working-memory order); tokens counted with ``llm`` when given, else words."""
    traces = {t.id: t for t in memory.traces}
    clusters: dict[str, list[MemoryUnit]] = {}
    facts: list[MemoryUnit] = []
    for unit in units:
        trace_id = memory.trace_of.get(unit.id)
        if trace_id in traces:
            clusters.setdefault(trace_id, []).append(unit)
        else:
            facts.append(unit)

    labels: dict[str, str] = {}
    lines = ["Evidence Clusters:"]
    if not clusters:
        lines.append("(none)")
    for number, (trace_id, members) in enumerate(clusters.items(), start=1):
        trace = traces[trace_id]
        position = {uid: i for i, uid in enumerate(trace.member_ids)}
        members = sorted(members, key=lambda u: position.get(u.id, len(position)))
        label_of = {u.id: f"MU{len(labels) + i}" for i, u in enumerate(members, start=1)}
        lines += [f"Cluster {number} (relation: {trace.relation_text})", f"trajectory: {trace.trajectory}"]
        for unit in members:
            labels[label_of[unit.id]] = unit.id
            lines.append(f"[{label_of[unit.id]}] ({_times(unit)}) {unit.fact_text} [state: {_state(unit, trace, label_of)}]")
    lines.append("Facts:")
    if not facts:
        lines.append("(none)")
    for number, unit in enumerate(facts, start=1):
        label = f"F{number}"
        labels[label] = unit.id
        lines.append(f"[{label}] {unit.subject} | {unit.predicate} | {unit.object} ({_times(unit)}) {unit.fact_text}")
    text = "\n".join(lines)
    n_tokens = llm.count_tokens(text) if llm is not None else len(text.split())
    return SerializedMemory(text=text, labels=labels, n_tokens=n_tokens)


def cited_unit_ids(reasoning_path: str, labels: dict[str, str]) -> list[str]:
    """Unit ids of the MU#/F# labels cited in ``reasoning_path``, in order of first citation; unknown labels ignored."""
    cited = [labels.get(f"{kind}{number}") for kind, number in _LABEL.findall(reasoning_path)]
    return list(dict.fromkeys(uid for uid in cited if uid is not None))
