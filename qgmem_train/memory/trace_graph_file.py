"""A namespace's trace graph kept beside its store, so that adding sessions searches only the new units.

The file ``trace_graphs/<SHA-256 of the namespace>.npz`` in the store folder holds the graph of the
units the traces were last consolidated from, with each unit's id and a fingerprint of its fact and
relation embeddings (inner products with two fixed random vectors). It is a cache: a file that is
missing, unreadable, or disagrees with the namespace (a listed unit gone, or embedded differently) is
ignored and the graph built anew; one that is not a regular file (a FIFO, whose read would block) is refused in one line. Files are replaced atomically, so readers never see half of one.

Reading checks the file before allocating anything for it (the folder is as writable as the store): exactly
the members written, each uncompressed, its header's type and shape within what the namespace's units allow
(rows at most its unit count, columns at most its neighbour count and embedding size).
"""

from __future__ import annotations

import hashlib
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qgmem_train.fileio import atomic_output, open_regular
from qgmem_train.memory.neighbours import PROBES, Cells, NeighbourLists
from qgmem_train.memory.trace_graph import TraceGraph, moved_graph

log = logging.getLogger(__name__)

FOLDER = "trace_graphs"
FINGERPRINT_TOLERANCE = 1e-4
"""Largest fingerprint difference of a unit counted as unchanged (float32 round-off of one dot product)."""
_FINGERPRINT_SEED = 20240601


@dataclass
class StoredGraph:
    """A cached graph renumbered to the namespace's current units, and the rows of units it does not cover."""

    graph: TraceGraph
    new_rows: np.ndarray


_MEMBERS = {
    "ids": "u", "id_ends": "i", "fingerprints": "f", "index": "i", "sims": "f", "related": "b",
    "threshold": "f", "centroids": "f", "probes": "i", "trained_units": "i",
}  # fmt: skip
"""The arrays a cached graph holds, with the kind of each one's type."""


def graph_path(store_path: Path, namespace: str) -> Path:
    """Where the trace graph of ``namespace`` is cached in the store folder ``store_path``."""
    return Path(store_path) / FOLDER / f"{hashlib.sha256(namespace.encode('utf-8')).hexdigest()}.npz"


def fingerprints(facts: np.ndarray, relations: np.ndarray) -> np.ndarray:
    """(N, 2) float32: each unit's fact and relation embedding projected on fixed random directions."""
    directions = np.random.default_rng(_FINGERPRINT_SEED).standard_normal((2, facts.shape[1])).astype(np.float32)
    return np.stack([facts @ directions[0], relations @ directions[1]], axis=1).astype(np.float32)


def write_graph(path: Path, unit_ids: list[str], prints: np.ndarray, graph: TraceGraph) -> None:
    """Cache ``graph`` of the units ``unit_ids`` (rows in that order) at ``path``; a failed write is logged and skipped."""
    encoded = [uid.encode("utf-8") for uid in unit_ids]
    cells = graph.lists.cells
    arrays = {
        "ids": np.frombuffer(b"".join(encoded), np.uint8),
        "id_ends": np.cumsum([len(e) for e in encoded], dtype=np.int64),
        "fingerprints": prints,
        "index": graph.lists.index,
        "sims": graph.lists.sims,
        "related": graph.related,
        "threshold": np.float64(graph.threshold),
        "centroids": cells.centroids if cells is not None else np.zeros((0, 0), np.float32),
        "probes": cells.probes if cells is not None else np.zeros((0, 0), np.int32),
        "trained_units": np.int64(cells.trained_units if cells is not None else 0),
    }
    try:
        with atomic_output(path, "wb") as handle:
            np.savez(handle, **arrays)
    except OSError as exc:
        log.warning("%s: trace graph not cached (%s); the next consolidation searches every unit again", path, exc.strerror or exc)


