"""Retried writes store each session once: ``add_session`` and ``build`` killed by SIGKILL between window batches, then rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from qgmem_train.__main__ import main
from qgmem_train.config import PipelineConfig
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.types import Turn, session_fingerprint
from qgmem_train.predictor import QGMemPredictor
from tests.fakes import ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "locomo_sample.json"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TRAJECTORY = '{"trajectory": "earlier, then later"}'

SESSIONS = [
    {
        "time": f"2024-0{k}-10",
        "turns": [
            {"speaker": "Alex" if i % 2 == 0 else "Sam", "text": f"I went to the {place} on trip {k} and stayed {i} nights."}
            for i, place in enumerate(["harbour", "museum", "old town", "market", "castle", "beach", "bridge", "park", "lake", "tower"])
        ],
    }
    for k in range(1, 4)
]
"""Three sessions of ten turns: two windows each (w=6, overlap 2)."""

_KILL_AFTER_COMMITS = """
import os, signal
from qgmem_train.memory.store import MemoryStore

_commit = MemoryStore.add_windows
_commits = 0

def _add_windows_then_die(self, namespace, results):
    global _commits
    _commit(self, namespace, results)
    _commits += 1
    if _commits == KILL_AFTER:
        os.kill(os.getpid(), signal.SIGKILL)

MemoryStore.add_windows = _add_windows_then_die
"""
"""Prefix of a child script: SIGKILL right after the KILL_AFTER-th window batch has committed."""

_KILL_INSIDE_COMMIT = """
import os, signal
from qgmem_train.memory.store import MemoryStore

_write = MemoryStore._add_windows
_calls = 0

def _die_before_the_units(self, db, namespace, results):
    global _calls
    _calls += 1
    if _calls == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    _write(self, db, namespace, results)

MemoryStore._add_windows = _die_before_the_units
"""
"""Prefix of a child script: SIGKILL inside the KILL_AT-th transaction writing units, after its namespace and turns."""

_ADD_SESSIONS = """
import json, sys
from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig
from qgmem_train.llm.embedder import Embedder
from qgmem_train.predictor import QGMemPredictor
from tests.fakes import ScriptedLLM

cfg = PipelineConfig()
cfg.models.device, cfg.construction.units, cfg.construction.window_batch_size = "cpu", "turns", 1
embedder = Embedder(BUNDLED_EMBEDDER, device="cpu")
predictor = QGMemPredictor(None, cfg, llm=ScriptedLLM(lambda chat: TRAJECTORY), embedder=embedder, reranker=None, intent="rules")
with predictor.memory("alex", sys.argv[1]) as memory:
    for session in json.loads(sys.argv[2]):
        memory.add_session(session["turns"], time=session["time"])
