"""The local-graph structure measurement (``python -m experiments.graph_token.structure``): the shape of a local graph
(components ignore direction; meeting nodes need two edges in)."""

from __future__ import annotations

from experiments.graph_token.structure import graph_shape
from qgmem_train.graph.local_graph import LocalGraph


def test_graph_shape_counts_components_and_meeting_nodes() -> None:
    # two stars (A -> x, A -> y; B -> z) joined only when B also points at x
    apart = LocalGraph(["A", "x", "y", "B", "z"], [0, 0, 3], [1, 2, 4], ["p", "p", "p"])
    assert graph_shape(apart) == {"nodes": 5, "edges": 3, "components": 2, "largest_component_nodes": 3, "meeting_nodes": 0}
    joined = LocalGraph(["A", "x", "y", "B", "z"], [0, 0, 3, 3], [1, 2, 4, 1], ["p", "p", "p", "mentions"])
    assert graph_shape(joined) == {"nodes": 5, "edges": 4, "components": 1, "largest_component_nodes": 5, "meeting_nodes": 1}
    assert graph_shape(LocalGraph())["components"] == 0
