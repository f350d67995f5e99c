"""The store's paged reads that ``serve`` lists with (namespaces by key cursor, units, sessions and a session's turns by
offset), on both backends: each page read by the store alone, never by loading the namespace."""

from __future__ import annotations

from qgmem_train.config import PipelineConfig
from qgmem_train.memory.construct import build_conversation
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.types import Conversation, Session, Turn


def _conversation(sessions: int, turns: int) -> Conversation:
    return Conversation("c", [
        Session(f"S{s}", f"2023-05-0{s + 1}", [Turn(f"S{s}:{t}", "Ann" if t % 2 else "Bo", f"Session {s} turn {t}: I like kite number {t}.") for t in range(turns)])
        for s in range(sessions)
    ])  # fmt: skip


def test_namespaces_page_by_exact_names_and_prefixes_with_a_key_cursor(new_store, minilm) -> None:
    with MemoryStore.open(new_store(), create=True) as store:
        for name in ("a-1", "a-2", "a-3", "b-1", "b-2", "x_1", "xy1"):
            store.ensure_namespace(name, "turns", minilm.model_id, minilm.dim)
        mine = (frozenset({"b-1"}), ("a-", "x_"))
        first = store.namespaces_page(*mine, None, 2)
        second = store.namespaces_page(*mine, first[-1], 2)
        third = store.namespaces_page(*mine, second[-1], 2)
        assert (first, second, third) == (["a-1", "a-2"], ["a-3", "b-1"], ["x_1"])
        assert store.namespaces_page(*mine, "x_1", 2) == [] and store.namespaces_page(frozenset(), (), None, 5) == []
        assert store.has_namespace("xy1") and not store.has_namespace("xy")


def test_units_sessions_and_turns_are_read_a_page_at_a_time(new_store, minilm) -> None:
    cfg = PipelineConfig()
    cfg.construction.units, cfg.construction.traces = "turns", False
    conversation = _conversation(3, 5)
    with MemoryStore.open(new_store(), create=True) as store:
        for session in conversation.sessions:  # a write (a segment) a session
            build_conversation(store, Conversation("c", [session]), cfg, minilm, namespace="ns")
        every = store.units_page("ns", 0, 1000)
        assert sorted(u.id for u in every) == sorted(u.id for u in store.load_namespace("ns").units) and len(every) == store.count_units("ns")
        pages = [store.units_page("ns", offset, 4) for offset in range(0, len(every), 4)]
        assert [u.id for page in pages for u in page] == [u.id for u in every] and all(len(page) <= 4 for page in pages)
        assert every[0].fact_text and every[0].source_turn_ids and store.units_page("ns", len(every), 4) == []

        assert store.count_sessions("ns") == 3
        assert store.sessions_page("ns", 1, 1) == [{"session_id": "S1", "turns": 5, "time": "2023-05-02"}]
        assert store.session_summary("ns", "S2") == {"session_id": "S2", "turns": 5, "time": "2023-05-03"}
        assert store.session_summary("ns", "S9") is None and store.session_turns("ns", "S9") == []
        turns = store.session_turns("ns", "S0")
        assert [t["id"] for t in turns] == [f"S0:{t}" for t in range(5)] and turns[1]["speaker"] == "Ann"
        assert store.session_turns("ns", "S0", 3, 10) == turns[3:] and store.session_turns("ns", "S0", 1, 1) == turns[1:2]

