"""The PostgreSQL store (a real PostgreSQL 16 + pgvector, see tests/conftest.py): the same retrieval as SQLite on the
LoCoMo sample, a writer killed by SIGKILL mid-write then retried, deletion leaving no row, schema refusals and a
password never shown. The tests every store passes run on both backends in tests/test_memory_store.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from qgmem_train.__main__ import main
from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.memory.construct import build_conversation
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.store_file import StoreLockedError
from qgmem_train.memory.types import Conversation, Session, Turn
from qgmem_train.predictor import QGMemPredictor
from qgmem_train.retrieval.activation import ActivationIndex, activate
from tests.fakes import ScriptedLLM
from tests.test_session_retry import ENV, ROOT, SAMPLE, SESSIONS, TRAJECTORY

SECRET = "My locker code at the Zorblatt gym is 4417."


def _cfg() -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.models.device, cfg.models.reranker, cfg.construction.units = "cpu", "none", "turns"
    return cfg


def _predictor(minilm) -> QGMemPredictor:
    return QGMemPredictor(None, _cfg(), llm=ScriptedLLM(lambda chat: TRAJECTORY), embedder=minilm, reranker=None, intent="rules")


class _EncodingEachTextOnce:
    """The real embedder, encoding each distinct text once: the second backend's build and questions get the vectors the
    first one got, so the comparison is of the two stores alone and the embedder's work is not done twice."""

    def __init__(self, embedder) -> None:
        self.embedder, self.vectors = embedder, {}
        self.model_id, self.dim = embedder.model_id, embedder.dim

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        new = list(dict.fromkeys(text for text in texts if text not in self.vectors))
        if new:
            self.vectors.update(zip(new, self.embedder.encode(new, batch_size)))
        return np.array([self.vectors[text] for text in texts], dtype=np.float32).reshape(len(texts), self.dim)


@pytest.mark.slow
def test_retrieval_on_the_locomo_sample_gives_the_same_top_10_from_both_backends(new_postgres_store, tmp_path: Path, minilm) -> None:
    (conv,) = load_conversations("locomo", SAMPLE)
    cfg = _cfg()
    embedder = _EncodingEachTextOnce(minilm)
    memories = {}
    for name, location in (("sqlite", tmp_path / "store"), ("postgresql", new_postgres_store())):
        with MemoryStore.open(location, create=True) as store:
            build_conversation(store, conv, cfg, embedder)
            memories[name] = store.load_namespace(conv.id, embedder_id=embedder.model_id)
    assert memories["sqlite"].units == memories["postgresql"].units and len(memories["sqlite"].traces) > 0
    assert [t.member_ids for t in memories["sqlite"].traces] == [t.member_ids for t in memories["postgresql"].traces]
    questions = [(qa["question"], None) for qa in json.loads(SAMPLE.read_text())[0]["qa"]]
    top = {}
    for name, memory in memories.items():
        index = ActivationIndex(memory, cfg.retrieval, embedder)
        found = [activate(q, t, memory, cfg=cfg.retrieval, llm=None, embedder=embedder, reranker=None, index=index) for q, t in questions]
        top[name] = [([u.id for u in wm.units], wm.scores) for wm in found]
    assert len(questions) == 50 and all(len(ids) == 10 for ids, _ in top["sqlite"])
    for (sqlite_ids, sqlite_scores), (pg_ids, pg_scores) in zip(top["sqlite"], top["postgresql"]):
        assert pg_ids == sqlite_ids
        np.testing.assert_allclose(pg_scores, sqlite_scores, rtol=1e-6)


_KILLED_WRITER = """
import json, os, signal, sys
from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig
from qgmem_train.llm.embedder import Embedder
from qgmem_train.memory.pg_vectors import PgVectors
from qgmem_train.predictor import QGMemPredictor
from tests.fakes import ScriptedLLM

_write = PgVectors.write
_writes = 0

def _write_then_die(self, db, namespace, seq, vectors):
    global _writes
    _write(self, db, namespace, seq, vectors)
    _writes += 1
    if _writes == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # the session's units are written, not yet committed (its two windows: one batch)

PgVectors.write = _write_then_die
cfg = PipelineConfig()
cfg.models.device, cfg.construction.units = "cpu", "turns"
predictor = QGMemPredictor(None, cfg, llm=ScriptedLLM(lambda chat: TRAJECTORY), embedder=Embedder(BUNDLED_EMBEDDER, device="cpu"), reranker=None, intent="rules")
with predictor.memory("alex", sys.argv[1]) as memory:
    for session in json.loads(sys.argv[2]):
        memory.add_session(session["turns"], time=session["time"], session_id=session["id"])
"""