def read_graph(path: Path, unit_ids: list[str], prints: np.ndarray, *, k: int, dim: int) -> StoredGraph | None:
    """The graph cached at ``path`` renumbered to ``unit_ids``, or None when there is none or it no longer fits them
    (``k``: the namespace's neighbours per unit, ``dim``: its embedding size, bounding what is read)."""
    units = len(unit_ids)
    bounds = {
        "ids": (sum(len(uid.encode("utf-8")) for uid in unit_ids),), "id_ends": (units,), "fingerprints": (units, 2),
        "index": (units, k), "sims": (units, k), "related": (units, k), "threshold": (), "centroids": (units, dim),
        "probes": (units, PROBES), "trained_units": (),
    }  # fmt: skip
    try:
        arrays = _read_bounded(path, bounds)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if arrays is None:
        return None
    try:
        ends = arrays["id_ends"]
        rows = cached_rows(arrays["ids"].tobytes(), ends, unit_ids)
        index, sims, related = arrays["index"], arrays["sims"], arrays["related"]
        cells = None
        if len(arrays["centroids"]):
            cells = Cells(arrays["centroids"], arrays["probes"], int(arrays["trained_units"]))
        graph = TraceGraph(NeighbourLists(index, sims, cells), related, float(arrays["threshold"]))
        shapes_agree = (
            index.shape == sims.shape == related.shape
            and len(index) == len(rows) == len(arrays["fingerprints"])
            and int(index.max(initial=-1)) < len(index)
            and (cells is None or (len(cells.probes) == len(index) and int(cells.probes.max(initial=0)) < len(cells.centroids)))
        )
    except (KeyError, UnicodeDecodeError, ValueError):
        return None
    if not shapes_agree or (rows < 0).any() or (len(rows) and np.abs(prints[rows] - arrays["fingerprints"]).max() > FINGERPRINT_TOLERANCE):
        return None
    covered = np.zeros(len(unit_ids), bool)
    covered[rows] = True
    return StoredGraph(moved_graph(graph, rows, len(unit_ids)), np.flatnonzero(~covered))


def _read_bounded(path: Path, bounds: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray] | None:
    """The arrays of the ``.npz`` at ``path`` when it holds exactly :data:`_MEMBERS`, each stored uncompressed with a
    header of its kind, as many dimensions as its bound and none larger; None otherwise, before reading any array's data."""
    with open_regular(path) as handle, zipfile.ZipFile(handle) as archive:
        infos = archive.infolist()
        if sorted(info.filename for info in infos) != sorted(f"{name}.npy" for name in _MEMBERS):
            return None
        arrays = {}
        for info in infos:
            name = info.filename.removesuffix(".npy")
            if info.compress_type != zipfile.ZIP_STORED:
                return None
            with archive.open(info) as member:
                if np.lib.format.read_magic(member) != (1, 0):
                    return None
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(member)
                if dtype.kind != _MEMBERS[name] or dtype.itemsize > 8 or fortran_order or len(shape) != len(bounds[name]):
                    return None
                if any(size > bound for size, bound in zip(shape, bounds[name])):
                    return None
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                data = bytearray(member.read(nbytes + 1))  # writable, as the arrays np.load returns
            if len(data) != nbytes:
                return None
            arrays[name] = np.frombuffer(data, dtype).reshape(shape)
    return arrays


def cached_rows(blob: bytes, ends: np.ndarray, unit_ids: list[str]) -> np.ndarray:
    """Row in ``unit_ids`` of each cached id (packed as ``blob`` and its end offsets), -1 for an id gone.

    When the cached ids are the first of ``unit_ids`` in the same order (sessions were appended) and ASCII, one
    comparison of bytes says so; otherwise each id is looked up.
    """
    head = unit_ids[: len(ends)]
    if len(head) == len(ends):
        joined = "".join(head).encode("utf-8")
        lengths = np.fromiter(map(len, head), np.int64, len(head))  # characters: bytes too when the ids are ASCII
        if len(joined) == int(lengths.sum()) and joined == blob and np.array_equal(np.cumsum(lengths), ends):
            return np.arange(len(ends), dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    row_of = {uid: row for row, uid in enumerate(unit_ids)}
    return np.asarray([row_of.get(blob[a:b].decode("utf-8"), -1) for a, b in zip(starts.tolist(), ends.tolist())], np.int64)
