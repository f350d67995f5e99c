"""The local memory graph of a working memory (paper III-C1) and its torch_geometric form.

One directed edge per activated unit, subject → object, labelled by the unit's predicate, so a
working memory of k units gives at most k edges and 2k nodes; nodes are deduplicated by their
normalised label. With ``attribute_edges`` a unit also links its subject to each entity it names
(``mentions``) and each location (``at``), so two units about "Biscuit" or "Lisbon" meet in one node. With ``time_edges``
it links its subject to the day it was said (``on``) and to each time it names (``about``), in words ("7 May 2023"), so a
dated answer is among the labels. Each edge keeps the MEMORY_CONTEXT label of its unit (``MU#``/``F#``), so the graph's
facts as text name a unit as the memory context and a reasoning path do. The label-only :class:`LocalGraph` is what
trajectories record; :func:`graph_to_data` attaches embedder features (node: f_emb(label), edge: f_emb(predicate)) for
the encoder.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch_geometric.data import Data

from qgmem_train.memory.timeparse import spoken_date, spoken_span
from qgmem_train.memory.types import MemoryUnit
from qgmem_train.text import STOPWORDS

if TYPE_CHECKING:
    from qgmem_train.config import GraphConfig

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
    edge_unit_labels: list[str] = field(default_factory=list)
    """The MEMORY_CONTEXT label (``MU#``/``F#``) of the unit behind each edge, in edge order: a unit's edges share it."""

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


def graph_options(settings: GraphConfig) -> dict[str, Any]:
    """The ``graph.*`` settings (:class:`~qgmem_train.config.GraphConfig`) as :func:`local_graph_from_units`' keywords:
    data prep, evaluation and the predictor build their graphs alike from one config section."""
    return {"attribute_edges": settings.attribute_edges, "time_edges": settings.time_edges, "object_kind": settings.object,
            "object_words": settings.object_words, "attribute_cap": settings.attribute_cap}  # fmt: skip


def edge_object(unit: MemoryUnit, kind: str, words: int) -> str:
    """The object of ``unit``'s own edge: its extracted object (``gist``), its whole fact text (``fact``) or its source
    turn(s) (``turn``), the last two cut to ``words`` words."""
    if kind == "gist":
        return unit.object
    text = unit.fact_text if kind == "fact" else unit.source_text
    return " ".join(text.split()[:words])


def unit_edges(
    units: Sequence[MemoryUnit], max_edges: int | None = None, attribute_edges: bool = False, time_edges: bool = False, *,
    object_kind: str = "gist", object_words: int = 60, attribute_cap: int = 0,
) -> list[tuple[MemoryUnit, list[tuple[str, str]]]]:
    """Each contributing unit (at most ``max_edges``, in order) with its ``(predicate, target)`` edges from its subject:
    what :func:`local_graph_from_units` builds, and whose unit each edge is."""
    contributing = [u for u in units if normalize_label(u.subject) and normalize_label(edge_object(u, object_kind, object_words))]
    contributing = contributing[:max_edges] if max_edges is not None else contributing
    common = common_targets(contributing) if attribute_edges else set()
    found = []
    for unit in contributing:
        attributes = [(p, t) for p, t in unit_attribute_edges(unit) if normalize_label(t) not in common] if attribute_edges else []
        attributes = attributes[:attribute_cap] if attribute_cap > 0 else attributes
        edges = [(unit.predicate.strip(), edge_object(unit, object_kind, object_words)), *attributes]
        found.append((unit, edges + (unit_time_edges(unit) if time_edges else [])))
    return found


def fact_labels(units: Sequence[MemoryUnit]) -> dict[str, str]:
    """Unit id → ``F1``, ``F2``, ... in working-memory order: how MEMORY_CONTEXT labels a working memory without evidence
    clusters (:func:`~qgmem_train.answer.memory_context.serialize_working_memory`)."""
    return {unit.id: f"F{number}" for number, unit in enumerate(units, start=1)}


def local_graph_from_units(
    units: Sequence[MemoryUnit], max_edges: int | None = None, *, labels: Mapping[str, str] | None = None, **options: Any
) -> LocalGraph:
    """Build the local graph of the working memory's units, in their order (edges of at most ``max_edges`` units).

    A unit whose subject or object is empty after normalisation contributes no edge. A node keeps the spelling of its
    first occurrence. Each edge records its unit's label from ``labels`` (unit id → its MEMORY_CONTEXT label, as
    :class:`~qgmem_train.answer.memory_context.SerializedMemory` ``.label_of`` gives it; :func:`fact_labels` when None). ``options`` (:func:`graph_options`; each off by default) choose the object of a unit's edge
    (``object_kind``: :func:`edge_object`) and add, after it, its attribute edges (``attribute_edges``:
    :func:`unit_attribute_edges`, at most ``attribute_cap`` when above 0, none to a target most units name:
    :func:`common_targets`) and its time edges (``time_edges``: :func:`unit_time_edges`); the unit budget counts neither.
    """
    graph = LocalGraph()
    index: dict[str, int] = {}
    label_of = fact_labels(units) if labels is None else labels

    def node(label: str) -> int:
        key = normalize_label(label)
        if key not in index:
            index[key] = len(graph.node_labels)
            graph.node_labels.append(label.strip())
        return index[key]

    for unit, edges in unit_edges(units, max_edges, **options):
        for predicate, target in edges:
            graph.edge_src.append(node(unit.subject))
            graph.edge_dst.append(node(target))
            graph.edge_labels.append(predicate)
            graph.edge_unit_labels.append(label_of[unit.id])
    return graph


ATTRIBUTE_STOPWORDS = STOPWORDS | frozenset(
    "since also still yet though although however maybe anyway oh hey hi hello thanks thank okay ok wow well yeah yes sure "
    "really great good nice awesome cool lol haha hmm sorry please let lets".split()
)
"""Words no attribute edge goes to: a target made of them alone ("since", "it", "Thanks") names nothing."""
COMMON_SHARE, COMMON_MIN_UNITS = 0.5, 4
"""A target named by more than this share of a graph's units (of at least this many) is common to them: no edge to it."""


def common_targets(units: Sequence[MemoryUnit]) -> set[str]:
    """The normalised attribute targets that more than :data:`COMMON_SHARE` of ``units`` name (none under
    :data:`COMMON_MIN_UNITS` units): an edge every unit has tells them apart no more than a stop word does."""
    if len(units) < COMMON_MIN_UNITS:
        return set()
    named = Counter(key for unit in units for key in {normalize_label(t) for _, t in unit_attribute_edges(unit)})
    return {key for key, count in named.items() if count > COMMON_SHARE * len(units)}


def unit_attribute_edges(unit: MemoryUnit) -> list[tuple[str, str]]:
    """``(predicate, target)`` of a unit's attribute edges: ``mentions`` per entity, then ``at`` per location.

    Targets that normalise to nothing, to stop words alone (:data:`ATTRIBUTE_STOPWORDS`), to the subject or the object, or
    to an earlier target are left out.
    """
    seen = {normalize_label(unit.subject), normalize_label(unit.object), ""}
    edges = []
    for predicate, labels in ((MENTIONS, unit.entities), (AT, unit.locations)):
        for label in labels:
            key = normalize_label(label)
            if key not in seen and not set(key.split()) <= ATTRIBUTE_STOPWORDS:
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
