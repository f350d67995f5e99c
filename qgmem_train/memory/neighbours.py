"""The nearest fact neighbours of every memory unit in bounded memory, for trace linking (paper III-A2).

Two searches by inner product of normalised vectors (cosine); no temporary exceeds ``block_bytes``:

- **exact** (up to :data:`EXACT_MAX_UNITS` units): a block of units against all units at a time,
  O(N²·d) work;
- **cells** (an inverted file, beyond that): √(:data:`PROBES` · N) centroids by spherical k-means on a
  sample; a unit belongs to the cell of its nearest centroid and is compared exactly with the units of
  its :data:`PROBES` nearest cells, one cell at a time so that each comparison is one matrix product,
  its own cell first: O(N^1.5·d) work. Each pair compared is offered to both units' lists, so two units
  meet when either probes the other's cell; a true neighbour that neither probes is missed.

:func:`extend_neighbours` adds units to lists already built: each new unit is searched like any other,
and offered to the lists of the units it met, entering where it beats their last entry. With cells, what
the new units meet is kept and merged into the lists in a few passes, not cell by cell: a 1% add meets
nearly every cell. With exact lists
the result equals an exact search over all units. With cells the new units join the cells of their
nearest centroids (the centroids stay), and an existing unit meets a new unit when the new unit probes
its cell (a rebuild would also let it probe the new unit's).

Lists hold unit rows best first; a unit with fewer candidates than k is padded with -1 (similarity
-inf). Ties at the k-th place are broken arbitrarily, as by any top-k selection.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy import sparse

BLOCK_BYTES = 256 * 2**20
"""Default bound on each temporary: similarity blocks, their partial sorts, gathered vectors."""
EXACT_MAX_UNITS = 20_000
"""Largest namespace searched exactly (about 10 s of one core); beyond it the cell search is faster (bench/results/traces.md)."""
PROBES = 16
"""Nearest cells each unit searches: 16 found 96% of the true 20 nearest at 1M synthetic units (8: 91%), 98% on
8,000 MiniLM-embedded dialogue turns (8: 94%); the search costs about 1.4 times as much as with 8."""
SAMPLE_PER_CELL = 32
"""Units sampled per centroid to train the centroids."""
KMEANS_STEPS = 3
"""Spherical k-means refinements of the centroids (from centroids drawn among the sample)."""
REBUILD_GROWTH = 2.0
"""Lists are rebuilt, centroids retrained, once a namespace outgrows this many times the units the centroids were trained on."""
SPARSE_SHARE = 1 / 16
"""A block whose candidates beating the lists so far are at most this share is merged candidate by candidate."""
_BYTES_PER_SIMILARITY = 16
"""Bytes a similarity costs in a block: the float32 itself, its int64 partial-sort index and a mask."""
KEEP_PAIRS_BLOCK = 4096
"""An add keeps every similarity its units meet while a cell's block (its queries times its members) averages at most
this many; beyond, it keeps each block's best (measured: all kept 0.32 s against 0.40 s at 100k, 5.9 s against 5.1 s at 1M)."""
_BEST_BYTES_PER_SLOT = 32
"""Bytes a slot of an added unit's best per probed cell costs: its member and similarity, their partial sort and gathers."""
_MERGE_BYTES_PER_PAIR = 48
"""Bytes a pair met by an added unit costs while merged: its member, query and column (int64), a padded float32 slot, masks."""

Block = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(query positions, candidate rows, similarities of those queries with those candidates)."""


@dataclass
class Cells:
    """The cell partition of the units: centroids and, per unit, its nearest cells."""

    centroids: np.ndarray
    """(C, d) unit-norm centroids."""
    probes: np.ndarray
    """(N, PROBES) int32 cells of each unit, nearest first; column 0 is its own cell."""
    trained_units: int
    """Units in the namespace when the centroids were trained."""


@dataclass
class NeighbourLists:
    """Each unit's k nearest other units by inner product, best first, with the cells they were searched in."""

    index: np.ndarray
    """(N, k) int32 unit rows, -1 where a unit has fewer candidates."""
    sims: np.ndarray
    """(N, k) float32 inner products, -inf where ``index`` is -1."""
    cells: Cells | None = None
    """The cell partition, or None for exact lists."""

    @property
    def k(self) -> int:
        """Neighbours per unit."""
        return self.index.shape[1]


