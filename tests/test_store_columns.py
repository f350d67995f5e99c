"""The store's columnar layout: packed texts, unit tables, segments and their merging, units written again,
the upgrade from schema version 2, and the cut a namespace records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qgmem_train.errors import InputError
from qgmem_train.memory import segments
from qgmem_train.memory.columns import TextColumn, pack_arrays, unpack_arrays
from qgmem_train.memory.store import ENTITY, LOCATION, SUBJECT, EmbeddedUnit, MemoryStore, WindowResult
from qgmem_train.memory.store_file import SCHEMA_VERSION
from qgmem_train.memory.types import Conversation, MemoryUnit, Session, TimeSpan, Trace, Turn
from qgmem_train.memory.unit_table import AttributeIndex, UnitTable
from qgmem_train.retrieval.attributes import AttributeScorer, with_subject_entities
from tests import store_v2

DIM = 4


def test_text_columns_keep_any_text_and_none_through_take_concat_and_packing() -> None:
    texts = ["plain", "", None, "Zürich 東京 — ok", "\x00inside", "last"]
    column = TextColumn.from_strings(texts)
    assert list(column) == texts and [column[i] for i in range(len(texts))] == texts and column[-1] == "last"
    assert column.take(np.array([3, 2, 0])).tolist() == ["Zürich 東京 — ok", None, "plain"]
    ascii_only = TextColumn.from_strings(["a", "bc"])
    assert TextColumn.concat([column, ascii_only, TextColumn.from_strings([])]).tolist() == [*texts, "a", "bc"]
    arrays = {**column.arrays("t"), "ints": np.arange(3, dtype=np.int64), "grid": np.ones((2, 3), np.float32)}
    back = unpack_arrays(pack_arrays(arrays))
    assert TextColumn.from_arrays(back, "t").tolist() == texts
    np.testing.assert_array_equal(back["grid"], arrays["grid"])
    with pytest.raises(IndexError):
        column[len(texts)]


def _unit(i: int, *, serial: int | None = None, session: str = "s", text: str | None = None) -> MemoryUnit:
    return MemoryUnit(
        id=f"u{i:03d}", session_id=session, fact_text=text or f"Alex went to place {i}. It was fun.", subject="Alex" if i % 2 else "Sam",
        predicate="went to", object=f"place {i}", source_turn_ids=[f"t{i}", f"t{i + 1}"][: 1 + i % 2], source_text=f"I went to place {i}.",
        utterance_time=None if i % 3 == 0 else "2024-05-01", serial=i if serial is None else serial,
        fact_time=[TimeSpan("2024-04-01", "2024-04-30", "month"), TimeSpan("2024-04-02", "2024-04-02")][: i % 3],
        entities=[f"entity {i % 4}", "Biscuit"][: 1 + i % 2], locations=[f"city {i % 3}"] if i % 2 else [],
    )  # fmt: skip


def _text_vector(text: str) -> np.ndarray:
    """The same vector for the same text, as an embedder gives."""
    return np.random.default_rng(list(text.encode())).standard_normal(DIM).astype(np.float32)


def _embedded(unit: MemoryUnit, rng: np.random.Generator, *, subject: bool = True) -> EmbeddedUnit:
    vectors = rng.standard_normal((4, DIM)).astype(np.float32)
    attributes = np.stack([_text_vector(t) for t in unit.entities + unit.locations])
    sentences = vectors[2:4] if unit.serial % 2 else None
    return EmbeddedUnit(unit, vectors[0], vectors[1], attributes, sentences, _text_vector(unit.subject) if subject else None)


def _write(store: MemoryStore, items: list[EmbeddedUnit], per_window: int = 2) -> None:
    for index in range(0, len(items), per_window):
        store.add_windows("n", [WindowResult("s", index, items[index:index + per_window])])


def _expected_rows(items: list[EmbeddedUnit]) -> list[EmbeddedUnit]:
    return sorted(items, key=lambda item: (item.unit.serial, item.unit.id))


def _check_memory(store: MemoryStore, items: list[EmbeddedUnit]) -> None:
    """The namespace reads back exactly ``items`` in unit order: units, vectors, sentences, attributes and subjects."""
    expected = _expected_rows(items)
    memory = store.load_namespace("n")
    assert list(memory.units) == [i.unit for i in expected] and memory.units == [i.unit for i in expected]
    assert [memory.units[k] for k in range(len(expected))] == [i.unit for i in expected]
    np.testing.assert_array_equal(memory.fact_embeddings, np.stack([i.fact_embedding for i in expected]))
    np.testing.assert_array_equal(store.load_namespace("n", relations=True).relation_embeddings, np.stack([i.relation_embedding for i in expected]))
    sentences = [(row, v) for row, i in enumerate(expected) if i.sentence_embeddings is not None for v in i.sentence_embeddings]
    assert memory.sentence_unit.tolist() == [row for row, _ in sentences]
    np.testing.assert_array_equal(memory.sentence_embeddings, np.stack([v for _, v in sentences]))
    attributes = memory.attributes
    for row, item in enumerate(expected):
        np.testing.assert_array_equal(attributes.unit_embeddings(row), item.attribute_embeddings)
        mine = attributes.unit_index == row
        texts = [attributes.texts[t] for t in attributes.text_id[mine]]
        assert texts == item.unit.entities + item.unit.locations + ([item.unit.subject] if item.subject_embedding is not None else [])
        assert attributes.kind[mine].tolist() == [ENTITY] * len(item.unit.entities) + [LOCATION] * len(item.unit.locations) + (
            [SUBJECT] if item.subject_embedding is not None else []
        )
        if item.subject_embedding is not None:
            subject_text = attributes.text_id[mine & (attributes.kind == SUBJECT)]
            np.testing.assert_array_equal(attributes.embeddings[subject_text][0], item.subject_embedding)
    assert store.count_units("n") == len(expected)


def test_units_written_window_by_window_merge_into_few_segments_and_read_back_whole(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(segments, "PIECE_BYTES", 40)  # every blob in many pieces
    rng = np.random.default_rng(0)
    items = [_embedded(_unit(i), rng) for i in range(70)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items)
        listing = segments.listing(store._db, "n", segments.UNITS)
        assert [level for _, _, level in listing] == [1] * 4 + [0] * 3  # 35 writes: four merges of eight, three left
        keys = store._db.execute("SELECT seq, COUNT(*) FROM unit_keys WHERE namespace = 'n' GROUP BY seq ORDER BY seq").fetchall()
        assert keys == [(seq, rows) for seq, rows, _ in listing]
        _check_memory(store, items)


def test_a_namespace_loads_without_its_sentence_vectors_when_asked_and_reads_none_of_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    items = [_embedded(_unit(i), rng) for i in range(8)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items)
        whole = store.load_namespace("n")
        lean = store.load_namespace("n", sentences=False)
        with_relations = store.load_namespace("n", sentences=False, relations=True)
    assert set(lean.units.table.vectors) == {"fact", "text"} and lean.sentence_embeddings is None and lean.sentence_unit is None
    assert whole.relation_embeddings is None and lean.relation_embeddings is None
    np.testing.assert_array_equal(with_relations.relation_embeddings, np.stack([i.relation_embedding for i in _expected_rows(items)]))
    assert whole.sentence_embeddings is not None and len(whole.sentence_embeddings) > 0
    assert lean.units == whole.units
    np.testing.assert_array_equal(lean.fact_embeddings, whole.fact_embeddings)


def test_a_unit_written_again_replaces_the_stored_one_wherever_it_lies(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    items = [_embedded(_unit(i), rng) for i in range(40)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items)
        generation = store.generation("n")
        again = [_embedded(_unit(3, text="Alex went to the lighthouse."), rng, subject=False), _embedded(_unit(39), rng)]
        store.add_windows("n", [WindowResult("s", 1, again[:1]), WindowResult("s", 19, again[1:] * 2)])
        assert store.generation("n") == generation + 1
        items[3], items[39] = again
        _check_memory(store, items)


def test_units_tied_on_serial_and_window_index_are_ordered_by_id(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    items = [_embedded(_unit(i, serial=i // 3), rng) for i in (8, 2, 5, 1, 7, 4, 0, 3, 6)]
    table = UnitTable.from_embedded(items, [0] * len(items), DIM)
    order = table.unit_order()
    assert [table.ids[r] for r in order] == [f"u{i:03d}" for i in range(9)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        for k, item in enumerate(items):
            store.add_windows("n", [WindowResult("s", k, [item])])
        assert [u.id for u in store.load_namespace("n").units] == [f"u{i:03d}" for i in range(9)]


def test_turns_read_back_in_order_with_times_and_previous_turns(tmp_path: Path) -> None:
    sessions = [Session("a", "2024-01-01", [Turn("a1", "Alex", "Hi"), Turn("a2", "Sam", "Hello é")]), Session("b", None, [Turn("b1", "Alex", "Bye")])]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "turns", "four-d", DIM)
        for k in range(len(sessions)):
            store.put_turns("n", Conversation("c", sessions[: k + 1]))
        memory = store.load_namespace("n")
    assert dict(memory.turns) == {t.id: t for s in sessions for t in s.turns} and list(memory.turns) == ["a1", "a2", "b1"]
    assert dict(memory.turn_time) == {"a1": "2024-01-01", "a2": "2024-01-01", "b1": None}
    assert dict(memory.previous_turn) == {"a2": "a1"} and memory.previous_turn.get("b1") is None and "a1" not in memory.previous_turn
    with pytest.raises(KeyError):
        memory.turns["nope"]


class _RecordingEmbedder:
    """Records what it is asked to embed; one-hot vectors."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls.append(texts)
        return np.eye(DIM, dtype=np.float32)[: len(texts)]


