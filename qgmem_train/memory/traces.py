"""Dynamic memory traces (paper III-A2): related units linked by relation, ordered, summarised by the LLM.

Each unit looks at its ``neighbours`` nearest units by fact embedding and links to those whose relation
text (subject + predicate) embeds within cosine ``relation_threshold``
(:mod:`qgmem_train.memory.trace_graph`); connected components of at least ``min_cluster_size`` units
are traces. Members are ordered by fact time, else utterance time, else turn order (``serial-N``); a
component larger than ``max_trace_size`` is cut into consecutive runs in that order, one trace each, so
that trajectory prompts and the answer's context stay bounded. The component's newest member is the
current one of each of its traces; every other member is superseded.

Consolidation is incremental: the namespace's graph is cached beside the store
(:mod:`qgmem_train.memory.trace_graph_file`), so adding a session searches the neighbours of its new
units only; a trace whose members and order are unchanged keeps its id and stored trajectory (its current
member follows its component's), so the LLM is asked only about the traces the new units touch.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence

import numpy as np

from qgmem_train.config import PipelineConfig
from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.prompts import TRACE_CONSOLIDATION
from qgmem_train.llm.schemas import TrajectoryOutput
from qgmem_train.llm.structured import ParseStats, generate_structured
from qgmem_train.memory.neighbours import can_extend, neighbour_count
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.trace_graph import TraceGraph, build_trace_graph, extend_trace_graph, linked_components
from qgmem_train.memory.trace_graph_file import fingerprints, graph_path, read_graph, write_graph
from qgmem_train.memory.turn_units import FALLBACK_PREDICATE
from qgmem_train.memory.types import MemoryUnit, Trace
from qgmem_train.memory.unit_table import unit_texts


def time_runs(count: int, max_size: int | None, min_size: int) -> list[slice]:
    """Consecutive runs of at most ``max_size`` (None: any number) of ``count`` members in time order, oldest first.

    Runs are cut from the oldest member on, so newer members leave the earlier full runs (and their
    trajectories) as they were; a last run shorter than ``min(max(min_size, 2), max_size)`` takes
    members from the run before it.
    """
    if max_size is None or count <= max_size:
        return [slice(0, count)]
    starts = list(range(0, count, max_size))
    shortest = min(max(min_size, 2), max_size)
    if count - starts[-1] < shortest:
        starts[-1] = count - shortest
    return [slice(a, b) for a, b in zip(starts, starts[1:] + [count])]


def memory_time(unit: MemoryUnit) -> str | None:
    """The time a unit is ordered by: its fact time's start, else its utterance time."""
    if unit.fact_time:
        return unit.fact_time[0].start
    return unit.utterance_time


def order_members(units: Sequence[MemoryUnit]) -> list[MemoryUnit]:
    """Oldest first: by memory time when every member has one, else by turn order."""
    if all(memory_time(u) for u in units):
        return sorted(units, key=lambda u: (memory_time(u)[:10], u.serial, u.id))
    return sorted(units, key=lambda u: (u.serial, u.id))


def members_json(members: Sequence[MemoryUnit]) -> str:
    """The trajectory prompt's member list: id, memory time (or ``serial-N``) and fact text, oldest first."""
    dated = all(memory_time(u) for u in members)
    items = [
        {"memory_unit_id": u.id, "time": memory_time(u)[:10] if dated else f"serial-{u.serial}", "fact_text": u.fact_text}
        for u in members
    ]
    return json.dumps(items, ensure_ascii=False)


def rule_trajectory(members: Sequence[MemoryUnit]) -> str:
    """A plain chronological trajectory, used when no LLM is given or its output was dropped."""
    dated = all(memory_time(u) for u in members)
    parts = [f"{memory_time(u)[:10] if dated else f'serial-{u.serial}'}: {u.fact_text}" for u in members]
    return " -> ".join(parts) + " (latest)"


def cluster_relation(members: Sequence[MemoryUnit]) -> str:
    """The cluster's relation: its most frequent member relation text (the oldest on ties)."""
    counts = Counter(u.relation_text for u in members)
    return max(counts, key=lambda text: (counts[text], -next(i for i, u in enumerate(members) if u.relation_text == text)))


