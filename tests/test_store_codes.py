"""The codes of the dense scan, written with each unit segment (int8, mapped at load; product-quantised for large
segments, read at load): a load searches as an index encoded in memory, codes that do not match their segment are
refused, a store without codes opens and searches as before, and a write killed before its commit leaves the store as
it was."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qgmem_train import vector_codes
from qgmem_train.errors import InputError
from qgmem_train.memory import sidecar
from qgmem_train.memory.store import EmbeddedUnit, MemoryStore, WindowResult
from qgmem_train.retrieval import dense
from qgmem_train.retrieval.dense import DenseIndex
from tests.test_store_columns import _unit
from tests.test_store_sidecars import _CRASH

pytest.importorskip("faiss")

ROOT = Path(__file__).resolve().parents[1]
DIM = 32


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    rows = rng.standard_normal((n, DIM)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _item(i: int, rng: np.random.Generator) -> EmbeddedUnit:
    unit = _unit(i, serial=(i * 37) % 401)  # written out of unit order: the load reorders the rows
    attributes = _rows(rng, len(unit.entities) + len(unit.locations))
    return EmbeddedUnit(unit, _rows(rng, 1)[0], _rows(rng, 1)[0], attributes, _rows(rng, int(rng.integers(0, 4))), None)


def _store(path: Path, items: list[EmbeddedUnit], per_call: int = 40) -> MemoryStore:
    store = MemoryStore.open(path, create=True)
    store.ensure_namespace("n", "llm", "unit-32", DIM)
    for lo in range(0, len(items), per_call):
        store.add_windows("n", [WindowResult("s", lo, items[lo : lo + per_call])])
    return store


def _queries(memory, rng: np.random.Generator, count: int = 40) -> np.ndarray:
    targets = memory.fact_embeddings[rng.integers(len(memory.units), size=count)]
    queries = targets + 0.3 * rng.standard_normal(targets.shape).astype(np.float32)
    return queries / np.linalg.norm(queries, axis=1, keepdims=True)


def _code_files(path: Path) -> list[Path]:
    return sorted((path / sidecar.FOLDER).glob(f"*{vector_codes.SUFFIX}"))


def test_a_mapped_load_searches_as_an_index_encoded_in_memory(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    items = [_item(i, rng) for i in range(400)]
    with _store(tmp_path, items) as store:
        store.add_windows("n", [WindowResult("s", 1000, [_item(i, rng) for i in range(5, 25)])])  # written again: rows move
        memory = store.load_namespace("n")
    assert memory.code_blocks is not None and len(memory.code_blocks) > 1
    assert all(not block.index.codes.is_owned for block in memory.code_blocks)  # views of the mapped files
    mapped = DenseIndex(memory.fact_embeddings, memory.sentence_embeddings, memory.sentence_unit, scan="int8", code_blocks=memory.code_blocks)
    copies = [np.array(a) for a in (memory.fact_embeddings, memory.sentence_embeddings, memory.sentence_unit)]
    layout = [(block.fact_rows, block.sentence_rows) for block in memory.code_blocks]
    encoded = DenseIndex(*copies, scan="int8", code_blocks=vector_codes.encode_blocks(copies[0], copies[1], layout))
    exact = DenseIndex(*copies, scan="float32")
    for query in _queries(memory, rng):
        rows, scores = mapped.search(query, 10)
        assert rows.tolist() == encoded.search(query, 10)[0].tolist() == exact.search(query, 10)[0].tolist()
        np.testing.assert_allclose(scores, exact.similarities(query)[rows], rtol=1e-5, atol=1e-6)


def test_large_segments_get_product_quantised_codes_that_load_and_search_as_encoded_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vector_codes, "PQ_MIN_VECTORS", 300)
    monkeypatch.setattr(dense, "PQ_RESCORE_MIN", 64)  # fewer candidates than vectors: the codes choose what is rescored
    rng = np.random.default_rng(4)
    with _store(tmp_path, [_item(i, rng) for i in range(500)], per_call=250) as store:
        store.add_windows("n", [WindowResult("s", 1000, [_item(i, rng) for i in range(500, 520)])])  # a small segment: int8
        memory = store.load_namespace("n")
    assert sorted(block.kind for block in memory.code_blocks) == ["int8", "pq", "pq"]
    loaded = DenseIndex(memory.fact_embeddings, memory.sentence_embeddings, memory.sentence_unit, scan="int8", code_blocks=memory.code_blocks)
    copies = [np.array(a) for a in (memory.fact_embeddings, memory.sentence_embeddings, memory.sentence_unit)]
    layout = [(block.fact_rows, block.sentence_rows) for block in memory.code_blocks]
    encoded = DenseIndex(*copies, scan="int8", code_blocks=vector_codes.encode_blocks(copies[0], copies[1], layout))
    exact = DenseIndex(*copies, scan="float32")
    assert loaded.scan == encoded.scan == "pq" and len(copies[1]) + len(memory.units) > dense.rescore_count(10, pq=True)
    agreement = []
    for query in _queries(memory, rng):
        rows, scores = loaded.search(query, 10)
        assert rows.tolist() == encoded.search(query, 10)[0].tolist()
        np.testing.assert_allclose(scores, exact.similarities(query)[rows], rtol=1e-5, atol=1e-6)
        agreement.append(len(set(rows.tolist()) & set(exact.search(query, 10)[0].tolist())) / 10)
    assert np.mean(agreement) >= 0.99


@pytest.mark.parametrize("kind", ["int8", "pq"])
def test_codes_that_do_not_match_their_segment_are_refused_in_one_line(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "pq":
        monkeypatch.setattr(vector_codes, "PQ_MIN_VECTORS", 20)
    rng = np.random.default_rng(1)
    with _store(tmp_path, [_item(i, rng) for i in range(60)], per_call=30) as store:
        first, second = _code_files(tmp_path)
        good = first.read_bytes()
        shutil.copyfile(second, first)  # another segment's codes under this one's name
        second_bytes = second.read_bytes()
        for content in (second_bytes, good[:-7]):
            first.write_bytes(content)
            with pytest.raises(InputError) as refused:
                store.load_namespace("n")
            assert "codes" in str(refused.value) and "\n" not in str(refused.value)
        first.write_bytes(good)
        assert [block.kind for block in store.load_namespace("n").code_blocks] == [kind, kind]
        first.unlink()  # as a writer that keeps no codes removes them: encoded at load instead
        memory = store.load_namespace("n")
        assert memory.code_blocks is None and len(memory.units) == 60


def test_a_store_whose_sidecars_hold_no_codes_opens_and_searches_as_one_that_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    items = [_item(i, rng) for i in range(300)]
    with _store(tmp_path / "new", items) as store:
        with_codes = store.load_namespace("n")
    monkeypatch.setattr(vector_codes, "has_faiss", lambda: False)  # the sidecars of a writer without codes
    with _store(tmp_path / "old", items) as store:
        assert not _code_files(tmp_path / "old")
        monkeypatch.undo()
        without = store.load_namespace("n")
        assert without.code_blocks is None
        np.testing.assert_array_equal(without.fact_embeddings, with_codes.fact_embeddings)
        old = DenseIndex(without.fact_embeddings, without.sentence_embeddings, without.sentence_unit, scan="int8")
        new = DenseIndex(with_codes.fact_embeddings, with_codes.sentence_embeddings, with_codes.sentence_unit, scan="int8",
                         code_blocks=with_codes.code_blocks)  # fmt: skip
        for query in _queries(without, rng):
            assert old.search(query, 10)[0].tolist() == new.search(query, 10)[0].tolist()
        store.add_windows("n", [WindowResult("s", 999, [_item(i, rng) for i in range(300, 310)])])  # a later write has codes
        assert len(_code_files(tmp_path / "old")) == 1 and store.load_namespace("n").code_blocks is None


def test_a_write_killed_after_its_codes_and_sidecar_leaves_the_store_as_before(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    items = [_item(i, rng) for i in range(80)]
    store_path = tmp_path / "store"
    with _store(store_path, items) as store:
        before = store.load_namespace("n")
    files_before = set(os.listdir(store_path / sidecar.FOLDER))
    (tmp_path / "more.pkl").write_bytes(pickle.dumps([_item(i, rng) for i in range(80, 90)]))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    died = subprocess.run([sys.executable, "-c", _CRASH, str(store_path), str(tmp_path / "more.pkl")], env=env, cwd=ROOT)
    assert died.returncode == 3
    orphans = set(os.listdir(store_path / sidecar.FOLDER)) - files_before
    assert {Path(name).suffix for name in orphans} == {sidecar.SUFFIX, vector_codes.SUFFIX}
    with MemoryStore.open(store_path) as store:
        after = store.load_namespace("n")
        assert after.units == before.units and len(after.code_blocks) == len(before.code_blocks)
        index = DenseIndex(after.fact_embeddings, after.sentence_embeddings, after.sentence_unit, scan="int8", code_blocks=after.code_blocks)
        exact = DenseIndex(after.fact_embeddings, after.sentence_embeddings, after.sentence_unit, scan="float32")
        for query in _queries(after, rng, 10):
            assert index.search(query, 10)[0].tolist() == exact.search(query, 10)[0].tolist()
        store.add_windows("n", [])
        assert not orphans & set(os.listdir(store_path / sidecar.FOLDER))