def _v2_store(directory: Path, *, version: int = 2) -> tuple[list[EmbeddedUnit], list[tuple]]:
    """A version-2 (or 1) store with namespace ``n``: units (some tied, some with sentences), turns, a trace, a window."""
    rng = np.random.default_rng(3)
    items = [_embedded(_unit(i, serial=i // 2), rng, subject=False) for i in (5, 0, 3, 1, 4, 2)]
    turns = [("t0", "s", "Alex", "I went out.", "2024-05-01"), ("t1", "s", "Sam", "Where?", "2024-05-01"), ("t2", "r", "Alex", "Home.", None)]
    db = store_v2.create_store(directory, "four-d", DIM, version=version)
    store_v2.add_namespace(db, "n", "turns")
    store_v2.add_units(db, "n", items, [0] * len(items))
    store_v2.add_turns(db, "n", turns)
    db.execute("INSERT INTO traces VALUES ('n', 'trace:u000', 'Alex went to', '[\"u000\", \"u001\"]', 'then', 'u001')")
    db.execute("INSERT INTO windows VALUES ('n', 's', 0, 6, 1)")
    db.close()
    return items, turns


def test_a_store_of_schema_version_2_is_upgraded_and_reads_as_it_was_written(tmp_path: Path) -> None:
    items, turns = _v2_store(tmp_path)
    with MemoryStore.open(tmp_path) as store:
        tables = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "units" not in tables and "sentences" not in tables
        assert store._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION) == "4"
        _check_memory(store, items)
        memory = store.load_namespace("n")
        assert list(memory.turns) == [t[0] for t in turns] and memory.turns["t1"] == Turn("t1", "Sam", "Where?")
        assert dict(memory.previous_turn) == {"t1": "t0"} and memory.turn_time["t2"] is None
        assert memory.traces == [Trace("trace:u000", "Alex went to", ["u000", "u001"], "then", "u001")]
        assert store.done_windows("n") == {("s", 0)} and store.dropped_outputs("n") == 1
    embedder = _RecordingEmbedder()
    attributes = with_subject_entities(memory.attributes, memory.units, embedder)  # version 2 stored no subject vectors
    assert embedder.calls == [["Alex", "Sam"]]
    for row, unit in enumerate(memory.units):
        mine = (attributes.unit_index == row) & (attributes.kind == ENTITY)
        assert [attributes.texts[t] for t in attributes.text_id[mine]] == [*unit.entities, unit.subject]


def test_stored_subjects_become_entities_without_embedding_anything(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    items = [_embedded(_unit(i), rng) for i in range(6)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items)
        memory = store.load_namespace("n")
    embedder = _RecordingEmbedder()
    attributes = with_subject_entities(memory.attributes, memory.units, embedder)
    assert embedder.calls == [] and SUBJECT not in attributes.kind.tolist()
    for row, item in enumerate(_expected_rows(items)):
        mine = (attributes.unit_index == row) & (attributes.kind == ENTITY)
        assert [attributes.texts[t] for t in attributes.text_id[mine]] == [*item.unit.entities, item.unit.subject]


def test_a_store_of_schema_version_1_is_upgraded_to_the_current_version(tmp_path: Path) -> None:
    items, _ = _v2_store(tmp_path, version=1)
    with MemoryStore.open(tmp_path) as store:
        assert store.namespaces() == ["n"] and store.generation("n") == 0
        _check_memory(store, items)
        store.add_windows("n", [WindowResult("s", 1, [_embedded(_unit(9), np.random.default_rng(5))])])
        assert store.generation("n") == 1 and store.traces_stale("n") and store.count_units("n") == len(items) + 1


def test_a_namespace_without_a_recorded_cut_takes_the_next_builds_and_then_keeps_it(tmp_path: Path) -> None:
    _v2_store(tmp_path)
    with MemoryStore.open(tmp_path) as store:
        assert store._db.execute("SELECT cut_window, cut_overlap FROM namespaces").fetchall() == [(None, None)]
        store.check_cut("n", "turns", 4, 1)
        store.ensure_namespace("n", "turns", "four-d", DIM, window=4, overlap=1)
        store.ensure_namespace("n", "turns", "four-d", DIM)  # a writer that cuts no windows checks the units mode only
        with pytest.raises(InputError, match=r"namespace n: cut with units turns, window 4, overlap 1; this build asks units turns, window 6, overlap 2"):
            store.check_cut("n", "turns", 6, 2)
        with pytest.raises(InputError, match=r"cut with units turns, window 4, overlap 1; this build asks units llm, window 4, overlap 1"):
            store.ensure_namespace("n", "llm", "four-d", DIM, window=4, overlap=1)
        store.check_cut("fresh", "llm", 6, 2)  # a namespace not stored yet takes any cut



def test_the_attribute_scorer_reads_vectors_and_rows_but_no_text(tmp_path: Path) -> None:
    class Unreadable(TextColumn):
        def __getitem__(self, index):  # type: ignore[no-untyped-def]
            raise AssertionError("the scorer read an attribute text")

        def tolist(self) -> list:
            raise AssertionError("the scorer read the attribute texts")

    rng = np.random.default_rng(6)
    items = [_embedded(_unit(i), rng) for i in range(6)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items)
        memory = store.load_namespace("n")
    attributes = with_subject_entities(memory.attributes, memory.units, _RecordingEmbedder())
    attributes.texts = Unreadable(attributes.texts.data, attributes.texts.ends)
    attributes.embeddings = attributes.embeddings / np.linalg.norm(attributes.embeddings, axis=1, keepdims=True)
    query = _text_vector("Biscuit") / np.linalg.norm(_text_vector("Biscuit"))
    scorer = AttributeScorer(memory.units, attributes, sem_threshold=0.99)
    has_biscuit = [float("Biscuit" in u.entities) for u in memory.units]
    assert 0 < sum(has_biscuit) < len(has_biscuit)
    np.testing.assert_allclose(scorer.sem_match(query[None, :], ENTITY), has_biscuit, atol=1e-5)


def test_a_text_stored_by_several_writes_scores_the_same_for_every_unit(tmp_path: Path) -> None:
    # An embedder's vector for one text varies in the last bits with its batch; units sharing an entity must tie
    # exactly, so that the attribute channel's tie-break decides their order, not the noise.
    rng = np.random.default_rng(8)
    items = [_embedded(_unit(i), rng) for i in (1, 3)]
    items[1].attribute_embeddings = items[1].attribute_embeddings + np.float32(1e-6)
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items, per_window=1)
        memory = store.load_namespace("n")
    texts = [memory.attributes.texts[t] for t in memory.attributes.text_id]
    assert texts.count("Biscuit") == 2 and len(set(memory.attributes.texts)) == len(memory.attributes.texts)
    query = _text_vector("Biscuit") / np.linalg.norm(_text_vector("Biscuit"))
    attributes = memory.attributes
    attributes.embeddings = attributes.embeddings / np.linalg.norm(attributes.embeddings, axis=1, keepdims=True)
    scores = AttributeScorer(memory.units, attributes, sem_threshold=0.5).sem_match(query[None, :], ENTITY)
    assert scores[0] > 0.99 and scores[0] == scores[1]


def test_a_subject_embedded_at_query_time_reuses_the_row_of_an_equal_stored_text() -> None:
    units = [_unit(0), _unit(1)]  # subjects Sam and Alex
    stored = AttributeIndex(np.array([0, 1]), np.array([ENTITY, ENTITY], np.int8), ["Sam", "entity 1"], np.stack([_text_vector("Sam"), _text_vector("x")]))
    embedder = _RecordingEmbedder()
    attributes = with_subject_entities(stored, units, embedder)
    assert embedder.calls == [["Alex"]]
    assert [attributes.texts[t] for t in attributes.text_id] == ["Sam", "entity 1", "Sam", "Alex"]
    assert attributes.text_id.tolist()[2] == 0 and len(attributes.embeddings) == 3


def test_each_segment_stores_the_terms_of_its_rows_and_no_other(tmp_path: Path) -> None:
    """Units and turns are tokenized when written; a unit written again leaves no term of its old text in the segment
    it is taken out of."""
    from qgmem_train.memory.search_terms import TermLists, lexical_text, turn_line
    from qgmem_train.text import tokenize

    rng = np.random.default_rng(4)
    items = [_embedded(_unit(i), rng) for i in range(4)]
    sessions = [Session("s", None, [Turn("t0", "Alex", "Zebras graze."), Turn("t1", "Sam", "Where, Alex?")])]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        store.put_turns("n", Conversation("c", sessions))
        store.add_windows("n", [WindowResult("s", 0, items)])
        items[1] = _embedded(_unit(1, text="Alex met a walrus."), rng)
        store.add_windows("n", [WindowResult("s", 1, items[1:2])])
        stored = {}
        for kind in (segments.UNITS, segments.TURNS):
            for blob in segments._columns(store._db, "n", kind, 0, segments.LAST_SEQ):
                arrays = unpack_arrays(blob)
                texts = [turn_line(s, t) for s, t in zip(TextColumn.from_arrays(arrays, "speakers"), TextColumn.from_arrays(arrays, "texts"))] \
                    if kind == segments.TURNS else \
                    [lexical_text(f, s) for f, s in zip(TextColumn.from_arrays(arrays, "fact_texts"), TextColumn.from_arrays(arrays, "source_texts"))]  # fmt: skip
                terms = TermLists.from_arrays(arrays)
                vocab = terms.vocab.tolist()
                rows = [[vocab[i] for i in terms.ids[a:b]] for a, b in zip(terms.starts.tolist(), terms.ends.tolist())]
                assert rows == [tokenize(text) for text in texts]
                assert sorted(vocab) == sorted({t for row in rows for t in row}), "the vocabulary holds the terms its rows use"
                stored.setdefault(kind, []).extend(texts)
    assert "walrus" in " ".join(stored[segments.UNITS]) and "place 1. It was fun" not in " ".join(stored[segments.UNITS])
    assert len(stored[segments.TURNS]) == 2


def test_term_lists_concatenated_keep_every_rows_terms_over_one_vocabulary() -> None:
    """The first list's vocabulary is kept as it is and the others' new terms follow; a first list whose vocabulary
    repeats a term is numbered afresh, so every term is there once."""
    from qgmem_train.memory.search_terms import TermLists
    from qgmem_train.text import tokenize

    texts = ["red apple", "green apple", "apple pie", "blue sky"]
    first, second = TermLists.from_texts(texts[:2]), TermLists.from_texts(texts[2:])
    repeated = TermLists(first.ends, first.ids + 1, TextColumn.from_strings([first.vocab[0], *first.vocab.tolist()]))
    for head in (first, repeated):
        joined = TermLists.concat([head, second])
        words = joined.vocab.tolist()
        assert [[words[i] for i in joined.ids[a:b]] for a, b in zip(joined.starts, joined.ends)] == [tokenize(t) for t in texts]
        assert len(set(words)) == len(words)
    assert TermLists.concat([first, second]).vocab.tolist()[: len(first.vocab)] == first.vocab.tolist()
