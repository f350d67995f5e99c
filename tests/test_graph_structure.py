"""bench/graph_structure.py: the shape of a local graph (components ignore direction; meeting nodes need two edges in)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from qgmem_train.graph.local_graph import LocalGraph

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("graph_structure")


def test_graph_shape_counts_components_and_meeting_nodes(bench: ModuleType) -> None:
    # two stars (A -> x, A -> y; B -> z) joined only when B also points at x
    apart = LocalGraph(["A", "x", "y", "B", "z"], [0, 0, 3], [1, 2, 4], ["p", "p", "p"])
    assert bench.graph_shape(apart) == {"nodes": 5, "edges": 3, "components": 2, "largest_component_nodes": 3, "meeting_nodes": 0}
    joined = LocalGraph(["A", "x", "y", "B", "z"], [0, 0, 3, 3], [1, 2, 4, 1], ["p", "p", "p", "mentions"])
    assert bench.graph_shape(joined) == {"nodes": 5, "edges": 4, "components": 1, "largest_component_nodes": 5, "meeting_nodes": 1}
    assert bench.graph_shape(LocalGraph())["components"] == 0