def namespace_graph(store: MemoryStore, namespace: str, units: Sequence[MemoryUnit], facts: np.ndarray, relations: np.ndarray, cfg: PipelineConfig) -> TraceGraph:
    """The trace graph of ``units``: the cached one extended by the units added since, else built anew; cached again
    (in the store's folder: a PostgreSQL store, which has none, builds it anew each time)."""
    cc = cfg.construction
    path = graph_path(store.folder, namespace) if store.folder is not None else None
    ids = unit_texts(units, "id")
    prints = fingerprints(facts, relations)
    stored = read_graph(path, ids, prints, k=neighbour_count(cc.neighbours, len(ids)), dim=facts.shape[1]) if path is not None else None
    if stored is not None and can_extend(stored.graph.lists, len(ids), cc.neighbours):
        if len(stored.new_rows) == 0 and stored.graph.threshold == cc.relation_threshold:
            return stored.graph
        extend_trace_graph(stored.graph, facts, relations, stored.new_rows, cc.relation_threshold)
        graph = stored.graph
    else:
        graph = build_trace_graph(facts, relations, cc.neighbours, cc.relation_threshold)
    if path is not None:
        write_graph(path, ids, prints, graph)
    return graph


def consolidate_traces(store: MemoryStore, namespace: str, cfg: PipelineConfig, llm: ChatLLM | None = None, stats: ParseStats | None = None) -> int:
    """Update the namespace's clusters, ask the LLM only about new or changed traces; return the trace count.

    Each batch of trajectories commits on its own, and the namespace is marked up to date last, so a
    killed consolidation resumes with the clusters still missing. When another writer adds units
    meanwhile, the next write raises :class:`~qgmem_train.memory.store.UnitsChanged` and stores nothing.
    """
    cc = cfg.construction
    memory = store.load_namespace(namespace, sentences=False, relations=True)
    facts, relations = np.asarray(memory.fact_embeddings), np.asarray(memory.relation_embeddings)  # every row is read
    linkable = None
    if cc.units == "turns":
        linkable = np.array([predicate != FALLBACK_PREDICATE for predicate in unit_texts(memory.units, "predicate")], bool)
    graph = namespace_graph(store, namespace, memory.units, facts, relations, cfg)
    existing = {tuple(t.member_ids): t for t in memory.traces}
    keep: set[str] = set()
    pending: list[tuple[str, list[MemoryUnit], str]] = []
    restated: list[Trace] = []
    for cluster in linked_components(graph, linkable, cc.min_cluster_size):
        ordered = order_members([memory.units[i] for i in cluster])
        current = ordered[-1].id
        for run in time_runs(len(ordered), cc.max_trace_size, cc.min_cluster_size):
            members = ordered[run]
            stored = existing.get(tuple(u.id for u in members))
            if stored is None:
                pending.append((cluster_relation(members), members, current))
            elif stored.current_id != current:  # a newer run superseded its members: same trajectory, new current
                restated.append(dataclasses.replace(stored, current_id=current))
            else:
                keep.add(stored.id)
    if restated:
        store.put_traces(namespace, restated, units_generation=memory.units_generation)
        keep.update(t.id for t in restated)
    batch_size = max(1, cfg.generation.batch_size)
    for lo in range(0, len(pending), batch_size):
        batch = pending[lo:lo + batch_size]
        outputs: list[TrajectoryOutput | None] = [None] * len(batch)
        if llm is not None:
            chats = [TRACE_CONSOLIDATION.render(relation_text=rel, members_json=members_json(m)) for rel, m, _ in batch]
            outputs = generate_structured(llm, chats, TrajectoryOutput, max_new_tokens=cfg.generation.max_new_tokens, stats=stats)
        traces = []
        for (relation, members, current), output in zip(batch, outputs):
            text = output.trajectory.strip() if output is not None and output.trajectory.strip() else rule_trajectory(members)
            traces.append(Trace(f"trace:{members[0].id}", relation, [u.id for u in members], text, current))
        store.put_traces(namespace, traces, units_generation=memory.units_generation)
        keep.update(t.id for t in traces)
    store.finish_traces(namespace, keep, units_generation=memory.units_generation)
    return len(keep)
