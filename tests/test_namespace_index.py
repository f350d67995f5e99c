"""A namespace's search index lives as long as the namespace: another namespace's delete leaves it in place, its own
delete ends it (even when the namespace is written again to the same write count). On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from qgmem_train.config import PipelineConfig
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


@pytest.fixture
def index_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The namespace of every search index built from here on."""
    built: list[str] = []

    class Counted(activation.ActivationIndex):
        def __init__(self, memory, *args, **kwargs) -> None:
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


def test_a_write_to_the_namespace_rebuilds_its_index(new_store, minilm, index_builds) -> None:
    predictor = _predictor(minilm)
    with predictor.memory("alice", new_store()) as alice:
        alice.add_session([{"speaker": "Alice", "text": SECRET}], session_id="A1")
        alice.search(QUESTION)
        alice.search(QUESTION)
        assert index_builds == ["alice"]
        alice.add_session([{"speaker": "Alice", "text": "I moved the locker to the Quorvex gym."}], session_id="A2")
        assert "Quorvex" in alice.search("Which gym is the locker at?").memory_context
    assert index_builds == ["alice", "alice"]
