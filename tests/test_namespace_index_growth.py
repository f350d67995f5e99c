"""A namespace's search index grows with its adds: after an add here or by another handle on the store, the grown index
ranks every question exactly as an index built from scratch (BM25 idf and lengths moved with the new units), and only
another incarnation (a delete, a unit written again) builds it whole. Real MiniLM, a real SQLite store of LoCoMo turns."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.config import PipelineConfig
from qgmem_train.memory.construct import embed_units
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.store import WindowResult
from qgmem_train.pipeline import NamespaceIndex
from qgmem_train.pipeline.search import activate_question
from qgmem_train.predictor import QGMemPredictor
from qgmem_train.text import tokenize
from tests.fakes import ScriptedLLM

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "locomo_sample.json"
QUESTIONS = (
    "When did Caroline go to the LGBTQ support group?",
    "What did Melanie paint recently?",
    "What is Caroline's identity?",
    "Where did Melanie go camping with her family?",
)


def _predictor(minilm) -> QGMemPredictor:
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.device = "none", "cpu"
    cfg.construction.units, cfg.construction.traces = "turns", False
    return QGMemPredictor(None, cfg, llm=ScriptedLLM([]), embedder=minilm, reranker=None, intent="rules")


@pytest.fixture(scope="module")
def sessions():
    """The LoCoMo sample's four sessions."""
    return load_conversations("locomo", SAMPLE)[0].sessions


def _add(memory, session) -> None:
    memory.add_session(session.turns, time=session.time, session_id=session.id)


def _searched(memory, session) -> None:
    """``session`` added and a search made: the memory holds its index."""
    _add(memory, session)
    memory.search(QUESTIONS[0])


def _rankings(index: NamespaceIndex) -> list[tuple]:
    """Every channel's list, the fused and final orders with their scores, and the BM25 scores of every unit, per question."""
    memory, activation = index.current()
    found = []
    for question in QUESTIONS:
        wm = activate_question(question, None, memory, activation, index.models)
        found.append((wm.channels, wm.fused, wm.reranked, wm.scores, activation.bm25.scores(tokenize(question)).tolist()))
    return found


def test_an_add_grows_the_index_to_what_a_build_from_scratch_ranks(minilm, tmp_path, sessions) -> None:
    predictor = _predictor(minilm)
    root = tmp_path / "store"
    with predictor.memory("conv", root) as memory, predictor.memory("conv", root) as other:
        for session in sessions[:2]:
            _add(memory, session)
        before = _rankings(memory.index)
        held = memory.index.current()[1]
        assert (memory.index.builds, memory.index.appends) == (1, 0)

        _add(memory, sessions[2])  # an add here grows the index held, before the next search
        assert (memory.index.builds, memory.index.appends) == (1, 1)
        grown = memory.index.current()[1]
        assert len(grown.memory.units) > len(held.memory.units)
        assert memory.index.current()[1] is grown  # the next search reads it as grown

        _add(other, sessions[3])  # another handle's add: this one's index notices it at its next search
        after = _rankings(memory.index)
        assert (memory.index.builds, memory.index.appends) == (1, 2)

        fresh = NamespaceIndex(memory.store, "conv", predictor.models)
        assert after == _rankings(fresh) and fresh.builds == 1
        assert len(fresh.current()[0].units) == len(memory.index.current()[0].units)
        old_scores, new_scores = np.array(before[0][4]), np.array(after[0][4][: len(before[0][4])])
        assert not np.array_equal(old_scores, new_scores)  # the old units' BM25 scores moved with the corpus (idf, mean length)
        assert any(uid not in before[0][1] for uid in after[0][1])  # new units reach the fused pool


def test_a_unit_written_again_builds_the_index_whole(minilm, tmp_path, sessions) -> None:
    predictor = _predictor(minilm)
    with predictor.memory("conv", tmp_path / "store") as memory:
        _searched(memory, sessions[0])
        version = memory.store.version("conv")
        unit = memory.index.current()[0].units[0]
        rewritten = dataclasses.replace(unit, fact_text="Caroline: I keep a pet iguana named Zorblatt.")
        memory.store.add_windows("conv", [WindowResult(sessions[0].id, 0, embed_units([rewritten], minilm, 8))])
        assert memory.store.version("conv")[0] != version[0]  # another incarnation: the namespace did not only grow
        assert "Zorblatt" in memory.search("Which pet does Caroline keep?").memory_context
        assert (memory.index.builds, memory.index.appends) == (2, 0)


