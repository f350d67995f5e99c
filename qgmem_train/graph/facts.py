"""The text path (paper III-D1): a local graph written as labelled facts for backbones without embedding access."""

from __future__ import annotations

from qgmem_train.graph.local_graph import LocalGraph


def graph_facts_text(graph: LocalGraph) -> str:
    """One ``[<label>] subject | predicate | object`` line per edge, in edge order, labelled with its unit's MEMORY_CONTEXT
    label (``MU#``/``F#``): a label names one unit whether the memory context is in the prompt or not."""
    if len(graph.edge_unit_labels) != graph.num_edges:
        raise ValueError(f"graph has {graph.num_edges} edges but {len(graph.edge_unit_labels)} edge unit labels")
    return "\n".join(f"[{label}] {s} | {p} | {o}" for label, (s, p, o) in zip(graph.edge_unit_labels, graph.triples()))