"""


_WHOLE_SESSIONS = _ADD_SESSIONS.replace('memory.add_session(session["turns"], time=session["time"])', 'memory.add_session(session["turns"], time=session["time"], whole=True)')


def _run_killed(script: str, kill_after: int, *args: str, hook: str = _KILL_AFTER_COMMITS) -> None:
    code = textwrap.dedent(hook).replace("KILL_AFTER", str(kill_after)).replace("KILL_AT", str(kill_after)) + textwrap.dedent(script).replace("TRAJECTORY", repr(TRAJECTORY))
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def _cfg() -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.models.device, cfg.construction.units, cfg.construction.window_batch_size = "cpu", "turns", 1
    return cfg


def _turn_rows(store: MemoryStore, namespace: str) -> list[tuple[str, str, str]]:
    """(session id, speaker, text) of every stored turn of ``namespace``."""
    memory = store.load_namespace(namespace)
    session_of = {u.source_turn_ids[0]: u.session_id for u in memory.units}
    return [(session_of.get(t.id, "?"), t.speaker, t.text) for t in memory.turns.values()]


def test_session_fingerprint_is_the_content_of_turns_and_time() -> None:
    turns = SESSIONS[0]["turns"]
    same = session_fingerprint([dict(t) for t in turns], "2024-01-10")
    assert session_fingerprint(turns, "2024-01-10") == same and same.startswith("s-")
    assert session_fingerprint(turns, "2024-01-11") != same and session_fingerprint(turns, None) != same
    assert session_fingerprint(turns[::-1], "2024-01-10") != same
    assert session_fingerprint([{**turns[0], "text": "other"}, *turns[1:]], "2024-01-10") != same
    assert session_fingerprint([{**turns[0], "speaker": "Sam"}, *turns[1:]], "2024-01-10") != same
    assert session_fingerprint([{**turns[0], "id": "t1"}, *turns[1:]], "2024-01-10") != same
    assert session_fingerprint([Turn("t1", "Alex", "hi")], None) == session_fingerprint([{"id": "t1", "speaker": "Alex", "text": "hi"}], None)
    assert session_fingerprint([{"speaker": "Alex", "text": "hi"}, "not a turn"], None)  # invalid turns are refused later, not here


def test_add_session_killed_between_window_batches_then_retried_stores_each_session_once(tmp_path: Path, minilm) -> None:
    killed = tmp_path / "killed"
    _run_killed(_ADD_SESSIONS, 3, str(killed), json.dumps(SESSIONS))  # session 1 whole, then one of session 2's two windows
    with MemoryStore.open(killed) as store:
        assert len(store.done_windows("alex")) == 3 and store.count_units("alex") == 16

    predictor = QGMemPredictor(None, _cfg(), llm=ScriptedLLM(lambda chat: TRAJECTORY), embedder=minilm, reranker=None, intent="rules")
    with predictor.memory("alex", killed) as memory:
        reports = [memory.add_session(s["turns"], time=s["time"]) for s in SESSIONS]  # the caller retries every call
        assert [r.windows_built for r in reports] == [0, 1, 2] and all(r.traces_updated for r in reports)
        again = [memory.add_session(s["turns"], time=s["time"]) for s in SESSIONS]
        assert [(r.windows_built, r.traces_updated) for r in again] == [(0, False)] * 3
        rows = _turn_rows(memory.store, "alex")
        retried = memory.store.load_namespace("alex")
    expected = Counter((session_fingerprint(s["turns"], s["time"]), t["speaker"], t["text"]) for s in SESSIONS for t in s["turns"])
    assert Counter(rows) == expected and max(expected.values()) == 1
    assert len(retried.units) == 30 and {u.session_id for u in retried.units} == {session_fingerprint(s["turns"], s["time"]) for s in SESSIONS}

    with predictor.memory("alex", tmp_path / "clean") as memory:
        for s in SESSIONS:
            memory.add_session(s["turns"], time=s["time"])
        clean = memory.store.load_namespace("alex")
    assert retried.units == clean.units and retried.turns == clean.turns
    assert [t.member_ids for t in retried.traces] == [t.member_ids for t in clean.traces] and clean.traces


def test_a_whole_session_add_killed_mid_write_leaves_each_session_whole_or_absent(tmp_path: Path, minilm) -> None:
    """The server's add (``whole=True``): one transaction for the turns and every window of a session, so a kill leaves none of it."""
    killed = tmp_path / "killed"
    _run_killed(_WHOLE_SESSIONS, 3, str(killed), json.dumps(SESSIONS), hook=_KILL_INSIDE_COMMIT)  # batches of one window, yet sessions commit whole
    fingerprints = [session_fingerprint(s["turns"], s["time"]) for s in SESSIONS]
    with MemoryStore.open(killed) as store:
        assert sorted(store.done_windows("alex")) == sorted((f, i) for f in fingerprints[:2] for i in range(2))
        assert store.count_sessions("alex") == 2 and store.session_summary("alex", fingerprints[2]) is None

    predictor = QGMemPredictor(None, _cfg(), llm=ScriptedLLM(lambda chat: TRAJECTORY), embedder=minilm, reranker=None, intent="rules")
    with predictor.memory("alex", killed) as memory:
        reports = [memory.add_session(s["turns"], time=s["time"], whole=True) for s in SESSIONS]
        assert [r.windows_built for r in reports] == [0, 0, 2]
        assert {u.session_id for u in memory.store.load_namespace("alex").units} == set(fingerprints)


def test_a_whole_add_killed_before_it_commits_leaves_no_namespace_and_no_turns_and_may_be_sent_again_changed(tmp_path: Path, minilm) -> None:
    """Killed inside the first add's transaction (its namespace and turns written, its units not yet): nothing of it stays,
    so the retry may carry other turns under the same session id."""
    killed = tmp_path / "killed"
    sent = [{**SESSIONS[0], "session_id": "S1"}]
    script = _WHOLE_SESSIONS.replace('time=session["time"], whole=True', 'time=session["time"], session_id=session["session_id"], whole=True')
    _run_killed(script, 1, str(killed), json.dumps(sent), hook=_KILL_INSIDE_COMMIT)
    with MemoryStore.open(killed) as store:
        assert store.namespaces() == [] and store.count_sessions("alex") == 0 and store.session_turns("alex", "S1") == []
    changed = [{**turn, "text": f"{turn['text']} (corrected)"} for turn in SESSIONS[0]["turns"]]
    predictor = QGMemPredictor(None, _cfg(), llm=ScriptedLLM(lambda chat: TRAJECTORY), embedder=minilm, reranker=None, intent="rules")
    with predictor.memory("alex", killed) as memory:
        report = memory.add_session(changed, time=SESSIONS[0]["time"], session_id="S1", whole=True)
        assert report.windows_built == 2 and [t["text"] for t in memory.store.session_turns("alex", "S1")] == [t["text"] for t in changed]


_BUILD = """
import sys
from qgmem_train.__main__ import main
main(sys.argv[1:])
"""


@pytest.fixture
def batch_of_one(tmp_path: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text("pipeline:\n  construction:\n    traces: false\n    window_batch_size: 1\n")
    return path


def test_build_killed_between_window_batches_then_rerun_stores_each_session_once(tmp_path: Path, batch_of_one: Path, capsys) -> None:
    store = tmp_path / "store"
    args = ["build", "--dataset", "locomo", "--input", str(SAMPLE), "--store", str(store), "--units", "turns", "--limit-sessions", "2", "--config", str(batch_of_one)]
    _run_killed(_BUILD, 3, *args)
    assert main(args) == 0 and main(args) == 0
    assert "units 35 (0 new)" in capsys.readouterr().out
    (conv,) = load_conversations("locomo", SAMPLE)
    expected = Counter((s.id, t.speaker, t.text) for s in conv.sessions[:2] for t in s.turns)
    with MemoryStore.open(store) as s:
        assert Counter(_turn_rows(s, conv.id)) == expected and s.count_units(conv.id) == sum(expected.values()) == 35
