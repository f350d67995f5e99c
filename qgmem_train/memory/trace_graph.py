"""The trace graph (paper III-A2): each unit linked to those of its nearest fact neighbours whose relation is close.

A unit lists its k nearest units by fact embedding (:mod:`qgmem_train.memory.neighbours`) and is linked
to every listed unit whose relation embedding (subject + predicate) lies within cosine τ of its own.
Links go both ways: two units are linked when either lists the other. Traces are the connected
components. Adding units updates the lists of the new units and of the units they enter, and the
relation links of those lists only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from qgmem_train.memory.neighbours import BLOCK_BYTES, EXACT_MAX_UNITS, NeighbourLists, extend_neighbours, moved, nearest_neighbours


@dataclass
class TraceGraph:
    """Fact-neighbour lists and, for each listed neighbour, whether its relation lies within ``threshold``."""

    lists: NeighbourLists
    related: np.ndarray
    """(N, k) bool: the listed neighbour's relation embedding has cosine at least ``threshold`` with the unit's."""
    threshold: float


def retest_relations(graph: TraceGraph, relations: np.ndarray, rows: np.ndarray, block_bytes: int) -> None:
    """Recompute ``graph.related`` at ``rows`` (in place): the relation test of each listed pair."""
    index = graph.lists.index
    k = graph.lists.k
    step = max(1, block_bytes // ((k + 1) * relations.shape[1] * 4))
    for lo in range(0, len(rows), step):
        part = rows[lo:lo + step]
        block = index[part]
        cosines = np.einsum("rd,rkd->rk", relations[part], relations[np.maximum(block, 0)])
        graph.related[part] = (cosines >= graph.threshold) & (block >= 0)


def build_trace_graph(
    facts: np.ndarray, relations: np.ndarray, neighbours: int, threshold: float, *, exact_max: int = EXACT_MAX_UNITS, block_bytes: int = BLOCK_BYTES
) -> TraceGraph:
    """The trace graph of all units: their fact-neighbour lists and the relation test of every listed pair."""
    lists = nearest_neighbours(facts, neighbours, exact_max=exact_max, block_bytes=block_bytes)
    graph = TraceGraph(lists, np.zeros(lists.index.shape, bool), threshold)
    retest_relations(graph, np.asarray(relations, np.float32), np.arange(len(lists.index)), block_bytes)
    return graph


def moved_graph(graph: TraceGraph, rows: np.ndarray, units: int) -> TraceGraph:
    """``graph`` renumbered: its row r becomes row ``rows[r]`` of ``units`` rows; the others start unlisted."""
    related = np.zeros((units, graph.lists.k), bool)
    related[np.asarray(rows, np.int64)] = graph.related
    return TraceGraph(moved(graph.lists, rows, units), related, graph.threshold)


def extend_trace_graph(
    graph: TraceGraph, facts: np.ndarray, relations: np.ndarray, new_rows: np.ndarray, threshold: float, *, block_bytes: int = BLOCK_BYTES
) -> np.ndarray:
    """Add the units at ``new_rows`` (unlisted in ``graph``) in place; return the rows whose lists changed.

    Only pairs new to a list take the relation test; a ``threshold`` other than the graph's retests every pair.
    """
    relations = np.asarray(relations, np.float32)
    before_index, before_related = graph.lists.index.copy(), graph.related.copy()
    changed = extend_neighbours(graph.lists, facts, new_rows, block_bytes=block_bytes)
    if threshold != graph.threshold:
        graph.threshold = threshold
        retest_relations(graph, relations, np.arange(len(changed)), block_bytes)
        return changed
    rows = np.flatnonzero(changed)
    k = graph.lists.k
    step = max(1, block_bytes // (k * (2 * k + 8 * relations.shape[1])))
    for lo in range(0, len(rows), step):
        part = rows[lo:lo + step]
        index = graph.lists.index[part]
        same = index[:, :, None] == before_index[part][:, None, :]
        listed_before = same.any(axis=2)
        related = (same & before_related[part][:, None, :]).any(axis=2)
        fresh_row, fresh_column = np.nonzero(~listed_before & (index >= 0))
        cosines = np.einsum("pd,pd->p", relations[part[fresh_row]], relations[index[fresh_row, fresh_column]])
        related[fresh_row, fresh_column] = cosines >= threshold
        graph.related[part] = related
    return changed


def linked_components(graph: TraceGraph, linkable: np.ndarray | None, min_size: int) -> list[np.ndarray]:
    """Connected components of at least ``max(min_size, 2)`` units, as ascending rows, ordered by their first row.

    ``linkable`` (bool per unit) leaves units out of every link, e.g. turns-mode units without a relation.
    """
    index = graph.lists.index
    n = len(index)
    if n == 0:
        return []
    edge = graph.related & (index >= 0)
    source, column = np.nonzero(edge)
    target = index[source, column]
    if linkable is not None:
        allowed = np.asarray(linkable, bool)
        both = allowed[source] & allowed[target]
        source, target = source[both], target[both]
    links = sparse.csr_matrix((np.ones(len(source), np.int8), (source, target)), shape=(n, n))
    _, labels = connected_components(links, directed=True, connection="weak")
    size = np.bincount(labels)
    rows = np.flatnonzero(size[labels] >= max(min_size, 2))
    rows = rows[np.argsort(labels[rows], kind="stable")]
    bounds = np.flatnonzero(np.diff(labels[rows])) + 1
    components = np.split(rows, bounds) if len(rows) else []
    return sorted(components, key=lambda c: int(c[0]))
