"""One session of a namespace appended to and deleted, on SQLite and PostgreSQL (``new_store``): an appended session is
the session built whole, a deleted one leaves nothing of it, and a failed append leaves the session as it was."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.memory.construct import embed_units
from qgmem_train.memory.store import MemoryStore, WindowResult
from qgmem_train.memory.types import MemoryUnit
from qgmem_train.predictor import QGMemPredictor
from tests.fakes import ScriptedLLM
from tests.test_session_retry import ENV, ROOT

TURNS = [{"id": f"s1:{n}", "speaker": "Alex" if n % 2 else "Assistant", "text": f"Line {n}: I walked Biscuit to park number {n}."} for n in range(1, 13)]
OTHER = [{"id": f"s2:{n}", "speaker": "Alex", "text": f"I moved to the Porto office, note {n}."} for n in range(1, 4)]


def _predictor(minilm, traces: bool = False) -> QGMemPredictor:
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.device = "none", "cpu"
    cfg.construction.units, cfg.construction.traces = "turns", traces
    return QGMemPredictor(None, cfg, llm=ScriptedLLM(lambda chat: "{\"trajectory\": \"\"}"), embedder=minilm, reranker=None, intent="rules")


def _session_view(store: MemoryStore, namespace: str) -> tuple:
    """What a session is to a reader: units (id, fact, source turns), turns in order and each turn's previous one."""
    memory = store.load_namespace(namespace)
    units = sorted((u.id, u.session_id, u.fact_text, tuple(u.source_turn_ids)) for u in memory.units)
    turns = {sid: [t["id"] for t in store.session_turns(namespace, sid)] for sid in ("s1", "s2")}
    return units, turns, dict(memory.previous_turn), sorted(store.done_windows(namespace))


def test_a_session_appended_to_is_the_session_added_whole(new_store, minilm) -> None:
    predictor = _predictor(minilm)
    with predictor.memory("alex", new_store()) as grown, predictor.memory("alex", new_store()) as whole:
        grown.add_session(TURNS[:7], time="2024-03-02", session_id="s1", whole=True)  # windows 0 (turns 1-6) and 1 (turn 7 alone)
        grown.add_session(OTHER, time="2024-04-15", session_id="s2", whole=True)
        report = grown.append_turns("s1", TURNS[7:])
        assert (report.windows_built, report.units) == (2, 6)  # window 1 again (turns 7-10), window 2 (11-12)
        assert grown.append_turns("s1", TURNS[7:]).windows_built == 0  # the same turns again: a retry appends nothing
        whole.add_session(TURNS, time="2024-03-02", session_id="s1", whole=True)
        whole.add_session(OTHER, time="2024-04-15", session_id="s2", whole=True)
        assert _session_view(grown.store, "alex") == _session_view(whole.store, "alex")
        assert grown.store.session_summary("alex", "s1") == {"session_id": "s1", "turns": 12, "time": "2024-03-02"}
        assert "park number 12" in grown.search("Where did I walk Biscuit?", top_k=50).memory_context


def test_appending_to_a_session_not_stored_or_with_a_changed_turn_is_refused_and_changes_nothing(new_store, minilm) -> None:
    predictor = _predictor(minilm)
    with predictor.memory("alex", new_store()) as memory:
        memory.add_session(TURNS[:3], time="2024-03-02", session_id="s1", whole=True)
        before = _session_view(memory.store, "alex")
        with pytest.raises(InputError, match="session s9: not stored"):
            memory.append_turns("s9", TURNS[3:])
        with pytest.raises(InputError, match="turn s1:1: already stored with other content"):
            memory.append_turns("s1", [{**TURNS[0], "text": "changed"}, TURNS[3]])
        assert _session_view(memory.store, "alex") == before


def test_an_append_that_fails_mid_build_leaves_the_session_as_it_was(new_store, minilm, monkeypatch) -> None:
    predictor = _predictor(minilm)
    with predictor.memory("alex", new_store()) as memory:
        memory.add_session(TURNS[:7], time="2024-03-02", session_id="s1", whole=True)
        before = _session_view(memory.store, "alex")

        def dies(*args, **kwargs):
            raise RuntimeError("killed while embedding")

        monkeypatch.setattr("qgmem_train.memory.construct.embed_units", dies)
        with pytest.raises(RuntimeError, match="killed"):
            memory.append_turns("s1", TURNS[7:])
        assert _session_view(memory.store, "alex") == before


