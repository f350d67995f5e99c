"""Dynamic memory traces on crafted units with real MiniLM embeddings: clustering, order, current state."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qgmem_train.config import PipelineConfig
from qgmem_train.memory.construct import embed_units
from qgmem_train.memory.store import MemoryStore, WindowResult
from qgmem_train.memory.trace_graph import build_trace_graph, linked_components
from qgmem_train.memory.traces import consolidate_traces, members_json, order_members
from qgmem_train.memory.types import MemoryUnit, TimeSpan
from tests.fakes import ScriptedLLM


def _unit(uid: str, serial: int, fact: str, triple: tuple[str, str, str], said: str | None, when: str | None = None) -> MemoryUnit:
    span = [TimeSpan(when, when, "day")] if when else []
    return MemoryUnit(uid, "s", fact, *triple, [uid], fact, said, serial, fact_time=span)


UNITS = [
    _unit("u0", 0, "Alex lives in Lisbon.", ("Alex", "lives in", "Lisbon"), "2023-01-10"),
    _unit("u1", 1, "Bea plays the violin in an orchestra.", ("Bea", "plays", "violin"), "2023-01-10"),
    _unit("u2", 2, "Alex now lives in Madrid after moving there in June 2024.", ("Alex", "lives in", "Madrid"), "2023-02-01", "2024-06-15"),
    _unit("u3", 3, "Alex lives in Porto since March 2023.", ("Alex", "lives in", "Porto"), "2023-03-20", "2023-03-01"),
    _unit("u4", 4, "Carl's favourite food is sushi.", ("Carl", "likes", "sushi"), "2023-03-20"),
]


def _store_with(tmp_path: Path, units: list[MemoryUnit], minilm, cfg: PipelineConfig) -> MemoryStore:
    store = MemoryStore.open(tmp_path / "store", create=True)
    store.ensure_namespace("n", cfg.construction.units, minilm.model_id, minilm.dim)
    store.add_windows("n", [WindowResult("s", 0, embed_units(units, minilm, 16))])
    return store


def test_later_state_becomes_current_and_members_follow_fact_time(tmp_path: Path, minilm) -> None:
    cfg = PipelineConfig()
    prompts: list[str] = []

    def reply(chat) -> str:
        prompts.append(chat[-1]["content"])
        return '{"trajectory": "Alex lived in Lisbon, then Porto, and now lives in Madrid."}'

    with _store_with(tmp_path, UNITS, minilm, cfg) as store:
        assert consolidate_traces(store, "n", cfg, ScriptedLLM(reply)) == 1
        memory = store.load_namespace("n")
        assert not store.traces_stale("n")
    (trace,) = memory.traces
    assert trace.member_ids == ["u0", "u3", "u2"]  # fact time, not turn order
    assert trace.current_id == "u2" and trace.relation_text == "Alex lives in"
    assert trace.trajectory.endswith("now lives in Madrid.")
    assert memory.trace_of == {"u0": trace.id, "u3": trace.id, "u2": trace.id}
    (prompt,) = prompts
    assert "RELATION: Alex lives in" in prompt
    assert prompt.index('"u0"') < prompt.index('"u3"') < prompt.index('"u2"') and '"time": "2024-06-15"' in prompt


def test_consolidation_is_incremental_and_falls_back_to_rule_trajectory(tmp_path: Path, minilm) -> None:
    cfg = PipelineConfig()
    with _store_with(tmp_path, UNITS[:4], minilm, cfg) as store:
        consolidate_traces(store, "n", cfg, ScriptedLLM(["no json at all", "still none"]))
        (first,) = store.load_traces("n")
        assert first.trajectory.endswith("(latest)") and first.current_id == "u2"  # dropped output -> rule trajectory
        llm = ScriptedLLM(lambda chat: '{"trajectory": "unused"}')
        store.add_windows("n", [WindowResult("s", 1, embed_units(UNITS[4:], minilm, 16))])
        assert store.traces_stale("n")
        consolidate_traces(store, "n", cfg, llm)
        assert llm.calls == [] and store.load_traces("n") == [first]  # the new unit touched no cluster


def test_threshold_neighbours_and_serial_order_without_times(minilm) -> None:
    relations = minilm.encode(["Alex lives in", "Alex lives in", "Bea plays", "Alex resides in"])
    facts = minilm.encode(["Alex lives in Lisbon", "Alex lives in Porto", "Bea plays violin", "Alex resides in Rome"])
    cos = float(relations[0] @ relations[3])
    clusters = lambda neighbours, threshold: [c.tolist() for c in linked_components(build_trace_graph(facts, relations, neighbours, threshold), None, 2)]  # noqa: E731
    assert clusters(20, 0.80) == ([[0, 1, 3]] if cos >= 0.80 else [[0, 1]])
    assert clusters(20, 1.01) == []
    assert clusters(0, 0.0) == []
    undated = [_unit("a", 5, "x", ("A", "is", "x"), None), _unit("b", 2, "y", ("A", "is", "y"), None)]
    assert [u.id for u in order_members(undated)] == ["b", "a"]
    assert '"time": "serial-2"' in members_json(order_members(undated))
    np.testing.assert_allclose(np.linalg.norm(facts, axis=1), 1.0, atol=1e-5)
