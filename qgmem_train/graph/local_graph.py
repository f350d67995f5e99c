"""The local memory graph of a working memory (paper III-C1) and its torch_geometric form.

One directed edge per activated unit, subject → object, labelled by the unit's predicate, so a
working memory of k units gives at most k edges and 2k nodes; nodes are deduplicated by their
normalised label. With ``attribute_edges`` a unit also links its subject to each entity it names
(``mentions``) and each location (``at``), so two units about "Biscuit" or "Lisbon" meet in one node. With ``time_edges``
it links its subject to the day it was said (``on``) and to each time it names (``about``), in words ("7 May 2023"), so a
dated answer is among the labels. The label-only :class:`LocalGraph` is what trajectories record; :func:`graph_to_data`
attaches embedder features (node: f_emb(label), edge: f_emb(predicate)) for the encoder.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch_geometric.data import Data

from qgmem_train.memory.timeparse import spoken_date, spoken_span
from qgmem_train.memory.types import MemoryUnit

_SPACES = re.compile(r"\s+")

LabelEmbedder = Callable[[list[str]], np.ndarray]
"""Maps labels to float32 rows (the retrieval embedder's ``encode``, or a cache in front of it)."""


def normalize_label(label: str) -> str:
    """The dedup key of a node: case-folded, whitespace collapsed, surrounding punctuation stripped."""
    return _SPACES.sub(" ", label.casefold()).strip().strip(".,;:!?\"'()[]").strip()


@dataclass
class LocalGraph:
    """Node labels plus directed labelled edges; no features, so it serializes as plain JSON."""

    node_labels: list[str] = field(default_factory=list)
    edge_src: list[int] = field(default_factory=list)
    edge_dst: list[int] = field(default_factory=list)
    edge_labels: list[str] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        """Number of distinct nodes."""
        return len(self.node_labels)

    @property
    def num_edges(self) -> int:
        """Number of edges (one per contributing unit)."""
        return len(self.edge_labels)

    def triples(self) -> list[tuple[str, str, str]]:
        """``(subject, predicate, object)`` per edge, in edge order."""
        return [(self.node_labels[s], p, self.node_labels[d]) for s, d, p in zip(self.edge_src, self.edge_dst, self.edge_labels)]


MENTIONS, AT = "mentions", "at"
"""Predicates of attribute edges: subject → a named entity, subject → a location."""
ON, ABOUT = "on", "about"
"""Predicates of time edges: subject → the day the unit was said, subject → a time the unit names (its fact time)."""


def local_graph_from_units(
    units: Sequence[MemoryUnit], max_edges: int | None = None, attribute_edges: bool = False, time_edges: bool = False
) -> LocalGraph:
    """Build the local graph of the working memory's units, in their order (edges of at most ``max_edges`` units).

    A unit whose subject or object is empty after normalisation contributes no edge. A node keeps
    the spelling of its first occurrence. With ``attribute_edges`` each contributing unit's own edge is
    followed by its attribute edges (:func:`unit_attribute_edges`), with ``time_edges`` by its time edges
    (:func:`unit_time_edges`); the unit budget counts neither.
    """
    graph = LocalGraph()
    index: dict[str, int] = {}

    def node(label: str) -> int:
        key = normalize_label(label)
        if key not in index:
            index[key] = len(graph.node_labels)
            graph.node_labels.append(label.strip())
        return index[key]

    contributing = 0
    for unit in units:
        if max_edges is not None and contributing >= max_edges:
            break
        if not normalize_label(unit.subject) or not normalize_label(unit.object):
            continue
        contributing += 1
        triples = [(unit.predicate.strip(), unit.object)] + (unit_attribute_edges(unit) if attribute_edges else [])
        triples += unit_time_edges(unit) if time_edges else []
        for predicate, target in triples:
            graph.edge_src.append(node(unit.subject))
            graph.edge_dst.append(node(target))
            graph.edge_labels.append(predicate)
    return graph


def unit_attribute_edges(unit: MemoryUnit) -> list[tuple[str, str]]:
    """``(predicate, target)`` of a unit's attribute edges: ``mentions`` per entity, then ``at`` per location.

    Targets that normalise to nothing, to the subject or the object, or to an earlier target are left out.
    """
    seen = {normalize_label(unit.subject), normalize_label(unit.object), ""}
    edges = []
    for predicate, labels in ((MENTIONS, unit.entities), (AT, unit.locations)):
        for label in labels:
            key = normalize_label(label)
            if key not in seen:
                seen.add(key)
                edges.append((predicate, label))
    return edges


def unit_time_edges(unit: MemoryUnit) -> list[tuple[str, str]]:
    """``(predicate, target)`` of a unit's time edges: ``on`` its utterance day, then ``about`` each fact-time span, in
    words (:func:`~qgmem_train.memory.timeparse.spoken_span`). A span that reads as an earlier target is left out."""
    edges = [(ON, spoken_date(unit.utterance_time))] if unit.utterance_time else []
    for span in unit.fact_time:
        label = spoken_span(span)
        if all(label != target for _, target in edges):
            edges.append((ABOUT, label))
    return edges


def graph_to_data(graph: LocalGraph, embed: LabelEmbedder, dim: int, question: np.ndarray | None = None) -> Data:
    """A torch_geometric ``Data`` with ``x`` (nodes × dim), ``edge_index``, ``edge_attr`` (edges × dim).

    ``dim`` is the embedder's width, needed for the empty graph (no nodes). Labels ride along as
    ``node_labels`` and ``edge_labels`` so a batch can be inspected or recorded. ``question`` (the
    question's embedding) rides along as ``question_embedding`` ``(1, dim)``, for the query readout.
    """
    x = _features(graph.node_labels, embed, dim)
    edge_attr = _features(graph.edge_labels, embed, dim)
    edge_index = torch.tensor([graph.edge_src, graph.edge_dst], dtype=torch.long).reshape(2, -1)
    extra = {} if question is None else {"question_embedding": torch.as_tensor(np.asarray(question, dtype=np.float32)).reshape(1, dim)}
    return Data(
        **extra,
        x=x,
        edge_index=edge_index,
        edge_attr=edge_attr,
        num_nodes=graph.num_nodes,
        node_labels=list(graph.node_labels),
        edge_labels=list(graph.edge_labels),
    )


def _features(labels: list[str], embed: LabelEmbedder, dim: int) -> torch.Tensor:
    if not labels:
        return torch.zeros(0, dim, dtype=torch.float32)
    rows = np.asarray(embed(labels), dtype=np.float32)
    if rows.shape != (len(labels), dim):
        raise ValueError(f"embedder returned shape {rows.shape}, expected ({len(labels)}, {dim})")
    return torch.from_numpy(rows)
