"""The dense code scans (int8, product-quantised): same top 10 as the exact float32 search on a fixed synthetic set,
exact cosines, scan choice, and blocks of either kind searched together."""

from __future__ import annotations

import numpy as np
import pytest

from qgmem_train import vector_codes
from qgmem_train.retrieval import dense
from qgmem_train.retrieval.dense import DenseIndex

pytest.importorskip("faiss")

TOP10_AGREEMENT = 0.99
"""Stated tolerance: mean share of the exact top 10 that a code scan returns (one miss in 1,000 slots at most)."""


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    rows = rng.standard_normal((n, dim), dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _synthetic(seed: int = 0, units: int = 20_000, dim: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Units with 0-4 sentence vectors each (about 2 on average) and 100 queries near random units' vectors."""
    rng = np.random.default_rng(seed)
    facts = _unit_rows(rng, units, dim)
    owners = np.repeat(np.arange(units), rng.integers(0, 5, size=units))
    sentences = _unit_rows(rng, len(owners), dim)
    targets = np.concatenate([facts[rng.integers(units, size=50)], sentences[rng.integers(len(owners), size=50)]])
    queries = targets + 0.6 * rng.standard_normal(targets.shape, dtype=np.float32) / np.sqrt(dim)
    return facts, sentences, owners, queries / np.linalg.norm(queries, axis=1, keepdims=True)


@pytest.mark.parametrize("scan", ["int8", "pq"])
def test_code_scan_agrees_with_exact_search_on_the_top_10_and_returns_exact_cosines(scan: str) -> None:
    facts, sentences, owners, queries = _synthetic()
    exact = DenseIndex(facts, sentences, owners, scan="float32")
    quantized = DenseIndex(facts, sentences, owners, scan=scan)
    assert (exact.scan, quantized.scan) == ("float32", scan) and quantized.approximate and not exact.approximate
    agreement = []
    for query in queries:
        rows, scores = quantized.search(query, 10)
        reference, _ = exact.search(query, 10)
        agreement.append(len(set(rows.tolist()) & set(reference.tolist())) / 10)
        np.testing.assert_allclose(scores, exact.similarities(query)[rows], rtol=1e-5, atol=1e-6)
        assert np.all(np.diff(scores) <= 0)
    assert np.mean(agreement) >= TOP10_AGREEMENT


@pytest.mark.parametrize("scan", ["int8", "pq"])
def test_code_scan_keeps_the_full_pool_of_100_close_to_exact(scan: str) -> None:
    facts, sentences, owners, queries = _synthetic(seed=1)
    exact = DenseIndex(facts, sentences, owners, scan="float32")
    quantized = DenseIndex(facts, sentences, owners, scan=scan)
    overlap = [len(set(quantized.search(q, 100)[0].tolist()) & set(exact.search(q, 100)[0].tolist())) / 100 for q in queries[:20]]
    assert np.mean(overlap) >= 0.98


def test_exact_similarities_of_some_rows_read_only_their_vectors_and_match_the_full_scan() -> None:
    facts, sentences, owners, queries = _synthetic(units=3_000)
    index = DenseIndex(facts, sentences, owners, scan="float32")
    rows = np.array([0, 2_999, 17, 17, 1_500, *np.flatnonzero(np.bincount(owners, minlength=3_000) == 0)[:5]])
    for query in queries[:5]:
        np.testing.assert_allclose(index.similarities(query, rows), index.similarities(query)[rows], rtol=1e-6)
    assert index.similarities(queries[0], np.zeros(0, np.int64)).shape == (0,)


def test_auto_scan_switches_to_int8_at_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    facts, sentences, owners, _ = _synthetic(units=1_000)
    assert DenseIndex(facts, sentences, owners).scan == "float32"
    monkeypatch.setattr(dense, "SCAN_INT8_MIN_VECTORS", len(facts) + len(owners))
    assert DenseIndex(facts, sentences, owners).scan == "int8"
    assert DenseIndex(facts, sentences, owners, scan="float32").scan == "float32"
    assert DenseIndex(facts, sentences, owners, approximate=True).scan == "hnsw"
    with pytest.raises(ValueError, match="unknown dense scan"):
        DenseIndex(facts, scan="int4")  # type: ignore[arg-type]


def test_int8_scan_of_a_tiny_index_returns_every_unit() -> None:
    facts, sentences, owners, queries = _synthetic(units=30)
    rows, scores = DenseIndex(facts, sentences, owners, scan="int8").search(queries[0], 100)
    reference_rows, reference_scores = DenseIndex(facts, sentences, owners, scan="float32").search(queries[0], 100)
    assert rows.tolist() == reference_rows.tolist() and len(rows) == 30
    np.testing.assert_allclose(scores, reference_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["hnsw", "int8"])
def test_a_search_returns_n_units_when_a_few_units_hold_most_of_the_nearest_vectors(mode: str) -> None:
    """Ten units with 120 sentence vectors each right at the query fill any fixed number of nearest vectors; n units still come back."""
    rng = np.random.default_rng(1)
    dim, units = 32, 300
    facts = _unit_rows(rng, units, dim)
    query = _unit_rows(rng, 1, dim)[0]
    crowded = query + 0.05 * rng.standard_normal((10 * 120, dim), dtype=np.float32) / np.sqrt(dim)
    crowded /= np.linalg.norm(crowded, axis=1, keepdims=True)
    owners = np.repeat(np.arange(10), 120)
    index = DenseIndex(facts, crowded, owners, approximate=mode == "hnsw", scan="int8" if mode == "int8" else "float32")
    assert index.scan == mode
    exact_rows, exact_scores = DenseIndex(facts, crowded, owners, scan="float32").search(query, 100)
    rows, scores = index.search(query, 100)
    assert len(rows) == 100 and len(set(rows.tolist())) == 100
    assert set(rows[:10].tolist()) == set(range(10)) and np.allclose(np.sort(scores)[::-1][:10], exact_scores[:10], atol=1e-5)


def test_no_hnsw_graph_or_int8_codes_are_built_when_the_dense_channel_is_off(minilm) -> None:
    from qgmem_train.config import RetrievalConfig
    from qgmem_train.retrieval.activation import ActivationIndex
    from tests.test_retrieval_activation import make_memory

    memory = make_memory(minilm)
    with_dense = ActivationIndex(memory, RetrievalConfig(approximate=True), minilm)
    without = ActivationIndex(memory, RetrievalConfig(approximate=True, channels=["bm25", "attr"]), minilm)
    assert with_dense.dense.scan == "hnsw" and without.dense.scan == "float32"


@pytest.mark.parametrize("pq_from", [None, 1_000])
def test_codes_in_blocks_give_the_nearest_codes_of_them_all(pq_from: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of uneven sizes (a loaded store's segments, each with its own scale; with ``pq_from``, the blocks of that
    many vectors product-quantised and the others int8) are asked for short shares first; the codes kept are still the
    nearest of all the blocks' codes."""
    if pq_from is not None:
        monkeypatch.setattr(vector_codes, "PQ_MIN_VECTORS", pq_from)
    facts, sentences, owners, queries = _synthetic(units=4_000)
    cuts = [0, 37, 900, 1_000, 2_700, 4_000]
    sentence_cuts = np.searchsorted(owners, cuts)
    layout = [(np.arange(a, b), np.arange(c, d)) for a, b, c, d in zip(cuts[:-1], cuts[1:], sentence_cuts[:-1], sentence_cuts[1:])]
    blocks = vector_codes.encode_blocks(facts, sentences, layout)
    assert [block.kind for block in blocks] == (["int8", "pq", "int8", "pq", "pq"] if pq_from else ["int8"] * 5)
    index = DenseIndex(facts, sentences, owners, scan="int8", code_blocks=blocks)
    assert index.scan == ("pq" if pq_from else "int8")
    for query in queries[:10]:
        every = [index._search_block(query, block, vectors, block.index.ntotal) for block, vectors in index._codes]
        distances, vectors = np.concatenate([d for d, _ in every]), np.concatenate([v for _, v in every])
        for wanted in (1, 50, 512, 3_000):
            nearest = index._nearest_codes(query, wanted)
            assert len(nearest) == wanted and len(set(nearest.tolist())) == wanted
            assert np.max(distances[np.isin(vectors, nearest)]) <= np.partition(distances, wanted - 1)[wanted - 1]


def test_product_quantised_distances_estimate_the_squared_distance_to_unit_vectors() -> None:
    """A pq block's inner products are turned into ``2 - 2s`` so that they compare with int8 blocks' squared distances."""
    facts, sentences, owners, queries = _synthetic(units=4_000)
    index = DenseIndex(facts, sentences, owners, scan="pq")
    (block, vectors_of_code), = index._codes
    vectors = np.concatenate([facts, sentences])
    for query in queries[:5]:
        distances, vectors_found = index._search_block(query, block, vectors_of_code, 200)
        exact = np.sum((vectors[vectors_found] - query) ** 2, axis=1)
        assert np.all(np.diff(distances) >= 0) and np.mean(np.abs(distances - exact)) < 0.1  # 8-bit lookup tables: coarse
        assert np.argmin(np.sum((vectors - query) ** 2, axis=1)) in vectors_found[:10]


def test_a_pq_search_rescores_more_candidates_than_an_int8_one() -> None:
    assert dense.rescore_count(100, pq=True) > dense.rescore_count(100) and dense.rescore_count(10, pq=True) == dense.PQ_RESCORE_MIN
    with pytest.raises(ValueError, match="even dimension"):
        vector_codes.build_pq_codes([np.ones((100, 5), np.float32)])
