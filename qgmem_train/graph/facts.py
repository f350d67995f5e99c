"""The text path (paper III-D1): a local graph written as labelled facts for backbones without embedding access."""

from __future__ import annotations

from qgmem_train.graph.local_graph import LocalGraph


def graph_facts_text(graph: LocalGraph, first_label: int = 1) -> str:
    """One ``[F<n>] subject | predicate | object`` line per edge, numbered from ``first_label`` in edge order."""
    return "\n".join(f"[F{i}] {s} | {p} | {o}" for i, (s, p, o) in enumerate(graph.triples(), start=first_label))