def neighbour_count(neighbours: int, units: int) -> int:
    """The k of a namespace: ``neighbours``, or every other unit when there are fewer."""
    return max(0, min(neighbours, units - 1))


def _empty_lists(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, k), -1, np.int32), np.full((n, k), -np.inf, np.float32)


def nearest_neighbours(
    vectors: np.ndarray, neighbours: int, *, exact_max: int = EXACT_MAX_UNITS, block_bytes: int = BLOCK_BYTES, seed: int = 0
) -> NeighbourLists:
    """Each row's nearest other rows of ``vectors``: exact up to ``exact_max`` rows, else by the cell search."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n = len(vectors)
    k = neighbour_count(neighbours, n)
    lists = NeighbourLists(*_empty_lists(n, k))
    if k == 0:
        return lists
    everyone = np.arange(n)
    if n > exact_max:
        lists.cells = _train_cells(vectors, block_bytes, np.random.default_rng(seed))
        _cell_search(lists, vectors, everyone, np.ones(n, bool), block_bytes)
    else:
        for positions, columns, block in _exact_blocks(vectors, everyone, block_bytes):
            _merge_block(lists.index, lists.sims, positions, columns, block)
    _sort_lists(lists.index, lists.sims, block_bytes)
    return lists


def can_extend(lists: NeighbourLists, units: int, neighbours: int, exact_max: int = EXACT_MAX_UNITS) -> bool:
    """Whether ``lists`` can grow to ``units`` units by :func:`extend_neighbours`, rather than be rebuilt."""
    if lists.k != neighbour_count(neighbours, units) or lists.k == 0:
        return False
    if lists.cells is None:
        return units <= exact_max
    return units > exact_max and units <= REBUILD_GROWTH * lists.cells.trained_units


def extend_neighbours(lists: NeighbourLists, vectors: np.ndarray, new_rows: np.ndarray, *, block_bytes: int = BLOCK_BYTES) -> np.ndarray:
    """Fill the lists of ``new_rows`` (empty in ``lists``) and offer them to the other units' lists; return the rows whose lists changed.

    ``lists`` covers every row of ``vectors``, its other rows' lists being the search over those rows alone.
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    new_rows = np.asarray(new_rows, np.int64)
    searching = np.zeros(len(vectors), bool)
    searching[new_rows] = True
    if len(new_rows) == 0:
        return searching
    changed = searching.copy()
    if lists.cells is not None:
        lists.cells.probes[new_rows] = _nearest(vectors, new_rows, lists.cells.centroids, PROBES, block_bytes)
        _cell_search(lists, vectors, new_rows, searching, block_bytes, changed)
    else:
        last = lists.sims.min(axis=1)
        for positions, columns, block in _exact_blocks(vectors, new_rows, block_bytes):
            rows = new_rows[positions]
            _merge_block(lists.index, lists.sims, rows, columns, block)
            _offer_back(lists, rows, columns, block, searching, last, changed)
    _sort_lists(lists.index, lists.sims, block_bytes, np.flatnonzero(changed))
    return changed


