"""Many writers on one store: processes and threads adding sessions at once, a locked store, and caches that see other writers.

Writers are slowed inside or before each write transaction (a scheduling delay, injected) so that their
reads and writes interleave on every run rather than by chance.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from qgmem_train.__main__ import main
from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.memory.store import STORE_FILE, MemoryStore
from qgmem_train.memory.store_file import StoreLockedError
from qgmem_train.memory.traces import consolidate_traces
from qgmem_train.memory.types import session_fingerprint
from qgmem_train.predictor import QGMemPredictor
from tests.fakes import ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TRAJECTORY = '{"trajectory": "earlier, then later"}'
ANSWER = json.dumps({"reasoning_path": "[F1] says so.", "answer": "yes"})
PLACES = ["harbour", "museum", "old town", "market", "castle", "beach", "bridge", "park"]


def _session(writer: str, k: int) -> dict:
    """Eight turns (two windows): the writer's own trips, so its units link into traces."""
    turns = [{"speaker": writer if i % 2 == 0 else "Sam", "text": f"I went to the {p} with {writer} on trip {k}, day {i}."} for i, p in enumerate(PLACES)]
    return {"time": f"2024-05-{10 + k:02d}", "turns": turns}


def _cfg() -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.models.device, cfg.construction.units, cfg.construction.window_batch_size = "cpu", "turns", 1
    return cfg


def _predictor(embedder) -> QGMemPredictor:
    """A text-path predictor whose scripted LLM writes trajectories and answers."""
    llm = ScriptedLLM(lambda chat: TRAJECTORY if "RELATION:" in chat[-1]["content"] else ANSWER)
    return QGMemPredictor(None, _cfg(), llm=llm, embedder=embedder, reranker=None, intent="rules")


@contextmanager
def _late_transactions():
    """Every store transaction of this process starts 0.1 s late (a scheduling delay), so two writers' transactions interleave."""
    enter = MemoryStore.transaction

    @contextmanager
    def late(self, namespace=None):
        time.sleep(0.1)
        with enter(self, namespace) as db:
            yield db

    MemoryStore.transaction = late
    try:
        yield
    finally:
        MemoryStore.transaction = enter


def write_plan(store_dir: str | Path, plan: list, embedder, ready: Path, go: Path) -> None:
    """Mark ``ready`` once the embedder is warm, wait for ``go``, then add each (namespace, session) of ``plan`` in order,
    every transaction late."""
    embedder.encode(["warm up"])
    predictor = QGMemPredictor(None, _cfg(), llm=ScriptedLLM(lambda chat: TRAJECTORY), embedder=embedder, reranker=None, intent="rules")
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    with _late_transactions():
        for namespace, session in plan:
            with predictor.memory(namespace, store_dir) as memory:
                memory.add_session(session["turns"], time=session["time"])


_WRITER = """
import json, sys
from pathlib import Path
from qgmem_train.config import BUNDLED_EMBEDDER
from qgmem_train.llm.embedder import Embedder
from tests.test_store_concurrency import write_plan

write_plan(sys.argv[1], json.loads(sys.argv[2]), Embedder(BUNDLED_EMBEDDER, device="cpu"), Path(sys.argv[3]), Path(sys.argv[4]))
"""
"""A writer process of its own: :func:`write_plan` over the arguments (store, plan as JSON, ready and go files)."""


def _check_namespace(store: MemoryStore, namespace: str, sessions: list[dict]) -> None:
    """Every session once, turn positions distinct and in session order, one unit per turn, traces current."""
    memory = store.load_namespace(namespace)
    ids = {session_fingerprint(s["turns"], s["time"]): s for s in sessions}
    session_of = {u.source_turn_ids[0]: u.session_id for u in memory.units}
    stored = Counter((session_of[t.id], t.text) for t in memory.turns.values())
    assert stored == Counter((sid, t["text"]) for sid, s in ids.items() for t in s["turns"]) and max(stored.values()) == 1
    positions = store._db.execute("SELECT position FROM turns WHERE namespace = ?", (namespace,)).fetchall()
    assert sorted(p for (p,) in positions) == list(range(len(positions)))
    for sid, session in ids.items():
        order = [t.text for t in memory.turns.values() if session_of[t.id] == sid]
        assert order == [t["text"] for t in session["turns"]]
    serial = {t_id: i for i, t_id in enumerate(memory.turns)}
    assert all(u.serial == serial[u.source_turn_ids[0]] for u in memory.units)
    assert len(store.done_windows(namespace)) == 2 * len(sessions) and not store.traces_stale(namespace)
    recording = ScriptedLLM(lambda chat: TRAJECTORY)
    assert consolidate_traces(store, namespace, _cfg(), recording) == len(memory.traces) > 0
    assert recording.calls == [] and store.load_traces(namespace) == memory.traces  # traces match the final units


