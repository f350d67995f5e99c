"""A namespace of several segments loads its vectors without copying them: a RowStack of the sidecars' mapped arrays
that gathers, multiplies and feeds the dense channel as the concatenated matrix does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.memory import segments
from qgmem_train.memory.row_stack import RowStack
from qgmem_train.memory.store import EmbeddedUnit, MemoryStore, WindowResult
from qgmem_train.retrieval.dense import DenseIndex
from tests.test_store_columns import _unit

DIM = 16


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    rows = rng.standard_normal((n, DIM)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.fixture
def blocks() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [_rows(rng, 5), _rows(rng, 0), _rows(rng, 7), _rows(rng, 1)]


def test_a_stack_reads_as_its_blocks_concatenated(blocks: list[np.ndarray]) -> None:
    stack, whole = RowStack(blocks), np.concatenate(blocks)
    assert len(stack) == 13 and stack.shape == whole.shape and stack.dtype == whole.dtype and stack.nbytes == whole.nbytes
    for rows in (np.array([12, 0, 5, 5, 4, -1]), np.array([], np.int64), slice(3, 9), slice(None, None, -2), whole[:, 0] > 0):
        np.testing.assert_array_equal(stack[rows], whole[rows])
    np.testing.assert_array_equal(stack[6], whole[6])
    query = np.random.default_rng(1).standard_normal(DIM).astype(np.float32)
    np.testing.assert_allclose(stack @ query, whole @ query, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(stack), whole)
    with pytest.raises(IndexError):
        stack[np.array([13])]
    with pytest.raises(TypeError, match="rows only"):
        stack[:, 0]
    assert RowStack.of(blocks[:1]) is blocks[0]


def _store(path: Path, segments: int, per_segment: int) -> MemoryStore:
    rng = np.random.default_rng(2)
    store = MemoryStore.open(path, create=True)
    store.ensure_namespace("n", "llm", "unit-16", DIM)
    for s in range(segments):
        items = []
        for i in range(s * per_segment, (s + 1) * per_segment):
            unit = _unit(i)
            attributes = _rows(rng, len(unit.entities) + len(unit.locations))
            items.append(EmbeddedUnit(unit, _rows(rng, 1)[0], _rows(rng, 1)[0], attributes, _rows(rng, int(rng.integers(0, 4))), None))
        store.add_windows("n", [WindowResult("s", s, items)])
    return store


@pytest.mark.parametrize("scan", ["float32", "int8"])
def test_a_multi_segment_load_maps_its_vectors_and_searches_as_a_copy_would(tmp_path: Path, scan: str) -> None:
    if scan == "int8":
        pytest.importorskip("faiss")
    memory = _store(tmp_path / "store", segments=3, per_segment=30).load_namespace("n")
    for vectors in (memory.fact_embeddings, memory.sentence_embeddings):
        assert isinstance(vectors, RowStack) and len(vectors.blocks) == 3
        assert not any(block.flags.owndata for block in vectors.blocks), "views of the mapped sidecars, not copies"
    loaded = DenseIndex(memory.fact_embeddings, memory.sentence_embeddings, memory.sentence_unit, scan=scan, code_blocks=memory.code_blocks)
    copied = DenseIndex(np.asarray(memory.fact_embeddings), np.asarray(memory.sentence_embeddings), memory.sentence_unit, scan=scan)
    rng = np.random.default_rng(3)
    for query in _rows(rng, 20):
        rows, scores = loaded.search(query, 10)
        expected_rows, expected_scores = copied.search(query, 10)
        np.testing.assert_array_equal(rows, expected_rows)
        np.testing.assert_allclose(scores, expected_scores, atol=1e-6)
        np.testing.assert_allclose(loaded.similarities(query), copied.similarities(query), atol=1e-6)  # BLAS rounds per block


def test_a_multi_segment_load_maps_its_attribute_text_vectors_and_indexes_each_text_once(tmp_path: Path) -> None:
    """The attribute texts recur across segments (a person named in every session): each segment's text vectors stay
    a view of its sidecar, and the attribute index gathers one row per distinct text, the first stored."""
    store = _store(tmp_path / "store", segments=3, per_segment=30)
    table = segments.read_units(store._db, "n", DIM)
    vectors = table.vectors["text"]
    assert isinstance(vectors, RowStack) and len(vectors.blocks) == 3
    assert not any(block.flags.owndata for block in vectors.blocks), "views of the mapped sidecars, not copies"
    index = table.attribute_index()
    copied = replace(table, vectors={**table.vectors, "text": np.asarray(vectors)}).attribute_index()
    assert isinstance(index.embeddings, np.ndarray) and len(index.texts) == len(set(table.texts.tolist())) < len(table.texts)
    np.testing.assert_array_equal(index.embeddings, copied.embeddings)
    np.testing.assert_array_equal(index.text_id, copied.text_id)
    assert list(index.texts) == list(copied.texts)
    loaded = store.load_namespace("n").attributes
    np.testing.assert_array_equal(loaded.embeddings[loaded.text_id], copied.embeddings[copied.text_id])