def moved(lists: NeighbourLists, rows: np.ndarray, units: int) -> NeighbourLists:
    """``lists`` renumbered: its row r becomes row ``rows[r]`` of ``units`` rows; rows it lacks start empty, for :func:`extend_neighbours`."""
    rows = np.asarray(rows, np.int64)
    if np.array_equal(rows, np.arange(len(rows))):  # units were appended: every row keeps its number, no gather
        grown = lambda array, fill: np.concatenate([array, np.full((units - len(rows), *array.shape[1:]), fill, array.dtype)])  # noqa: E731
        cells = None if lists.cells is None else Cells(lists.cells.centroids, grown(lists.cells.probes, 0), lists.cells.trained_units)
        return NeighbourLists(grown(lists.index, -1), grown(lists.sims, -np.inf), cells)
    index, sims = _empty_lists(units, lists.k)
    index[rows] = np.where(lists.index >= 0, rows[np.maximum(lists.index, 0)], -1)
    sims[rows] = lists.sims
    cells = None
    if lists.cells is not None:
        probes = np.zeros((units, lists.cells.probes.shape[1]), np.int32)
        probes[rows] = lists.cells.probes
        cells = Cells(lists.cells.centroids, probes, lists.cells.trained_units)
    return NeighbourLists(index, sims, cells)


