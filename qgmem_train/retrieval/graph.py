"""The graph channel: a personalised PageRank over a namespace's units and what joins them, seeded by the question.

Units meet in nodes: each entity or location text (the store's attribute rows; triple subjects, mostly the two
speakers, are left out: each joins half of a conversation), each trace, and each turn, which holds the units it
sources and the units of the turn after it. The walk alternates unit → node → unit and returns to its seeds with
probability ``retrieval.graph_restart`` at each step, as HippoRAG's does (Gutiérrez et al., 2024): the seeds are
the question's entities and locations (the texts they meet by SemMatch) and the first units of the three channels'
fused order. A unit that shares no word with the question but an entity with its best unit gets mass in two steps.
Nothing is stored: the graph is built from what every store holds when a namespace's index is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy import sparse

from qgmem_train.config import RetrievalConfig
from qgmem_train.memory.columns import ranges
from qgmem_train.memory.types import MemoryUnit, Trace
from qgmem_train.memory.unit_table import SUBJECT, AttributeIndex, first_source_turn_ids
from qgmem_train.retrieval.attributes import TextMatcher
from qgmem_train.retrieval.ranking import top_positive


class UnitGraph:
    """Units and nodes (a sparse unit × node incidence) with the two halves of a walk step, each normalized by degree.

    Mass is held as sparse vectors (rows, values): a walk of a few steps from a few seeds touches the seeds'
    neighbourhood only, so its time grows with the degrees it meets, not with the namespace.
    """

    def __init__(self, incidence: sparse.csr_matrix):
        incidence = incidence.tocsr().astype(np.float64)
        incidence.data[:] = 1.0  # a unit that names a text twice meets it once
        self.n_units, self.n_nodes = incidence.shape
        unit_degree, node_degree = np.asarray(incidence.sum(axis=1)).ravel(), np.asarray(incidence.sum(axis=0)).ravel()
        self._to_nodes = (sparse.diags(inverse(unit_degree)) @ incidence).tocsr()
        """Unit × node: a unit's mass spreads evenly over its nodes (by rows: a step reads the rows of the units with mass)."""
        self._to_units = (incidence @ sparse.diags(inverse(node_degree))).T.tocsr()
        """Node × unit: a node's mass spreads evenly over its units."""

    def walk(self, units: np.ndarray, unit_weights: np.ndarray, nodes: np.ndarray, node_weights: np.ndarray, *,
             restart: float, iterations: int) -> tuple[np.ndarray, np.ndarray]:
        """The units with mass after ``iterations`` steps of the walk restarting at the seeds, and their mass (rows
        ascending). Half the restart mass goes to the seed units, half to the seed nodes, each in proportion to its
        weight; all to one side when the other has none."""
        seed_units, seed_nodes = add(units, unit_weights), add(nodes, node_weights)
        sides = [side for side in (seed_units, seed_nodes) if side[1].sum() > 0]
        for _, values in sides:
            values *= 1.0 / len(sides) / values.sum()
        on_units, on_nodes = seed_units, seed_nodes
        for _ in range(iterations):
            on_units, on_nodes = (
                add(*concat(spread(self._to_units, *on_nodes, 1 - restart), (seed_units[0], restart * seed_units[1]))),
                add(*concat(spread(self._to_nodes, *on_units, 1 - restart), (seed_nodes[0], restart * seed_nodes[1]))),
            )
        return on_units


Sparse = tuple[np.ndarray, np.ndarray]
"""A sparse vector: rows and their values."""


def spread(step: sparse.csr_matrix, rows: np.ndarray, values: np.ndarray, scale: float) -> Sparse:
    """``scale`` times the sparse vector (rows, values) through ``step`` (its rows are the source side): every target and
    its share, targets repeated (:func:`add` sums them)."""
    starts = step.indptr[rows]
    counts = step.indptr[rows + 1] - starts
    at = ranges(starts, counts)
    return step.indices[at], scale * step.data[at] * np.repeat(values, counts)


def concat(first: Sparse, second: Sparse) -> Sparse:
    """Two sparse vectors' entries together (rows may repeat)."""
    return np.concatenate([first[0], second[0]]), np.concatenate([first[1], second[1]])