@pytest.mark.slow
def test_two_processes_add_sessions_to_one_namespace_and_to_their_own_at_once(tmp_path: Path, new_store, minilm) -> None:
    """Alex writes from a process of its own, Bea from this one (a thread, so that this process can give the signal to go)."""
    store_dir = new_store()
    MemoryStore.open(store_dir, create=True).close()
    plans = {w: [(ns, _session(w, k)) for k in range(3) for ns in ("shared", f"own-{w}")] for w in ("Alex", "Bea")}
    ready, go = {w: tmp_path / f"ready-{w}" for w in plans}, tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(store_dir), json.dumps(plans["Alex"]), str(ready["Alex"]), str(go)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    errors: list[BaseException] = []

    def bea() -> None:
        try:
            write_plan(store_dir, plans["Bea"], minilm, ready["Bea"], go)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    here = threading.Thread(target=bea)
    here.start()
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready.values()) and time.monotonic() < deadline and proc.poll() is None and here.is_alive():
        time.sleep(0.05)
    go.touch()
    here.join(timeout=600)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert errors == [] and not here.is_alive()
    with MemoryStore.open(store_dir) as store:
        assert store.namespaces() == ["own-Alex", "own-Bea", "shared"]
        _check_namespace(store, "shared", [s for plan in plans.values() for ns, s in plan if ns == "shared"])
        for w, plan in plans.items():
            _check_namespace(store, f"own-{w}", [s for ns, s in plan if ns != "shared"])


def test_threads_sharing_one_predictor_memory_add_and_ask_at_once(tmp_path: Path, minilm, monkeypatch) -> None:
    enter = MemoryStore.transaction

    @contextmanager
    def slow_transaction(self, namespace=None):
        with enter(self, namespace) as db:
            time.sleep(0.02)
            yield db

    monkeypatch.setattr(MemoryStore, "transaction", slow_transaction)
    sessions = {w: [_session(w, k) for k in range(2)] for w in ("Alex", "Bea", "Cy")}
    errors: list[BaseException] = []
    answers: list = []
    with _predictor(minilm).memory("shared", tmp_path / "store") as memory:
        memory.add_session(_session("Dee", 0)["turns"], time=_session("Dee", 0)["time"])

        def run(work) -> None:
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        def writer(w: str):
            return lambda: [memory.add_session(s["turns"], time=s["time"]) for s in sessions[w]]

        def reader():
            return lambda: answers.extend(memory.ask("Where did Bea go?") for _ in range(4))

        threads = [threading.Thread(target=run, args=(writer(w),)) for w in sessions] + [threading.Thread(target=run, args=(reader(),))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        assert errors == [] and len(answers) == 4 and all(a.answer == "yes" and a.units for a in answers)
        _check_namespace(memory.store, "shared", [_session("Dee", 0), *(s for ss in sessions.values() for s in ss)])


def test_a_store_locked_past_busy_timeout_is_one_clear_line(tmp_path: Path, capsys) -> None:
    store_dir = tmp_path / "store"
    MemoryStore.open(store_dir, create=True).close()
    holder = sqlite3.connect(store_dir / STORE_FILE, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with MemoryStore.open(store_dir, busy_timeout=0.2) as store, pytest.raises(StoreLockedError, match="locked by another writer") as info:
            store.ensure_namespace("n", "turns", "some-embedder", 4)
        assert isinstance(info.value, InputError)
        config = tmp_path / "cfg.yaml"
        config.write_text("pipeline:\n  construction:\n    traces: false\n")
        args = ["build", "--dataset", "jsonl", "--input", str(ROOT / "samples" / "plain_chat.jsonl"), "--store", str(store_dir), "--units", "turns"]
        assert main([*args, "--config", str(config), "--busy-timeout", "0.2"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines()[-1].startswith("error: ") and "locked by another writer" in err and "Traceback" not in err  # after the progress bar
    finally:
        holder.execute("ROLLBACK")
        holder.close()


_REWRITE = """
import sys
from dataclasses import replace
from qgmem_train.memory.store import EmbeddedUnit, MemoryStore, WindowResult

with MemoryStore.open(sys.argv[1]) as store:
    memory = store.load_namespace("alex", relations=True)
    relations = memory.relation_embeddings
    units = []
    for row, unit in enumerate(memory.units):
        if unit.id in sys.argv[2:]:
            attrs = memory.attributes.unit_embeddings(row)
            units.append(EmbeddedUnit(replace(unit, fact_text="Alex went to the lighthouse."), memory.fact_embeddings[row], relations[row], attrs))
    store.add_windows("alex", [WindowResult(units[0].unit.session_id, 1, units)])
    store.put_traces("alex", [replace(t, trajectory="rewritten elsewhere") for t in store.load_traces("alex")])
"""


def test_the_predictor_cache_sees_units_and_traces_rewritten_by_another_process(tmp_path: Path, minilm) -> None:
    session = _session("Alex", 0)
    with _predictor(minilm).memory("alex", tmp_path / "store") as memory:
        memory.add_session(session["turns"], time=session["time"])
        before = memory.ask("Where did Alex go?")
        traces = memory.index.current()[0].traces
        assert traces and all(t.trajectory == "earlier, then later" for t in traces)
        window_two = [t.id for t in memory.store.load_namespace("alex").turns.values()][6:]
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_REWRITE), str(tmp_path / "store"), *window_two], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        after = memory.ask("Where did Alex go?")
        assert memory.store.count_units("alex") == len(session["turns"])  # same counts, other content
        assert all(t.trajectory == "rewritten elsewhere" for t in memory.index.current()[0].traces)
    facts = lambda result: {u.id: u.fact_text for u in result.units}  # noqa: E731
    assert not any("lighthouse" in f for f in facts(before).values())
    assert {i for i, f in facts(after).items() if "lighthouse" in f} == set(window_two)
