"""Dynamic memory traces (paper III-A2): related units linked by relation, ordered, summarised by the LLM.

Each unit looks at its ``neighbours`` nearest units by fact embedding and links to those whose relation
text (subject + predicate) embeds within cosine ``relation_threshold``; connected components of at least
``min_cluster_size`` units are traces. Members are ordered by fact time, else utterance time, else turn
order (``serial-N``); the newest member is current, the rest superseded. Consolidation is incremental:
a cluster whose members and order are unchanged keeps its stored trajectory, so adding a session only
asks the LLM about the clusters the new units touch.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import numpy as np

from qgmem_train.config import PipelineConfig
from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.prompts import TRACE_CONSOLIDATION
from qgmem_train.llm.schemas import TrajectoryOutput
from qgmem_train.llm.structured import ParseStats, generate_structured
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.turn_units import FALLBACK_PREDICATE
from qgmem_train.memory.types import MemoryUnit, Trace

ROW_BLOCK = 2048


def link_clusters(
    fact_embeddings: np.ndarray,
    relation_embeddings: np.ndarray,
    neighbours: int,
    threshold: float,
    min_size: int,
    linkable: np.ndarray | None = None,
) -> list[list[int]]:
    """Connected components (as sorted unit indices) of the relation-linked k-nearest-fact-neighbour graph.

    ``linkable`` (bool per unit) leaves units out of every link, e.g. turns-mode units without a relation.
    """
    n = len(fact_embeddings)
    allowed = np.ones(n, bool) if linkable is None else np.asarray(linkable, bool)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    k = min(neighbours, n - 1)
    if k > 0:
        for lo in range(0, n, ROW_BLOCK):
            rows = np.arange(lo, min(n, lo + ROW_BLOCK))
            sims = fact_embeddings[rows] @ fact_embeddings.T
            sims[np.arange(len(rows)), rows] = -np.inf
            nearest = np.argpartition(-sims, k - 1, axis=1)[:, :k]
            relation = np.einsum("rd,rkd->rk", relation_embeddings[rows], relation_embeddings[nearest])
            links = (relation >= threshold) & allowed[rows][:, None] & allowed[nearest]
            for r, j in zip(*np.nonzero(links)):
                a, b = find(int(rows[r])), find(int(nearest[r, j]))
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return [g for g in groups.values() if len(g) >= max(min_size, 2)]


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


def consolidate_traces(store: MemoryStore, namespace: str, cfg: PipelineConfig, llm: ChatLLM | None = None, stats: ParseStats | None = None) -> int:
    """Recompute the namespace's clusters, ask the LLM only about new or changed ones; return the trace count.

    Each batch of trajectories commits on its own, and the namespace is marked up to date last, so a
    killed consolidation resumes with the clusters still missing. When another writer adds units
    meanwhile, the next write raises :class:`~qgmem_train.memory.store.UnitsChanged` and stores nothing.
    """
    cc = cfg.construction
    with store.snapshot():
        memory = store.load_namespace(namespace)
        relations = store.relation_embeddings(namespace)
    linkable = None
    if cc.units == "turns":
        linkable = np.array([u.predicate != FALLBACK_PREDICATE for u in memory.units], bool)
    clusters = link_clusters(memory.fact_embeddings, relations, cc.neighbours, cc.relation_threshold, cc.min_cluster_size, linkable)
    existing = {tuple(t.member_ids): t for t in memory.traces}
    keep: set[str] = set()
    pending: list[tuple[str, list[MemoryUnit]]] = []
    for cluster in clusters:
        members = order_members([memory.units[i] for i in cluster])
        ids = tuple(u.id for u in members)
        if ids in existing:
            keep.add(existing[ids].id)
        else:
            pending.append((cluster_relation(members), members))
    batch_size = max(1, cfg.generation.batch_size)
    for lo in range(0, len(pending), batch_size):
        batch = pending[lo:lo + batch_size]
        outputs: list[TrajectoryOutput | None] = [None] * len(batch)
        if llm is not None:
            chats = [TRACE_CONSOLIDATION.render(relation_text=rel, members_json=members_json(m)) for rel, m in batch]
            outputs = generate_structured(llm, chats, TrajectoryOutput, max_new_tokens=cfg.generation.max_new_tokens, stats=stats)
        traces = []
        for (relation, members), output in zip(batch, outputs):
            text = output.trajectory.strip() if output is not None and output.trajectory.strip() else rule_trajectory(members)
            traces.append(Trace(f"trace:{members[0].id}", relation, [u.id for u in members], text, members[-1].id))
        store.put_traces(namespace, traces, units_generation=memory.units_generation)
        keep.update(t.id for t in traces)
    store.finish_traces(namespace, keep, units_generation=memory.units_generation)
    return len(keep)