def _row_blocks(count: int, row_bytes: int, block_bytes: int) -> Iterator[slice]:
    """Consecutive slices of ``count`` rows, each costing at most ``block_bytes`` (at least one row)."""
    step = max(1, block_bytes // max(1, row_bytes))
    for lo in range(0, count, step):
        yield slice(lo, min(count, lo + step))


def _exact_blocks(vectors: np.ndarray, queries: np.ndarray, block_bytes: int) -> Iterator[Block]:
    """Blocks of ``queries`` against all rows, each query's own row at -inf."""
    n = len(vectors)
    every = np.arange(n)
    for part in _row_blocks(len(queries), n * _BYTES_PER_SIMILARITY + vectors.shape[1] * 4, block_bytes):
        positions = np.arange(part.start, part.stop)
        rows = queries[part]
        block = vectors[rows] @ vectors.T
        block[np.arange(len(rows)), rows] = -np.inf
        yield positions, every, block


def _cell_search(lists: NeighbourLists, vectors: np.ndarray, queries: np.ndarray, searching: np.ndarray, block_bytes: int, changed: np.ndarray | None = None) -> None:
    """Search ``queries`` in the cells they probe; offer every pair met to the member's list too.

    ``searching`` marks the rows searched in this run (a superset of ``queries``): a member is offered a
    query only when it will not meet that query by probing the query's cell itself. When only some rows
    search (units added), :func:`_extend_cells` merges what they meet in a few passes instead.
    """
    layout = _cell_layout(lists.cells)
    if not searching.all():
        _extend_cells(lists, layout, vectors, queries, searching, block_bytes, changed)
        return
    last = lists.sims.min(axis=1)
    # Own cells come first so that lists are filled before the other cells only offer candidates that beat them.
    for ranks in (slice(0, 1), slice(1, None)):
        for _, rows, members, block in _cell_blocks(lists.cells, layout, vectors, queries, ranks, block_bytes):
            _merge_block(lists.index, lists.sims, rows, members, block)
            last[rows] = lists.sims[rows].min(axis=1)
            if ranks.start:  # in its own cell, everyone searching meets everyone
                _offer_back(lists, rows, members, block, searching, last, changed)


def _cell_layout(cells: Cells) -> tuple[np.ndarray, np.ndarray]:
    """(rows ordered by own cell, ascending within it; where each cell's rows start in that order, C + 1 entries)."""
    own = cells.probes[:, 0]
    return np.argsort(own, kind="stable"), np.concatenate([[0], np.cumsum(np.bincount(own, minlength=len(cells.centroids)))])


def _cell_blocks(
    cells: Cells, layout: tuple[np.ndarray, np.ndarray], vectors: np.ndarray, queries: np.ndarray, ranks: slice, block_bytes: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(probes, query rows, cell members, similarities) of ``queries`` with the members of their probed cells at ``ranks``, a cell at a time.

    ``probes`` are flat positions in ``cells.probes[queries, ranks]``; a query's own row is at -inf. Each
    cell's members (ascending rows) are gathered once.
    """
    member_order, member_start = layout
    probed = cells.probes[queries, ranks]
    order = np.argsort(probed, axis=None, kind="stable")
    bounds = np.searchsorted(probed.ravel()[order], np.arange(len(cells.centroids) + 1))
    width = probed.shape[1]
    del probed
    for cell in np.flatnonzero((np.diff(bounds) > 0) & (np.diff(member_start) > 0)):
        members = member_order[member_start[cell]:member_start[cell + 1]]
        member_vectors = vectors[members]
        in_cell = order[bounds[cell]:bounds[cell + 1]]
        for part in _row_blocks(len(in_cell), len(members) * _BYTES_PER_SIMILARITY + vectors.shape[1] * 4, block_bytes):
            rows = queries[in_cell[part] // width]
            block = vectors[rows] @ member_vectors.T
            at = np.minimum(np.searchsorted(members, rows), len(members) - 1)
            self_row = np.flatnonzero(members[at] == rows)
            block[self_row, at[self_row]] = -np.inf
            yield in_cell[part], rows, members, block


def _extend_cells(
    lists: NeighbourLists, layout: tuple[np.ndarray, np.ndarray], vectors: np.ndarray, queries: np.ndarray, searching: np.ndarray, block_bytes: int, changed: np.ndarray | None
) -> None:
    """Search a few ``queries`` in the cells they probe and merge what they meet into the lists a few times, not once per cell.

    Where a cell's block of queries and members is small (about 100k units and fewer), every similarity is
    kept and merged afterwards (:func:`_extend_keeping_pairs`); where blocks are large, each block is cut
    down at once to its rows' k best and the pairs beating a member's list (:func:`_extend_keeping_best`).
    """
    sizes = np.diff(layout[1])
    probed = lists.cells.probes[queries]
    touched = np.unique(probed)
    mean_block = sizes[probed].sum() / max(1, np.count_nonzero(sizes[touched]))
    extend = _extend_keeping_pairs if mean_block <= KEEP_PAIRS_BLOCK else _extend_keeping_best
    extend(lists, layout, vectors, queries, searching, block_bytes, changed)


def _extend_keeping_pairs(
    lists: NeighbourLists, layout: tuple[np.ndarray, np.ndarray], vectors: np.ndarray, queries: np.ndarray, searching: np.ndarray, block_bytes: int, changed: np.ndarray | None
) -> None:
    """Keep every similarity the ``queries`` meet, query by query, probe by probe (4 bytes a pair, batches of queries within
    half of ``block_bytes``), then merge them (:func:`_merge_met`, within the other half)."""
    sizes = np.diff(layout[1])
    width = lists.cells.probes.shape[1]
    pair_counts = sizes[lists.cells.probes[queries]].sum(axis=1)
    last = lists.sims.min(axis=1)
    for batch in _row_blocks(len(queries), int(pair_counts.max(initial=1)) * 4, block_bytes // 2):
        rows = queries[batch]
        probed = lists.cells.probes[rows].ravel()
        lengths = sizes[probed]
        ends = np.cumsum(lengths)
        values = np.empty(int(ends[-1]), np.float32)
        for at, _, members, block in _cell_blocks(lists.cells, layout, vectors, rows, slice(None), block_bytes // 2):
            values[(ends[at] - lengths[at])[:, None] + np.arange(len(members))] = block
        for part in _row_blocks(len(rows), int(pair_counts[batch].max(initial=1)) * _MERGE_BYTES_PER_PAIR, block_bytes // 2):
            segments = slice(part.start * width, part.stop * width)
            first = int(ends[segments.start] - lengths[segments.start])
            met = values[first:int(ends[segments.stop - 1])]
            _merge_met(lists, layout, rows[part], probed[segments], lengths[segments], met, searching, last, changed)


def _extend_keeping_best(
    lists: NeighbourLists, layout: tuple[np.ndarray, np.ndarray], vectors: np.ndarray, queries: np.ndarray, searching: np.ndarray, block_bytes: int, changed: np.ndarray | None
) -> None:
    """Keep, of each cell's block, each query's k best members and the pairs beating a member's list as it was before the
    block (a superset of what enters: lists only get better); merge them per batch of queries, the pairs also when they fill
    half of ``block_bytes``."""
    k, width = lists.k, lists.cells.probes.shape[1]
    last = lists.sims.min(axis=1)
    offers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    offered = 0
    for batch in _row_blocks(len(queries), width * k * _BEST_BYTES_PER_SLOT, block_bytes // 2):
        rows = queries[batch]
        best_index, best_sims = _empty_lists(len(rows), width * k)
        for at, met_by, members, block in _cell_blocks(lists.cells, layout, vectors, rows, slice(None), block_bytes // 2):
            positions, take = at // width, min(k, len(members))
            top = np.argpartition(block, len(members) - take, axis=1)[:, len(members) - take:]
            columns = (at % width)[:, None] * k + np.arange(take)
            best_index[positions[:, None], columns] = members[top]
            best_sims[positions[:, None], columns] = np.take_along_axis(block, top, 1)
            beat, column = np.nonzero(block > last[members])
            if len(beat):
                offers.append((members[column], met_by[beat], block[beat, column]))
                offered += len(beat)
            if offered * _MERGE_BYTES_PER_PAIR > block_bytes // 2:
                _offer_collected(lists, offers, searching, last, changed)
                offered = 0
        top = np.argpartition(best_sims, best_sims.shape[1] - k, axis=1)[:, best_sims.shape[1] - k:]
        _keep_best(lists.index, lists.sims, rows, np.take_along_axis(best_index, top, 1), np.take_along_axis(best_sims, top, 1))
        last[rows] = lists.sims[rows].min(axis=1)
        _offer_collected(lists, offers, searching, last, changed)
        offered = 0


def _offer_collected(
    lists: NeighbourLists, offers: list[tuple[np.ndarray, np.ndarray, np.ndarray]], searching: np.ndarray, last: np.ndarray, changed: np.ndarray | None
) -> None:
    """Offer the collected (member, query, similarity) triples that still beat the members' lists; empties ``offers``."""
    if not offers:
        return
    members, queries, values = (np.concatenate(parts) for parts in zip(*offers))
    offers.clear()
    beats = values > last[members]
    _offer_pairs(lists, members[beats], queries[beats], values[beats], searching, last, changed)


def _merge_met(
    lists: NeighbourLists, layout: tuple[np.ndarray, np.ndarray], rows: np.ndarray, probed: np.ndarray, lengths: np.ndarray, values: np.ndarray,
    searching: np.ndarray, last: np.ndarray, changed: np.ndarray | None
) -> None:
    """Merge what ``rows`` met into every list: ``values`` are their similarities with the members of the cells ``probed`` (``lengths`` members each), query by query.

    Each of ``rows`` keeps the k best it met; each member is offered the rows beating its list.
    """
    member_order, member_start = layout
    starts = np.cumsum(lengths) - lengths
    met = member_order[np.repeat(member_start[probed] - starts, lengths) + np.arange(len(values))]
    counts = lengths.reshape(len(rows), -1).sum(axis=1)  # at least 1: a row is a member of its own cell
    first = np.cumsum(counts) - counts
    query = np.repeat(np.arange(len(rows)), counts)
    width = int(counts.max())
    padded = np.full((len(rows), width), -np.inf, np.float32)
    padded[query, np.arange(len(values)) - first[query]] = values
    take = min(lists.k, width)
    top = np.argpartition(padded, width - take, axis=1)[:, width - take:]
    top_sims = np.take_along_axis(padded, top, 1)
    top_index = np.where(np.isneginf(top_sims), -1, met[np.minimum(first[:, None] + top, len(met) - 1)]).astype(np.int32)
    _keep_best(lists.index, lists.sims, rows, top_index, top_sims)
    last[rows] = lists.sims[rows].min(axis=1)
    beats = values > last[met]
    _offer_pairs(lists, met[beats], rows[query[beats]], values[beats], searching, last, changed)


def _offer_back(
    lists: NeighbourLists, rows: np.ndarray, columns: np.ndarray, block: np.ndarray, searching: np.ndarray, last: np.ndarray, changed: np.ndarray | None
) -> None:
    """Offer each query (``rows``) to the lists of the ``columns`` it beats, unless that column meets it in its own search."""
    at, column = np.nonzero(block > last[columns][None, :])
    if len(at):
        _offer_pairs(lists, columns[column], rows[at], block[at, column], searching, last, changed)


def _offer_pairs(
    lists: NeighbourLists, members: np.ndarray, queries: np.ndarray, values: np.ndarray, searching: np.ndarray, last: np.ndarray, changed: np.ndarray | None
) -> None:
    """Offer ``queries[i]`` to the list of ``members[i]``, unless that member meets it in its own search; update ``last``."""
    offered = ~searching[members]
    if lists.cells is not None:
        probes = lists.cells.probes
        offered |= ~(probes[members] == probes[queries, :1]).any(axis=1)
    if not offered.any():
        return
    members = members[offered]
    _merge_pairs(lists.index, lists.sims, members, queries[offered], values[offered])
    last[members] = lists.sims[members].min(axis=1)
    if changed is not None:
        changed[members] = True


def _merge_block(index: np.ndarray, sims: np.ndarray, rows: np.ndarray, columns: np.ndarray, block: np.ndarray) -> None:
    """Keep, for each of ``rows``, the k best of its list and its block row (candidates ``columns``); lists stay unsorted."""
    better = block > sims[rows].min(axis=1)[:, None]
    if np.count_nonzero(better) <= SPARSE_SHARE * block.size:
        at, column = np.nonzero(better)
        if len(at):
            _merge_pairs(index, sims, rows[at], columns[column], block[at, column])
        return
    k = index.shape[1]
    take = min(k, block.shape[1])
    best = np.argpartition(block, block.shape[1] - take, axis=1)[:, block.shape[1] - take:]
    candidate_sims = np.concatenate([sims[rows], np.take_along_axis(block, best, 1)], axis=1)
    candidate_index = np.concatenate([index[rows], columns[best].astype(np.int32)], axis=1)
    keep = np.argpartition(candidate_sims, candidate_sims.shape[1] - k, axis=1)[:, candidate_sims.shape[1] - k:]
    kept_sims = np.take_along_axis(candidate_sims, keep, 1)
    sims[rows] = kept_sims
    index[rows] = np.where(np.isneginf(kept_sims), -1, np.take_along_axis(candidate_index, keep, 1))


def _merge_pairs(index: np.ndarray, sims: np.ndarray, rows: np.ndarray, neighbours: np.ndarray, values: np.ndarray) -> None:
    """Offer each ``rows[i]`` the neighbour ``neighbours[i]`` with inner product ``values[i]``; keep the k best of each list."""
    k = index.shape[1]
    if (rows[1:] < rows[:-1]).any():
        order = np.argsort(rows, kind="stable")
        rows, neighbours, values = rows[order], neighbours[order], values[order]
    starts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]]))
    unique = rows[starts]
    counts = np.diff(np.append(starts, len(rows)))
    group = np.repeat(np.arange(len(starts)), counts)
    if counts.max() > k:  # a row offered more than k: only its k best can stay
        order = np.lexsort((-values, group))
        group, neighbours, values = group[order], neighbours[order], values[order]
        kept = np.arange(len(group)) - starts[group] < k
        group, neighbours, values = group[kept], neighbours[kept], values[kept]
        counts = np.minimum(counts, k)
        starts = np.cumsum(counts) - counts
    rank = np.arange(len(group)) - starts[group]
    offered_index, offered_sims = _empty_lists(len(unique), int(counts.max()))
    offered_index[group, rank] = neighbours
    offered_sims[group, rank] = values
    _keep_best(index, sims, unique, offered_index, offered_sims)