def test_a_delete_still_drops_the_grown_index(minilm, tmp_path, sessions) -> None:
    predictor = _predictor(minilm)
    root = tmp_path / "store"
    with predictor.memory("conv", root) as memory, predictor.memory("conv", root) as other:
        _searched(memory, sessions[0])
        _add(memory, sessions[1])
        assert other.store.delete_namespace("conv")
        other.add_session([{"speaker": "Caroline", "text": "I keep a pet iguana named Zorblatt."}], session_id="Z1")
        context = memory.search("Which pet does Caroline keep?").memory_context
        assert "Zorblatt" in context and "LGBTQ" not in context
        assert (memory.index.builds, memory.index.appends) == (2, 1)


def test_searches_on_other_threads_while_adds_grow_the_index(minilm, tmp_path, sessions) -> None:
    """As in ``serve``: searches on worker threads read the index they were handed while an add grows it."""
    predictor = _predictor(minilm)
    with predictor.memory("conv", tmp_path / "store") as memory:
        _searched(memory, sessions[0])
        stop, errors, searched = threading.Event(), [], []

        def searching() -> None:
            while not stop.is_set():
                try:
                    searched.append(len(memory.search(QUESTIONS[0]).units))
                except Exception as exc:  # noqa: BLE001 - any error of a search is the failure reported
                    errors.append(exc)
                    return

        workers = [threading.Thread(target=searching) for _ in range(2)]
        for worker in workers:
            worker.start()
        try:
            for session in sessions[1:3]:  # as serve adds: one transaction, which a search or the add's end grows the index by
                memory.add_session(session.turns, time=session.time, session_id=session.id, whole=True)
        finally:
            stop.set()
            for worker in workers:
                worker.join()
        assert not errors and searched
        assert (memory.index.builds, memory.index.appends) == (1, 2)
        assert _rankings(memory.index) == _rankings(NamespaceIndex(memory.store, "conv", predictor.models))


def test_an_add_whose_index_cannot_grow_still_succeeds_and_the_next_search_builds_it(minilm, tmp_path, sessions, monkeypatch) -> None:
    predictor = _predictor(minilm)
    with predictor.memory("conv", tmp_path / "store") as memory:
        _searched(memory, sessions[0])

        def unreadable(held):
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(memory.store, "load_additions", unreadable)
        report = memory.add_session(sessions[1].turns, time=sessions[1].time, session_id=sessions[1].id)
        assert report.units > 0 and memory.index.appends == 0
        monkeypatch.undo()
        assert any(u.cited is False for u in memory.search(QUESTIONS[1]).units)
        assert (memory.index.builds, memory.index.appends) == (2, 0)


def test_a_deleted_session_leaves_the_index_held_by_another_handle(minilm, tmp_path, sessions) -> None:
    """A session deleted (by this handle or another) takes its units out of the index at the next search: the index
    holding them is never grown, but built again, and ranks as a build from scratch."""
    predictor = _predictor(minilm)
    root = tmp_path / "store"
    with predictor.memory("conv", root) as memory, predictor.memory("conv", root) as other:
        for session in sessions[:3]:
            _add(memory, session)
        memory.search(QUESTIONS[0])
        assert other.delete_session(sessions[2].id)
        held = memory.index.current()[0]
        gone = sessions[2].id
        assert not [u for u in held.units if u.session_id == gone]
        assert _rankings(memory.index) == _rankings(NamespaceIndex(memory.store, "conv", predictor.models))


def test_turns_appended_to_a_session_rank_as_a_build_from_scratch(minilm, tmp_path, sessions) -> None:
    """An append rebuilds the session's last window (its old units go): the index held ranks as one built from scratch."""
    predictor = _predictor(minilm)
    root = tmp_path / "store"
    first, second = sessions[0], sessions[1]
    with predictor.memory("conv", root) as memory, predictor.memory("conv", root) as other:
        _add(memory, second)
        memory.add_session(first.turns[:7], time=first.time, session_id=first.id)
        memory.search(QUESTIONS[0])
        other.append_turns(first.id, first.turns[7:])
        assert _rankings(memory.index) == _rankings(NamespaceIndex(memory.store, "conv", predictor.models))
        memory.append_turns(second.id, [{"speaker": "Caroline", "text": "I keep a pet iguana named Zorblatt."}])
        assert _rankings(memory.index) == _rankings(NamespaceIndex(memory.store, "conv", predictor.models))
        assert "Zorblatt" in memory.search("Which pet does Caroline keep?").memory_context