def test_a_window_built_again_drops_the_units_it_no_longer_makes(new_store, minilm) -> None:
    def unit(uid: str, turn: str) -> MemoryUnit:
        return MemoryUnit(uid, "s", f"fact {uid}", "Alex", "says", "x", [turn], "text", None, 0)

    with MemoryStore.open(new_store(), create=True) as store:
        store.ensure_namespace("n", "llm", minilm.model_id, minilm.dim, window=6, overlap=2)
        store.add_windows("n", [WindowResult("s", 0, embed_units([unit("t0#0", "t0")], minilm, 8), 0, frozenset({"t0"})),
                                WindowResult("s", 1, embed_units([unit("t1#0", "t1"), unit("t1#1", "t1")], minilm, 8), 0, frozenset({"t1"}))])  # fmt: skip
        store.add_windows("n", [WindowResult("s", 1, embed_units([unit("t1#0", "t2")], minilm, 8), 0, frozenset({"t1", "t2"}))])
        assert sorted(u.id for u in store.load_namespace("n").units) == ["t0#0", "t1#0"]
        assert store.count_units("n") == 2


def test_deleting_a_session_leaves_nothing_of_it_and_the_rest_as_it_was(new_store, minilm) -> None:
    predictor = _predictor(minilm, traces=True)
    with predictor.memory("alex", new_store()) as memory, predictor.memory("alex", new_store()) as without:
        memory.add_session(TURNS, time="2024-03-02", session_id="s1", whole=True)
        memory.add_session(OTHER, time="2024-04-15", session_id="s2", whole=True)
        assert any("s1:" in m for t in memory.store.load_traces("alex") for m in t.member_ids)
        assert memory.delete_session("s1") is True
        assert memory.delete_session("s1") is False
        without.add_session(OTHER, time="2024-04-15", session_id="s2", whole=True)
        assert _session_view(memory.store, "alex") == _session_view(without.store, "alex")
        assert memory.store.count_units("alex") == len(OTHER) and memory.store.count_sessions("alex") == 1
        assert [t.member_ids for t in memory.store.load_traces("alex")] == [t.member_ids for t in without.store.load_traces("alex")]
        assert "Biscuit" not in memory.search("Where did I walk Biscuit?", top_k=50).memory_context
        assert memory.store.namespaces() == ["alex"]


_KILLED_APPEND = """
import json, os, signal, sys
from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig
from qgmem_train.llm.embedder import Embedder
from qgmem_train.memory.store import MemoryStore
from qgmem_train.predictor import QGMemPredictor
from tests.fakes import ScriptedLLM

_add_windows = MemoryStore._add_windows

def _write_then_die(self, db, namespace, results):
    _add_windows(self, db, namespace, results)
    os.kill(os.getpid(), signal.SIGKILL)  # the turns and units are written in the append's transaction, not committed

MemoryStore._add_windows = _write_then_die
cfg = PipelineConfig()
cfg.models.device, cfg.construction.units, cfg.construction.traces = "cpu", "turns", False
predictor = QGMemPredictor(None, cfg, llm=ScriptedLLM([]), embedder=Embedder(BUNDLED_EMBEDDER, device="cpu"), reranker=None, intent="rules")
with predictor.memory("alex", sys.argv[1]) as memory:
    memory.append_turns("s1", json.loads(sys.argv[2]))
"""


def test_an_append_killed_before_it_commits_leaves_the_session_as_it_was_and_its_retry_appends_once(new_store, minilm) -> None:
    predictor = _predictor(minilm)
    store = new_store()
    with predictor.memory("alex", store) as memory:
        memory.add_session(TURNS[:7], time="2024-03-02", session_id="s1", whole=True)
        before = _session_view(memory.store, "alex")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED_APPEND), str(store), json.dumps(TURNS[7:])], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    with predictor.memory("alex", store) as memory, predictor.memory("alex", new_store()) as whole:
        assert _session_view(memory.store, "alex") == before
        assert memory.append_turns("s1", TURNS[7:]).windows_built == 2
        whole.add_session(TURNS, time="2024-03-02", session_id="s1", whole=True)
        assert _session_view(memory.store, "alex") == _session_view(whole.store, "alex")