def _keep_best(index: np.ndarray, sims: np.ndarray, rows: np.ndarray, offered_index: np.ndarray, offered_sims: np.ndarray) -> None:
    """Keep, for each of ``rows`` (distinct), the k best of its list and its row of offered candidates (-inf: none); lists stay unsorted."""
    k = index.shape[1]
    candidate_sims = np.concatenate([sims[rows], offered_sims], axis=1)
    candidate_index = np.concatenate([index[rows], offered_index], axis=1)
    keep = np.argpartition(candidate_sims, candidate_sims.shape[1] - k, axis=1)[:, candidate_sims.shape[1] - k:]
    kept_sims = np.take_along_axis(candidate_sims, keep, 1)
    sims[rows] = kept_sims
    index[rows] = np.where(np.isneginf(kept_sims), -1, np.take_along_axis(candidate_index, keep, 1))


def _sort_lists(index: np.ndarray, sims: np.ndarray, block_bytes: int, rows: np.ndarray | None = None) -> None:
    """Order the lists (at ``rows``, else all) best first, equal similarities by row (in place)."""
    rows = np.arange(len(index)) if rows is None else rows
    for part in _row_blocks(len(rows), index.shape[1] * 64, block_bytes):
        at = rows[part]
        order = np.lexsort((index[at], -sims[at]), axis=1)
        index[at] = np.take_along_axis(index[at], order, 1)
        sims[at] = np.take_along_axis(sims[at], order, 1)