def add(rows: np.ndarray, values: np.ndarray) -> Sparse:
    """The entries summed per row: rows ascending, each once."""
    unique, inverse_of = np.unique(np.asarray(rows, np.int64), return_inverse=True)
    return unique, np.bincount(inverse_of, weights=np.asarray(values, np.float64), minlength=len(unique))


def inverse(degree: np.ndarray) -> np.ndarray:
    """1 / degree, 0 where the degree is 0 (a node no unit reaches, a unit in no node)."""
    out = np.zeros(len(degree))
    np.divide(1.0, degree, out=out, where=degree > 0)
    return out


def unit_graph(
    units: Sequence[MemoryUnit], attributes: AttributeIndex, traces: Sequence[Trace], row_of: Mapping[str, int],
    turn_row_of: Mapping[str, int], previous_turn_row: np.ndarray, links: Sequence[str],
) -> UnitGraph:
    """The :class:`UnitGraph` of a namespace with the node kinds of ``links``: ``attribute`` (a node per attribute text,
    subjects left out), ``trace`` (a node per trace) and ``turn`` (a node per turn: its units and the units of the
    turn after it, by ``previous_turn_row``). Node ids: the texts first, in their text ids, then traces, then turns."""
    n_texts = len(attributes.texts)
    unit_rows, node_ids = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    if "attribute" in links:
        keep = np.asarray(attributes.kind) != SUBJECT
        unit_rows.append(np.asarray(attributes.unit_index, np.int64)[keep])
        node_ids.append(np.asarray(attributes.text_id, np.int64)[keep])
    if "trace" in links:
        pairs = [(row_of[m], n_texts + j) for j, trace in enumerate(traces) for m in trace.member_ids if m in row_of]
        unit_rows.append(np.array([p[0] for p in pairs], np.int64))
        node_ids.append(np.array([p[1] for p in pairs], np.int64))
    first_turn_node = n_texts + len(traces)
    if "turn" in links:
        turn = np.fromiter((turn_row_of.get(t, -1) if t is not None else -1 for t in first_source_turn_ids(units)), np.int64, len(units))
        before = np.where(turn >= 0, np.append(previous_turn_row, -1)[turn], -1)
        for node in (turn, before):
            has = np.flatnonzero(node >= 0)
            unit_rows.append(has)
            node_ids.append(first_turn_node + node[has])
    rows, cols = np.concatenate(unit_rows), np.concatenate(node_ids)
    shape = (len(units), first_turn_node + len(previous_turn_row))
    return UnitGraph(sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=shape))


class GraphChannel:
    """The graph channel's ranking for a question: the walk from its entities' texts and the fused order's first units."""

    def __init__(self, graph: UnitGraph, texts: TextMatcher, n_texts: int):
        self.graph = graph
        self.texts = texts
        """SemMatch over the attribute texts (the attribute channel's, when it runs): the question's entities meet text nodes."""
        self.n_texts = n_texts

    def ranking(self, pool: np.ndarray, fused_scores: np.ndarray, query_items: Sequence[np.ndarray], cfg: RetrievalConfig) -> np.ndarray:
        """Top ``cfg.n`` units by the walk's mass, best first: the seed units (the restart returns to them) and the units
        they and the question's texts reach.

        ``query_items`` are the embeddings of the question's entities and of its locations (two arrays, as the attribute
        channel asks SemMatch); seed units weigh their RRF score, seed texts their best cosine with a query item at the
        SemMatch threshold (a text two items meet counts twice).
        """
        seeds, weights = pool[: cfg.graph_seeds], fused_scores[: cfg.graph_seeds]
        nodes, node_weights = np.zeros(0, np.int64), np.zeros(0)
        found = [self.texts.passing(items) for items in query_items if len(items) and len(self.texts.embeddings)]
        if found:
            passing = np.concatenate([texts for texts, _ in found])
            similarities = np.concatenate([sims.max(axis=1) for _, sims in found])
            known = passing < self.n_texts  # texts SemMatch added (subjects stored without a vector) are no nodes
            nodes, node_weights = passing[known], similarities[known]
        rows, mass = self.graph.walk(seeds, weights, nodes, node_weights, restart=cfg.graph_restart, iterations=cfg.graph_iterations)
        return rows[top_positive(mass, cfg.n)[0]]