def _sessions_by_units(store: MemoryStore, namespace: str) -> Counter:
    """How many units each session has in the store."""
    return Counter(u.session_id for u in store.load_namespace(namespace).units)


def test_a_writer_killed_mid_write_leaves_no_partial_session_and_the_retry_stores_each_once(new_postgres_store, minilm) -> None:
    uri = new_postgres_store()
    sessions = [{**s, "id": f"S{k}"} for k, s in enumerate(SESSIONS, start=1)]
    code = textwrap.dedent(_KILLED_WRITER).replace("TRAJECTORY", repr(TRAJECTORY))
    proc = subprocess.run([sys.executable, "-c", code, uri, json.dumps(sessions), "3"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    with MemoryStore.open(uri) as store:
        assert _sessions_by_units(store, "alex") == {"S1": 10, "S2": 10}  # S3 died inside its write: none of it is there
        assert {session for session, _ in store.done_windows("alex")} == {"S1", "S2"} and store.count_units("alex") == 20

    predictor = _predictor(minilm)
    with predictor.memory("alex", uri) as memory:
        reports = [memory.add_session(s["turns"], time=s["time"], session_id=s["id"]) for s in sessions]  # the caller retries every call
        assert [r.windows_built for r in reports] == [0, 0, 2]
        again = [memory.add_session(s["turns"], time=s["time"], session_id=s["id"]) for s in sessions]
        assert [r.windows_built for r in again] == [0] * 3
        retried = memory.store.load_namespace("alex")
        assert _sessions_by_units(memory.store, "alex") == {s["id"]: 10 for s in sessions}
    turns = Counter((t.speaker, t.text) for t in retried.turns.values())
    assert turns == Counter((t["speaker"], t["text"]) for s in sessions for t in s["turns"]) and max(turns.values()) == 1
    with predictor.memory("alex", new_postgres_store()) as memory:
        for s in sessions:
            memory.add_session(s["turns"], time=s["time"], session_id=s["id"])
        clean = memory.store.load_namespace("alex")
    assert retried.units == clean.units and retried.turns == clean.turns and clean.traces
    assert [t.member_ids for t in retried.traces] == [t.member_ids for t in clean.traces]


def _rows_text(uri: str) -> str:
    """Every row of every table of the database, as text (vectors as pgvector writes them)."""
    with psycopg.connect(uri) as db:
        tables = [r[0] for r in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        return "\n".join(row for table in tables for (row,) in db.execute(f"SELECT t::text FROM {table} t"))


def test_deleting_a_namespace_leaves_no_row_of_it(new_postgres_store, minilm) -> None:
    uri = new_postgres_store()
    predictor = _predictor(minilm)
    with predictor.memory("alice", uri) as alice, predictor.memory("bob", uri) as bob:
        alice.add_session([{"speaker": "Alice", "text": SECRET}], session_id="A1")
        bob.add_session([{"speaker": "Bob", "text": "I adopted a cat named Miso."}], session_id="B1")
    assert "Zorblatt" in _rows_text(uri) and "alice" in _rows_text(uri)
    with MemoryStore.open(uri) as store:
        assert store.delete_namespace("alice") is True and store.delete_namespace("alice") is False
        assert store.namespaces() == ["bob"] and store.deletions == 1
        assert store.load_namespace("bob").units[0].fact_text == "Bob: I adopted a cat named Miso."
    left = _rows_text(uri)
    assert "Zorblatt" not in left and "alice" not in left and "Miso" in left  # every row (vectors too) names its namespace


def _two_tenants(uri: str) -> None:
    """A store at ``uri`` holding namespaces ``alice`` and ``bob``, a turn each."""
    with MemoryStore.open(uri, create=True) as store:
        for name in ("alice", "bob"):
            store.ensure_namespace(name, "turns", "four-d", 4)
            store.put_turns(name, Conversation(name, [Session("S1", None, [Turn("t1", name.title(), f"{name}'s locker code is 4417")])]))


_WIPING_FUNCTION = (
    "CREATE FUNCTION wipe(keep text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN DELETE FROM turns WHERE namespace <> keep; RETURN true; END $$; "
)
_SHADOW_FUNCTION = (
    "CREATE FUNCTION hashtextextended(keep text, seed integer) RETURNS bigint LANGUAGE plpgsql AS "
    "$$ BEGIN DELETE FROM turns WHERE namespace <> keep; RETURN 0; END $$"
)
"""A better match than the built-in ``hashtextextended(text, bigint)`` for a call with an integer seed."""
HOSTILE_SCHEMAS = {
    "another table": ("CREATE TABLE notes (body TEXT)", "relation notes is not in a memory store's schema"),
    "a column of another type": ("ALTER TABLE turns ALTER COLUMN text TYPE VARCHAR(40)", "column turns.text is not as a memory store defines it"),
    "a column more": ("ALTER TABLE turns ADD COLUMN extra TEXT", "column turns.extra is not as a memory store defines it"),
    "a trigger": (
        "CREATE FUNCTION copy_turn() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$; "
        "CREATE TRIGGER leak AFTER INSERT ON turns FOR EACH ROW EXECUTE FUNCTION copy_turn()",
        "trigger leak on turns is not in a memory store's schema",
    ),
    "a rule deleting other namespaces on insert": (
        "CREATE RULE wipe AS ON INSERT TO turns DO ALSO DELETE FROM turns WHERE namespace <> NEW.namespace", "rule wipe on turns is not in"
    ),
    "a CHECK constraint calling a plpgsql function": (
        _WIPING_FUNCTION + "ALTER TABLE turns ADD CONSTRAINT checked CHECK (wipe(namespace)) NOT VALID", "constraint checked on turns is not in"
    ),
    "a function shadowing hashtextextended(text, integer)": (_SHADOW_FUNCTION, "function public.hashtextextended is not in"),
    "a rule copying every new turn into another schema": (
        "CREATE SCHEMA loot; CREATE TABLE loot.turns AS SELECT * FROM turns WITH NO DATA; "
        "CREATE RULE leak AS ON INSERT TO turns DO ALSO INSERT INTO loot.turns SELECT NEW.*",
        "rule leak on turns is not in",
    ),
    "a rule keeping deleted rows": ("CREATE RULE keep AS ON DELETE TO turns DO INSTEAD NOTHING", "rule keep on turns is not in"),
    "a policy": ("CREATE POLICY mine ON turns USING (true)", "policy mine on turns is not in"),
    "an index": ("CREATE INDEX turns_text ON turns (text)", "index turns_text on turns is not in"),
    "an operator": (
        "CREATE FUNCTION same(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'; "
        "CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = same)",
        "function public.same is not in",
    ),
    "a schema version that is not a number": ("UPDATE meta SET value = 'two' WHERE key = 'schema_version'", "schema_version: is 'two', not a number"),
    "a newer schema version": ("UPDATE meta SET value = '99' WHERE key = 'schema_version'", "PostgreSQL store schema version 99"),
}
"""Case → (what a handed-over database was given, what the one line says). Each hostile object would run on another
tenant's write: wipe the other namespaces, copy their turns out, or keep a deleted namespace's rows."""


@pytest.mark.parametrize("case", list(HOSTILE_SCHEMAS))
def test_a_database_that_is_not_a_store_of_this_schema_is_refused_in_one_line_and_left_as_it_was(new_postgres_store, capsys, case) -> None:
    damage, message = HOSTILE_SCHEMAS[case]
    uri = new_postgres_store()
    _two_tenants(uri)
    with psycopg.connect(uri, autocommit=True) as db:
        db.execute(damage)
    before = _rows_text(uri)
    with pytest.raises(InputError, match=re.escape(message)):
        with MemoryStore.open(uri, create=True) as store:
            store.ensure_namespace("mallory", "turns", "four-d", 4)
    assert main(["ask", "When?", "--store", uri]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message.split(": ")[-1] in err and "\n" not in err
    assert _rows_text(uri) == before and all(f"{name}'s locker code" in before for name in ("alice", "bob"))


def test_a_shadow_of_a_built_in_made_after_the_store_opened_takes_none_of_its_calls(new_postgres_store) -> None:
    uri = new_postgres_store()
    _two_tenants(uri)
    with MemoryStore.open(uri) as store:
        with psycopg.connect(uri, autocommit=True) as db:
            db.execute(_SHADOW_FUNCTION)
        store.ensure_namespace("mallory", "turns", "four-d", 4)
        store.put_turns("mallory", Conversation("m", [Session("S1", None, [Turn("t1", "Mallory", "hello")])]))
        assert store.namespaces() == ["alice", "bob", "mallory"]
    assert all(f"{name}'s locker code" in _rows_text(uri) for name in ("alice", "bob"))


def test_deleting_a_namespace_whose_rows_stay_is_an_error_not_a_success(new_postgres_store) -> None:
    uri = new_postgres_store()
    _two_tenants(uri)
    with MemoryStore.open(uri) as store:
        with psycopg.connect(uri, autocommit=True) as db:  # a rule added after the store was opened and checked
            db.execute("CREATE RULE keep AS ON DELETE TO turns DO INSTEAD NOTHING")
        with pytest.raises(InputError, match="namespace alice: its rows in turns were not deleted"):
            store.delete_namespace("alice")
        assert store.namespaces() == ["alice", "bob"] and store.deletions == 0
    assert "alice's locker code" in _rows_text(uri)


PASSWORD = "pw-Zorblatt-4417"
UNREACHABLE = {
    "after the user name": f"postgresql://qgmem:{PASSWORD}@127.0.0.1:1/memory",
    "holding a raw ?": f"postgresql://qgmem:{PASSWORD}?x@127.0.0.1:1/memory",
    "holding a raw #": f"postgresql://qgmem:{PASSWORD}#x@127.0.0.1:1/memory",
    "as ?password=": f"postgresql://qgmem@127.0.0.1:1/memory?password={PASSWORD}",
    "as ?pass%77ord=": f"postgresql://qgmem@127.0.0.1:1/memory?pass%77ord={PASSWORD}",
    "percent-encoded wrongly": f"postgresql://qgmem:{PASSWORD}%zz@127.0.0.1:1/memory",
}
"""A password in each place a URI can carry one (and a URI the driver refuses, whose parser's message quotes it)."""


@pytest.mark.parametrize("written", list(UNREACHABLE))
def test_a_password_in_the_uri_is_never_shown(written, capsys) -> None:
    uri = UNREACHABLE[written]
    with pytest.raises(InputError) as info:
        MemoryStore.open(uri, create=True)
    assert str(info.value).startswith("postgresql database") and PASSWORD not in str(info.value) and "qgmem:" not in str(info.value)
    for command in (["ask", "When?", "--store", uri], ["build", "--dataset", "locomo", "--input", str(SAMPLE), "--store", uri]):
        assert main(command) == 2
        err = _one_line_error(capsys)
        assert err.startswith("error: postgresql database") and PASSWORD not in err and "qgmem:" not in err


def test_a_missing_store_is_one_line(new_postgres_store) -> None:
    with pytest.raises(InputError, match="no memory store in this database"):
        MemoryStore.open(new_postgres_store())


def test_a_namespace_locked_past_busy_timeout_is_one_line_and_other_namespaces_are_written_meanwhile(new_postgres_store) -> None:
    uri = new_postgres_store()
    with MemoryStore.open(uri, create=True) as holder, MemoryStore.open(uri, busy_timeout=0.5) as other:
        holder.ensure_namespace("alice", "turns", "four-d", 4)
        with holder.transaction("alice"):
            other.ensure_namespace("bob", "turns", "four-d", 4)  # another namespace: not held up
            with pytest.raises(StoreLockedError) as info:
                other.ensure_namespace("alice", "turns", "four-d", 4)
        assert "\n" not in str(info.value) and "locked by another writer for more than 0.5 s" in str(info.value)
        other.ensure_namespace("alice", "turns", "four-d", 4)  # released with the holder's transaction
        assert other.namespaces() == ["alice", "bob"]


def test_build_and_eval_retrieval_read_a_postgresql_store_and_write_no_part_of_its_uri(new_postgres_store, tmp_path: Path, capsys) -> None:
    from export.package import read_eval_report

    config = tmp_path / "turns.yaml"
    config.write_text("pipeline:\n  construction:\n    units: turns\n    traces: false\n")
    uri = new_postgres_store()
    database = conninfo_to_dict(uri)["dbname"]
    with_password = f"{uri}{'&' if '?' in uri else '?'}pass%77ord={PASSWORD}"  # the test server trusts local connections: read and ignored
    assert main(["build", "--dataset", "locomo", "--input", str(SAMPLE), "--store", with_password, "--units", "turns", "--limit-sessions", "2",
                 "--config", str(config)]) == 0  # fmt: skip
    built = capsys.readouterr().out
    assert f"into postgresql database {database} [" in built
    out = tmp_path / "report"
    assert main(["eval", "retrieval", "--dataset", "locomo", "--input", str(SAMPLE), "--store", with_password, "--out", str(out),
                 "--reranker", "none", "--intent", "rules", "--limit", "4", "--config", str(config)]) == 0  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_questions"] == 4 and 0.0 <= metrics["recall@10"] <= 1.0 and metrics["store"] == f"postgresql database {database}"
    card_metrics = json.dumps(read_eval_report(out / "metrics.json"))  # what an exported model card shows of the report
    shown = built + capsys.readouterr().out + card_metrics + "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    assert PASSWORD not in shown and "pass%77ord" not in shown and "host=" not in shown


def _build_arguments(tmp_path: Path, uri: str, text: str) -> list[str]:
    """``build`` of one conversation (its only turn ``text``) into ``uri``, in turns mode without traces."""
    conversation = {"id": "alex", "sessions": [{"id": "s1", "time": "2024-03-02", "turns": [{"id": "s1:1", "speaker": "Alex", "text": text}]}]}
    (tmp_path / "chat.jsonl").write_text(json.dumps(conversation) + "\n")
    (tmp_path / "cfg.yaml").write_text("pipeline:\n  construction:\n    traces: false\n")
    return ["build", "--dataset", "jsonl", "--input", str(tmp_path / "chat.jsonl"), "--store", uri, "--units", "turns", "--config", str(tmp_path / "cfg.yaml")]


def _one_line_error(capsys) -> str:
    """The CLI's error line (after any progress bar), checked to be the only one."""
    err = capsys.readouterr().err
    last = err.rstrip("\n").rpartition("\n")[2]
    assert last.startswith("error: ") and err.count("error: ") == 1 and "Traceback" not in err, err
    return last


def test_a_nul_in_a_turn_text_or_a_namespace_is_one_line(new_postgres_store, tmp_path, capsys) -> None:
    uri = new_postgres_store()
    assert main(_build_arguments(tmp_path, uri, "my code is 44\u000017")) == 2
    assert "NUL" in _one_line_error(capsys)
    with MemoryStore.open(uri, create=True) as store:
        for attempt in (lambda: store.ensure_namespace("al\0ice", "turns", "four-d", 4), lambda: store.generation("al\0ice")):
            with pytest.raises(InputError, match="NUL"):
                attempt()
        assert store.namespaces() == ["alex"] and store.count_units("alex") == 0 and not store.load_namespace("alex").turns


@pytest.fixture
def read_only_role(new_postgres_store, postgres_server):
    """(URI of a new store as its owner, the same database as a role that may only read it)."""
    from urllib.parse import urlsplit, urlunsplit

    uri, role = new_postgres_store(), f"reader_{uuid.uuid4().hex[:12]}"
    MemoryStore.open(uri, create=True).close()
    with psycopg.connect(uri, autocommit=True) as db:
        db.execute(f"CREATE ROLE {role} LOGIN")
        db.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    parts = urlsplit(uri)
    yield uri, urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
    with psycopg.connect(uri, autocommit=True) as db:
        db.execute(f"DROP OWNED BY {role}")
    with psycopg.connect(postgres_server, autocommit=True) as db:
        db.execute(f"DROP ROLE {role}")


def test_a_role_that_may_only_read_is_one_line_from_build_and_a_4xx_from_serve(read_only_role, tmp_path, capsys, minilm) -> None:
    from tests.test_serve import SESSION, call, serve

    _, reader = read_only_role
    assert main(_build_arguments(tmp_path, reader, "I adopted a beagle called Biscuit.")) == 2
    assert "permission denied" in _one_line_error(capsys)
    app, service = serve(_predictor(minilm), reader)
    try:
        response = call(app, "POST", "/v1/namespaces/acme-alice/sessions", json=SESSION)
    finally:
        service.close()
    assert response.status_code == 400 and "permission denied" in response.json()["error"], response.text


def test_a_stored_vector_of_another_width_is_one_line(new_postgres_store, minilm) -> None:
    uri = new_postgres_store()
    with _predictor(minilm).memory("alice", uri) as alice:
        alice.add_session([{"speaker": "Alice", "text": SECRET}, {"speaker": "Bob", "text": "Mine is 2290."}], session_id="A1")
    with psycopg.connect(uri, autocommit=True) as db:
        db.execute("UPDATE segment_vectors SET embedding = '[1,2,3]' WHERE part = 'fact' AND idx = 0")
    with MemoryStore.open(uri) as store, pytest.raises(InputError, match="segment_vectors of namespace alice, segment .*: a fact vector of 3 components"):
        store.load_namespace("alice")