def _nearest(vectors: np.ndarray, rows: np.ndarray, centroids: np.ndarray, count: int, block_bytes: int) -> np.ndarray:
    """(len(rows), count) int32: the ``count`` centroids nearest each of ``vectors[rows]``, nearest first."""
    count = min(count, len(centroids))
    out = np.empty((len(rows), count), np.int32)
    for part in _row_blocks(len(rows), len(centroids) * _BYTES_PER_SIMILARITY + vectors.shape[1] * 4, block_bytes):
        block = vectors[rows[part]] @ centroids.T
        if count == 1:
            out[part, 0] = block.argmax(axis=1)
            continue
        best = np.argpartition(block, block.shape[1] - count, axis=1)[:, block.shape[1] - count:]
        order = np.argsort(-np.take_along_axis(block, best, 1), axis=1, kind="stable")
        out[part] = np.take_along_axis(best, order, 1)
    return out


def _kmeans(points: np.ndarray, count: int, rng: np.random.Generator, block_bytes: int) -> np.ndarray:
    """``count`` unit-norm centroids of ``points`` by spherical k-means."""
    everything = np.arange(len(points))
    centroids = points[rng.choice(len(points), count, replace=False)].copy()
    for _ in range(KMEANS_STEPS):
        nearest = _nearest(points, everything, centroids, 1, block_bytes)[:, 0]
        membership = sparse.csr_matrix((np.ones(len(points), np.float32), (nearest, everything)), shape=(count, len(points)))
        sums = np.asarray(membership @ points)
        empty = np.flatnonzero(np.bincount(nearest, minlength=count) == 0)
        sums[empty] = points[rng.choice(len(points), len(empty), replace=False)]
        centroids = (sums / np.linalg.norm(sums, axis=1, keepdims=True).clip(1e-12)).astype(np.float32)
    return centroids


def _train_cells(vectors: np.ndarray, block_bytes: int, rng: np.random.Generator) -> Cells:
    """√(PROBES · N) centroids by spherical k-means on a sample, and every unit's :data:`PROBES` nearest cells."""
    n = len(vectors)
    count = min(n, max(PROBES, int(round(np.sqrt(PROBES * n)))))
    sample = vectors[np.sort(rng.choice(n, min(n, SAMPLE_PER_CELL * count), replace=False))]
    centroids = _kmeans(sample, count, rng, block_bytes)
    del sample
    return Cells(centroids, _nearest(vectors, np.arange(n), centroids, PROBES, block_bytes), n)
