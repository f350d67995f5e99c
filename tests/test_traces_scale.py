"""Traces at scale: bounded-memory neighbour search, incremental consolidation, and the trace size cap."""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.config import PipelineConfig, pipeline_from_dict
from qgmem_train.errors import InputError
from qgmem_train.memory import traces as traces_module
from qgmem_train.memory.neighbours import can_extend, extend_neighbours, moved, nearest_neighbours, neighbour_count
from qgmem_train.memory.store import EmbeddedUnit, MemoryStore, NamespaceMemory, WindowResult
from qgmem_train.memory.trace_graph import build_trace_graph, extend_trace_graph, linked_components, moved_graph
from qgmem_train.memory.trace_graph_file import cached_rows, fingerprints, graph_path, read_graph
from qgmem_train.memory.traces import consolidate_traces, time_runs
from qgmem_train.memory.types import MemoryUnit, TimeSpan
from qgmem_train.memory.unit_table import UnitView
from tests.fakes import ScriptedLLM

DIM = 16


def _unit_vectors(rng: np.random.Generator, rows: int, centres: np.ndarray, noise: float, dim: int) -> np.ndarray:
    """``rows`` unit vectors around randomly chosen ``centres``."""
    vectors = centres[rng.integers(0, len(centres), rows)] + noise * rng.standard_normal((rows, dim))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def _clustered(rows: int, dim: int = 32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return _unit_vectors(rng, rows, rng.standard_normal((max(2, rows // 25), dim)), 0.6, dim)


def _exact_lists(vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force reference: every other row by descending inner product, k of them."""
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    index = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return index, np.take_along_axis(sims, index, 1)


def _reference_clusters(facts: np.ndarray, relations: np.ndarray, k: int, threshold: float, min_size: int, linkable: np.ndarray) -> list[list[int]]:
    """The trace rule spelled out: i-j linked when one lists the other among its k nearest and their relations are within threshold."""
    n = len(facts)
    index, _ = _exact_lists(facts, min(k, n - 1))
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(n):
        for j in index[i]:
            if linkable[i] and linkable[j] and float(relations[i] @ relations[j]) >= threshold:
                parent[find(i)] = find(int(j))
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted((g for g in groups.values() if len(g) >= max(min_size, 2)), key=lambda g: g[0])


def test_exact_lists_equal_brute_force_with_small_blocks() -> None:
    vectors = _clustered(300)
    lists = nearest_neighbours(vectors, 20, block_bytes=4096)
    index, sims = _exact_lists(vectors, 20)
    assert lists.cells is None
    np.testing.assert_array_equal(lists.index, index)
    np.testing.assert_allclose(lists.sims, sims, rtol=1e-5, atol=1e-6)
    few = nearest_neighbours(vectors[:5], 20)
    assert few.index.shape == (5, 4) and (few.index >= 0).all()  # every other unit when fewer than k


def test_neighbour_search_memory_stays_within_its_block_bound() -> None:
    vectors = _clustered(2000)
    tracemalloc.start()
    try:
        nearest_neighbours(vectors, 20, block_bytes=2**21)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    lists = 2000 * 20 * (4 + 4)
    assert peak < 2 * 2**21 + 4 * lists  # a block and its merge, the lists and their final sort; one 2048-row block was 48 MB


def test_cell_search_finds_nearly_all_neighbours_and_extends() -> None:
    vectors = _clustered(3000, seed=1)
    index, _ = _exact_lists(vectors, 20)
    lists = nearest_neighbours(vectors, 20, exact_max=0)
    assert lists.cells is not None and len(lists.cells.centroids) > 8
    recall = np.mean([len(set(index[i]) & set(lists.index[i])) / 20 for i in range(len(vectors))])
    assert recall > 0.95
    grown = moved(nearest_neighbours(vectors[:2700], 20, exact_max=0), np.arange(2700), 3000)
    assert can_extend(grown, 3000, 20, exact_max=0)
    extend_neighbours(grown, vectors, np.arange(2700, 3000))
    assert np.mean([len(set(index[i]) & set(grown.index[i])) / 20 for i in range(len(vectors))]) > 0.95
    for found in (lists, grown):  # a pair met from both sides is listed once, and no unit lists itself
        assert (found.index >= 0).all() and not (found.index == np.arange(3000)[:, None]).any()
        assert all(len(set(row)) == len(row) for row in found.index.tolist())


def test_extending_lists_equals_searching_all_units() -> None:
    vectors = _clustered(400, seed=2)
    rng = np.random.default_rng(3)
    near_first = vectors[0] + 0.01 * rng.standard_normal((30, vectors.shape[1]))
    vectors[370:] = near_first / np.linalg.norm(near_first, axis=1, keepdims=True)  # 30 new units crowd one list
    row = rng.permutation(400)  # unit u sits at row[u] of the grown namespace
    grown_vectors = np.empty_like(vectors)
    grown_vectors[row] = vectors
    before = nearest_neighbours(vectors[:360], 20)
    lists = moved(before, row[:360], 400)
    changed = extend_neighbours(lists, grown_vectors, row[360:])
    index, sims = _exact_lists(grown_vectors, 20)
    np.testing.assert_array_equal(lists.index, index)
    np.testing.assert_allclose(lists.sims, sims, rtol=1e-5, atol=1e-6)
    old_lists = moved(before, row[:360], 400).index
    differs = (old_lists != index).any(axis=1)
    assert differs[row[:360]].any() and np.array_equal(changed, differs)
    assert not can_extend(before, 400, 20, exact_max=399)  # past the exact limit the lists are rebuilt with cells


def test_extended_graph_equals_a_built_one() -> None:
    rng = np.random.default_rng(9)
    facts = _clustered(300, dim=24, seed=10)
    relations = _unit_vectors(rng, 300, rng.standard_normal((10, 24)), 0.25, 24)
    built = build_trace_graph(facts, relations, 20, 0.80)
    graph = moved_graph(build_trace_graph(facts[:270], relations[:270], 20, 0.80), np.arange(270), 300)
    extend_trace_graph(graph, facts, relations, np.arange(270, 300), 0.80)
    np.testing.assert_array_equal(graph.lists.index, built.lists.index)
    np.testing.assert_array_equal(graph.related, built.related)
    assert built.related.any() and not built.related.all()
    extend_trace_graph(graph, facts, relations, np.arange(0), 0.90)  # another threshold retests every pair
    np.testing.assert_array_equal(graph.related, build_trace_graph(facts, relations, 20, 0.90).related)


def test_linked_components_keep_the_trace_rule() -> None:
    rng = np.random.default_rng(4)
    facts = _clustered(240, dim=24, seed=5)
    relations = _unit_vectors(rng, 240, rng.standard_normal((12, 24)), 0.25, 24)
    linkable = rng.random(240) > 0.2
    expected = _reference_clusters(facts, relations, 20, 0.80, 2, linkable)
    assert len(expected) > 3
    clusters = lambda graph, linkable, min_size: [c.tolist() for c in linked_components(graph, linkable, min_size)]  # noqa: E731
    assert clusters(build_trace_graph(facts, relations, 20, 0.80), linkable, 2) == expected
    assert clusters(build_trace_graph(facts, relations, 20, 0.80, exact_max=0), linkable, 2) != []
    assert clusters(build_trace_graph(facts, relations, 20, 0.80), None, 4) == _reference_clusters(facts, relations, 20, 0.80, 4, np.ones(240, bool))


def test_time_runs_cap_sizes_and_leave_older_runs_alone() -> None:
    assert time_runs(50, 50, 2) == [slice(0, 50)]
    assert time_runs(500, None, 2) == [slice(0, 500)]  # no cap, as in the paper
    assert time_runs(100, 50, 2) == [slice(0, 50), slice(50, 100)]
    assert time_runs(101, 50, 2) == [slice(0, 50), slice(50, 99), slice(99, 101)]
    assert time_runs(125, 50, 2)[:2] == time_runs(140, 50, 2)[:2]
    for count in range(1, 130):
        runs = time_runs(count, 50, 2)
        assert sum(r.stop - r.start for r in runs) == count and all(r.stop - r.start <= 50 for r in runs)
        assert all(r.stop - r.start >= 2 for r in runs) or count < 2


def test_max_trace_size_is_validated() -> None:
    assert PipelineConfig().construction.max_trace_size == 50
    assert pipeline_from_dict({"construction": {"max_trace_size": 3}}).construction.max_trace_size == 3
    assert pipeline_from_dict({"construction": {"max_trace_size": None}}).construction.max_trace_size is None
    with pytest.raises(InputError, match="max_trace_size"):
        pipeline_from_dict({"construction": {"max_trace_size": 1}})


# A synthetic namespace: units of one relation group share a relation vector and lie near each other by fact.


def _group_units(prefix: str, group: int, count: int, first_serial: int, rng: np.random.Generator, centres: np.ndarray) -> list[EmbeddedUnit]:
    relation = np.zeros(DIM, np.float32)
    relation[group % DIM] = 1.0
    units = []
    for i in range(count):
        serial = first_serial + i
        day = f"2023-{1 + serial // 28 % 12:02d}-{1 + serial % 28:02d}"
        unit = MemoryUnit(
            f"{prefix}{group}-{i}", "s", f"fact {prefix}{group}-{i}", f"P{group}", "likes", f"thing {i}", [f"t{serial}"], "", day, serial,
            fact_time=[TimeSpan(day, day, "day")], entities=[f"P{group}"],
        )
        fact = centres[group] + 0.05 * rng.standard_normal(DIM)
        units.append(EmbeddedUnit(unit, (fact / np.linalg.norm(fact)).astype(np.float32), relation, relation[None, :]))
    return units


def _store(path: Path, windows: list[list[EmbeddedUnit]]) -> MemoryStore:
    store = MemoryStore.open(path, create=True)
    store.ensure_namespace("n", "llm", "synthetic", DIM)
    for index, units in enumerate(windows):
        store.add_windows("n", [WindowResult("s", index, units)])
    return store


def _bounds(units: list, cfg: PipelineConfig) -> dict[str, int]:
    """What :func:`read_graph` reads a cached graph of ``units`` within: their neighbours per unit and embedding size."""
    return {"k": neighbour_count(cfg.construction.neighbours, len(units)), "dim": DIM}


def _trajectory(chat) -> str:
    return '{"trajectory": "written by the LLM"}'


def test_adding_units_updates_only_the_traces_they_touch_and_equals_a_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    centres = rng.standard_normal((DIM, DIM)).astype(np.float32)
    first = [u for g in range(6) for u in _group_units("a", g, 5, 10 * g, rng, centres)]
    added = _group_units("b", 1, 2, 200, rng, centres) + _group_units("b", 7, 3, 300, rng, centres)
    cfg = PipelineConfig()
    with _store(tmp_path / "grown", [first]) as store:
        assert consolidate_traces(store, "n", cfg, ScriptedLLM(_trajectory)) == 6
        before = {t.id: t for t in store.load_traces("n")}
        assert len(before) == 6 and graph_path(store.path, "n").is_file()
        store.add_windows("n", [WindowResult("s", 1, added)])

        def no_rebuild(*args, **kwargs):
            raise AssertionError("the cached graph should have been extended")

        monkeypatch.setattr(traces_module, "build_trace_graph", no_rebuild)
        llm = ScriptedLLM(_trajectory)
        assert consolidate_traces(store, "n", cfg, llm) == 7
        after = {t.id: t for t in store.load_traces("n")}
    monkeypatch.undo()
    touched = {"trace:a1-0", "trace:b7-0"}
    assert set(after) == set(before) | {"trace:b7-0"} and len(llm.calls) == len(touched)
    assert all(after[i] == before[i] for i in set(before) - touched)  # untouched traces: same members and trajectory
    assert after["trace:a1-0"].member_ids == [f"a1-{i}" for i in range(5)] + ["b1-0", "b1-1"]
    with _store(tmp_path / "rebuilt", [first + added]) as rebuilt:
        consolidate_traces(rebuilt, "n", cfg)
        expected = sorted(t.member_ids for t in rebuilt.load_traces("n"))
    assert len(expected) == 7 and sorted(t.member_ids for t in after.values()) == expected


def _consolidated_store(path: Path, rng: np.random.Generator, cfg: PipelineConfig) -> tuple[MemoryStore, np.ndarray, NamespaceMemory]:
    """A store of five groups of five related units, its traces consolidated (so its graph cached); the group centres and
    the namespace loaded with its relation vectors."""
    centres = rng.standard_normal((DIM, DIM)).astype(np.float32)
    store = _store(path, [[u for g in range(5) for u in _group_units("a", g, 5, 10 * g, rng, centres)]])
    assert consolidate_traces(store, "n", cfg) == 5
    return store, centres, store.load_namespace("n", relations=True)


def test_stale_or_broken_cached_graph_is_rebuilt(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    cfg = PipelineConfig()
    store, centres, memory = _consolidated_store(tmp_path / "s", rng, cfg)
    with store:
        relations = memory.relation_embeddings
        ids = [u.id for u in memory.units]
        path = graph_path(store.path, "n")
        prints = fingerprints(memory.fact_embeddings, relations)
        assert read_graph(path, ids, prints, **_bounds(ids, cfg)) is not None
        moved_fact = prints.copy()
        moved_fact[3, 0] += 0.01
        assert read_graph(path, ids, moved_fact, **_bounds(ids, cfg)) is None  # a unit embedded differently
        assert read_graph(path, ids[1:], prints[1:], **_bounds(ids[1:], cfg)) is None  # a cached unit gone
        path.write_bytes(b"not a cache")
        assert read_graph(path, ids, prints, **_bounds(ids, cfg)) is None
        store.add_windows("n", [WindowResult("s", 1, _group_units("b", 2, 2, 400, rng, centres))])
        assert consolidate_traces(store, "n", cfg) == 5
        grown = store.load_namespace("n")
        grown_prints = fingerprints(grown.fact_embeddings, store.load_namespace("n", relations=True).relation_embeddings)
    assert read_graph(path, ids, prints, **_bounds(ids, cfg)) is None  # the rebuilt cache names the new units too
    assert read_graph(path, [u.id for u in grown.units], grown_prints, **_bounds(grown.units, cfg)) is not None


def test_a_large_cluster_becomes_traces_of_consecutive_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    centres = rng.standard_normal((DIM, DIM)).astype(np.float32)
    group = _group_units("a", 0, 8, 0, rng, centres)
    units = group[:7][::-1] + _group_units("a", 1, 3, 50, rng, centres)
    cfg = PipelineConfig()
    cfg.construction.max_trace_size = 3
    llm = ScriptedLLM(_trajectory)
    with _store(tmp_path / "s", [units]) as store:
        assert consolidate_traces(store, "n", cfg, llm) == 4
        runs = {t.id: t for t in store.load_traces("n") if t.member_ids[0].startswith("a0")}
        assert sorted(t.member_ids for t in runs.values()) == [["a0-0", "a0-1", "a0-2"], ["a0-3", "a0-4"], ["a0-5", "a0-6"]]  # time order, short tail topped up
        assert {t.current_id for t in runs.values()} == {"a0-6"}  # the component's newest state is current in every run
        assert len(llm.calls) == 4 and all(chat[-1]["content"].count("memory_unit_id") <= 3 for chat in llm.calls)
        store.add_windows("n", [WindowResult("s", 1, group[7:])])
        newer = ScriptedLLM(lambda chat: '{"trajectory": "rewritten"}')
        assert consolidate_traces(store, "n", cfg, newer) == 4
        after = {t.id: t for t in store.load_traces("n") if t.member_ids[0].startswith("a0")}
    assert sorted(t.member_ids for t in after.values()) == [["a0-0", "a0-1", "a0-2"], ["a0-3", "a0-4", "a0-5"], ["a0-6", "a0-7"]]
    assert len(newer.calls) == 2 and {t.current_id for t in after.values()} == {"a0-7"}
    assert after["trace:a0-0"].trajectory == runs["trace:a0-0"].trajectory == "written by the LLM"  # kept, only its current moved on


def test_consolidation_reads_ids_and_predicates_from_columns_and_builds_only_clustered_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    centres = rng.standard_normal((DIM, DIM)).astype(np.float32)
    units = [u for g in range(3) for u in _group_units("a", g, 4, 10 * g, rng, centres)]
    loners = [dataclasses.replace(u, unit=dataclasses.replace(u.unit, id=f"say{k}", predicate="says", serial=100 + k)) for k, u in enumerate(units[:4])]
    cfg = PipelineConfig()
    cfg.construction.units = "turns"  # "says" units link to nothing
    built: list[int] = []
    build_one = UnitView._build

    def every_unit(self) -> None:
        raise AssertionError("consolidation built every unit")

    monkeypatch.setattr(UnitView, "_build_all", every_unit)
    monkeypatch.setattr(UnitView, "_build", lambda self, i: built.append(i) or build_one(self, i))
    with _store(tmp_path / "s", [units + loners]) as store:
        assert consolidate_traces(store, "n", cfg) == 3
        assert all("say" not in m for t in store.load_traces("n") for m in t.member_ids)
    assert len(set(built)) == len(units)


def test_cached_ids_map_to_their_rows_whether_appended_to_reordered_or_gone() -> None:
    ids = ["a", "bé", "c"]
    blob, ends = "".join(ids).encode("utf-8"), np.cumsum([len(i.encode("utf-8")) for i in ids])
    assert cached_rows(blob, ends, ["a", "bé", "c", "d"]).tolist() == [0, 1, 2]
    assert cached_rows(blob, ends, ["d", "c", "a", "bé"]).tolist() == [2, 3, 1]
    assert cached_rows(blob, ends, ["a", "b", "é", "c"]).tolist() == [0, -1, 3]  # same bytes, other ids
    assert cached_rows(blob, ends, ["a", "c"]).tolist() == [0, -1, 1]


def test_lists_moved_to_appended_rows_keep_their_numbers_and_others_are_renumbered() -> None:
    vectors = _clustered(600, seed=4)
    lists = nearest_neighbours(vectors[:500], 20, exact_max=0)
    appended = moved(lists, np.arange(500), 600)
    np.testing.assert_array_equal(appended.index[:500], lists.index)
    np.testing.assert_array_equal(appended.sims[:500], lists.sims)
    np.testing.assert_array_equal(appended.cells.probes[:500], lists.cells.probes)
    assert (appended.index[500:] == -1).all() and np.isneginf(appended.sims[500:]).all() and (appended.cells.probes[500:] == 0).all()
    assert appended.index is not lists.index and appended.cells.centroids is lists.cells.centroids
    shifted = moved(lists, np.arange(500) + 100, 600)  # the same lists one hundred rows later: renumbered
    np.testing.assert_array_equal(shifted.index[100:], np.where(lists.index >= 0, lists.index + 100, -1))


def _met_by_rule(before, grown, vectors: np.ndarray, new_rows: np.ndarray) -> list[set[int]]:
    """Each unit's k best of what the cell rule lets it meet: its list before, the units of the cells it probes when
    it searches, and the searching units that probe its own cell."""
    n, k = len(vectors), before.k
    probes, own = grown.cells.probes, grown.cells.probes[:, 0]
    searching = np.zeros(n, bool)
    searching[new_rows] = True
    sims = vectors @ vectors.T
    expected = []
    for u in range(n):
        met = set(before.index[u][before.index[u] >= 0].tolist()) if u < len(before.index) else set()
        if searching[u]:
            met |= set(np.flatnonzero(np.isin(own, probes[u])).tolist())
        met |= set(np.flatnonzero(searching & (probes == own[u]).any(axis=1)).tolist())
        met.discard(u)
        expected.append(set(sorted(met, key=lambda v: -sims[u, v])[:k]))
    return expected


@pytest.mark.parametrize("keep_pairs_block", [0, 10**9])  # each block cut to its best at once, or every pair kept
def test_extending_cell_lists_keeps_the_best_of_what_each_unit_meets(keep_pairs_block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from qgmem_train.memory import neighbours

    monkeypatch.setattr(neighbours, "KEEP_PAIRS_BLOCK", keep_pairs_block)
    vectors = _clustered(1500, seed=11)
    before = nearest_neighbours(vectors[:1400], 20, exact_max=0)
    grown = moved(before, np.arange(1400), 1500)
    tracemalloc.start()
    try:
        changed = extend_neighbours(grown, vectors, np.arange(1400, 1500), block_bytes=2**16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**16 + grown.index.nbytes + grown.sims.nbytes  # batches of what the new units meet stay within the bound
    expected = _met_by_rule(before, grown, vectors, np.arange(1400, 1500))
    assert [set(row.tolist()) for row in grown.index] == expected
    np.testing.assert_allclose(grown.sims, np.take_along_axis(vectors @ vectors.T, grown.index, 1), rtol=1e-5, atol=1e-6)
    differs = np.ones(1500, bool)
    differs[:1400] = (grown.index[:1400] != before.index).any(axis=1)
    assert differs[:1400].any() and np.array_equal(changed, differs)


@pytest.mark.parametrize("keep_pairs_block", [0, 10**9])
def test_extending_cell_lists_merges_per_batch_not_per_cell(keep_pairs_block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a few units costs what they meet: the lists are merged a few times, not once or more per probed cell."""
    from qgmem_train.memory import neighbours

    monkeypatch.setattr(neighbours, "KEEP_PAIRS_BLOCK", keep_pairs_block)
    vectors = _clustered(6000, seed=12)
    grown = moved(nearest_neighbours(vectors[:5940], 20, exact_max=0), np.arange(5940), 6000)
    merges = []
    for name in ("_merge_block", "_merge_pairs", "_keep_best"):
        monkeypatch.setattr(neighbours, name, lambda *args, _merge=getattr(neighbours, name): merges.append(1) or _merge(*args))
    extend_neighbours(grown, vectors, np.arange(5940, 6000))
    probed = len(np.unique(grown.cells.probes[5940:]))
    assert probed > 100 and len(merges) <= 4


def _stored_member(name: str, shape: tuple[int, ...], dtype: str, data: bytes) -> tuple[str, bytes]:
    """An uncompressed ``.npz`` member whose header claims ``shape`` and ``dtype``, holding ``data`` after the header."""
    import io

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
    return f"{name}.npy", header.getvalue() + data


def _hostile_cache(path: Path, case: str) -> None:
    """Replace the cached graph at ``path`` by a hostile one built from its genuine arrays."""
    import zipfile

    with np.load(path) as stored:
        arrays = {name: stored[name] for name in stored.files}
    if case == "compressed":
        np.savez_compressed(path, **arrays)
    elif case == "a compressed bomb":
        np.savez_compressed(path, **{**arrays, "index": np.zeros(64 << 20, np.int32)})  # 256 MiB inflated, about 256 KiB on disk
    elif case == "a header claiming 2**40 rows":
        np.savez(path, **arrays)
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr(*_stored_member("sims_big", (1 << 40, 4), "<f4", b"\0" * 16))
        with zipfile.ZipFile(path) as archive:
            members = {info.filename: archive.read(info) for info in archive.infolist()}
        members["index.npy"] = members.pop("sims_big.npy")
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, data)
    elif case == "an extra member":
        np.savez(path, **arrays, extra=np.zeros(3, np.float32))


@pytest.mark.parametrize("case", ["compressed", "a compressed bomb", "a header claiming 2**40 rows", "an extra member"])
def test_a_cached_graph_is_read_within_the_namespaces_bounds_or_not_at_all(tmp_path: Path, case: str) -> None:
    cfg = PipelineConfig()
    store, _, memory = _consolidated_store(tmp_path / "s", np.random.default_rng(9), cfg)
    with store:
        ids, prints = [u.id for u in memory.units], fingerprints(memory.fact_embeddings, memory.relation_embeddings)
        path = graph_path(store.path, "n")
        _hostile_cache(path, case)
        tracemalloc.start()
        try:
            assert read_graph(path, ids, prints, **_bounds(ids, cfg)) is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20  # nothing inflated or allocated past the namespace's 25 units
        assert consolidate_traces(store, "n", cfg) == 5  # the cache is built anew
        assert read_graph(path, ids, prints, **_bounds(ids, cfg)) is not None
