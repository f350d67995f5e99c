"""Deleting a namespace: nothing of it is left in the store's files, and the other namespaces are untouched, their search
indexes included (a namespace's index lives as long as the namespace, on SQLite and PostgreSQL alike)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qgmem_train.config import PipelineConfig
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.trace_graph_file import graph_path
from qgmem_train.predictor import QGMemPredictor
from qgmem_train.retrieval import activation
from tests.fakes import ScriptedLLM

SECRET = "My locker code at the Zorblatt gym is 4417."
QUESTION = "What is the locker code?"


def _predictor(minilm) -> QGMemPredictor:
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.device = "none", "cpu"
    cfg.construction.units, cfg.construction.traces = "turns", False
    return QGMemPredictor(None, cfg, llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")


def _store_bytes(root: Path) -> bytes:
    """Every file of the store folder, concatenated (the SQLite file, its WAL, sidecars, caches)."""
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file())


def test_deleting_a_namespace_leaves_nothing_of_it_in_any_file(minilm, tmp_path) -> None:
    predictor = _predictor(minilm)
    root = tmp_path / "store"
    with predictor.memory("alice", root) as alice, predictor.memory("bob", root) as bob:
        alice.add_session([{"speaker": "Alice", "text": SECRET}], session_id="A1")
        bob.add_session([{"speaker": "Bob", "text": "I adopted a cat named Miso."}], session_id="B1")
        graph_path(root, "alice").parent.mkdir(exist_ok=True)
        graph_path(root, "alice").write_bytes(b"cached graph")
        alice_vectors = alice.store.load_namespace("alice").fact_embeddings[0].tobytes()
    assert SECRET.encode() in _store_bytes(root) and alice_vectors in _store_bytes(root)
    vector_files = set((root / "vectors").iterdir())
    with MemoryStore.open(root) as store:
        store._db.execute("PRAGMA secure_delete=0")  # SQLite's own default (some builds, Debian's among them, turn it on)
        assert store.delete_namespace("alice") is True
        assert store._db.execute("PRAGMA secure_delete").fetchone()[0] == 0
        assert store.delete_namespace("alice") is False
        assert store.namespaces() == ["bob"]
        assert store.load_namespace("bob").units[0].fact_text == "Bob: I adopted a cat named Miso."
    left = _store_bytes(root)
    assert SECRET.encode() not in left and b"Zorblatt" not in left and alice_vectors not in left
    assert not graph_path(root, "alice").exists() and len(set((root / "vectors").iterdir())) < len(vector_files)
    with predictor.memory("alice", root) as again:
        again.add_session([{"speaker": "Alice", "text": "A fresh start."}], session_id="A1")
        assert [u.fact_text for u in again.store.load_namespace("alice").units] == ["Alice: A fresh start."]


def test_a_handle_does_not_answer_from_a_namespace_another_process_deleted_and_wrote_again(minilm, tmp_path) -> None:
    """Deleted and rewritten with as many writes, the namespace's write count is the same: the cached index must still go."""
    predictor = _predictor(minilm)
    root = tmp_path / "store"
    with predictor.memory("alice", root) as server, predictor.memory("alice", root) as other:
        server.add_session([{"speaker": "Alice", "text": SECRET}], session_id="A1")
        assert "Zorblatt" in server.search("What is the locker code?").memory_context
        before = server.store.generation("alice")
        assert other.store.delete_namespace("alice")
        other.add_session([{"speaker": "Alice", "text": "I have no locker anymore."}], session_id="A1")
        assert other.store.generation("alice") == before
        context = server.search("What is the locker code?").memory_context
    assert "Zorblatt" not in context and "no locker anymore" in context


@pytest.fixture
def index_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The namespace of every search index built whole from here on (not grown from a previous one)."""
    built: list[str] = []

    class Counted(activation.ActivationIndex):
        def __init__(self, memory, *args, **kwargs) -> None:
            if kwargs.get("previous") is None:
                built.append(memory.namespace)
            super().__init__(memory, *args, **kwargs)

    monkeypatch.setattr(activation, "ActivationIndex", Counted)
    return built


def test_another_namespaces_delete_leaves_the_index_and_its_own_delete_ends_it(new_store, minilm, index_builds) -> None:
    location = new_store()
    predictor = _predictor(minilm)
    with predictor.memory("alice", location) as alice, predictor.memory("bob", location) as bob:
        alice.add_session([{"speaker": "Alice", "text": SECRET}], session_id="A1")
        bob.add_session([{"speaker": "Bob", "text": "I adopted a cat named Miso."}], session_id="B1")
        first = alice.search(QUESTION).memory_context
        assert index_builds == ["alice"] and "Zorblatt" in first

        assert bob.store.delete_namespace("bob")
        assert alice.search(QUESTION).memory_context == first
        assert index_builds == ["alice"]  # no rebuild: bob's delete is not alice's change

        before = alice.store.version("alice")
        assert bob.store.delete_namespace("alice")
        bob_on_alice = predictor.memory("alice", location)
        bob_on_alice.add_session([{"speaker": "Alice", "text": "I have no locker anymore."}], session_id="A1")
        bob_on_alice.close()
        after = alice.store.version("alice")
        assert after[1] == before[1] and after[0] != before[0]  # as many writes, another incarnation
        context = alice.search(QUESTION).memory_context
    assert "Zorblatt" not in context and "no locker anymore" in context
    assert index_builds == ["alice", "alice"]


def test_an_add_to_the_namespace_grows_its_index(new_store, minilm, index_builds) -> None:
    predictor = _predictor(minilm)
    with predictor.memory("alice", new_store()) as alice:
        alice.add_session([{"speaker": "Alice", "text": SECRET}], session_id="A1")
        alice.search(QUESTION)
        alice.search(QUESTION)
        assert index_builds == ["alice"]
        alice.add_session([{"speaker": "Alice", "text": "I moved the locker to the Quorvex gym."}], session_id="A2")
        assert "Quorvex" in alice.search("Which gym is the locker at?").memory_context
        assert alice.index.appends == 1
    assert index_builds == ["alice"]
