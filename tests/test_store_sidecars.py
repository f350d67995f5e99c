"""Unit vectors in memory-mapped sidecar files: a load maps them rather than copying, checks each file against its
store, opens and upgrades a store of the former layout (vectors in the database), and a write killed between its
sidecar and its commit leaves the store as it was."""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.errors import InputError
from qgmem_train.memory import segments, sidecar
from qgmem_train.memory.store import MemoryStore, WindowResult
from tests import store_v3
from tests.test_store_columns import DIM, _check_memory, _embedded, _expected_rows, _unit, _write

ROOT = Path(__file__).resolve().parents[1]


def _mapped(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a memory map (no copy of the file's bytes)."""
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(base, "obj", None)
    return isinstance(base, mmap.mmap)


def _files(path: Path) -> list[str]:
    """The sidecars in the store at ``path`` (each may have a codes file beside it: tests/test_store_codes.py)."""
    return sorted(name for name in os.listdir(path / sidecar.FOLDER) if name.endswith(sidecar.SUFFIX))


def test_a_mapped_load_equals_what_was_written_and_copies_no_vector(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    items = [_embedded(_unit(i), rng) for i in range(12)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        store.add_windows("n", [WindowResult("s", 0, items)])
        memory = store.load_namespace("n")
        assert _mapped(memory.fact_embeddings) and _mapped(memory.sentence_embeddings) and _mapped(memory.attributes.embeddings)
        expected = _expected_rows(items)
        np.testing.assert_array_equal(memory.fact_embeddings, np.stack([i.fact_embedding for i in expected]))
        _check_memory(store, items)
        assert len(_files(tmp_path)) == 1
        _write(store, items[:4])  # written again: the segments change, the files they replaced go at the next write
        _write(store, items[4:6])
        _check_memory(store, items)
        store.add_windows("n", [])  # a write removes the files of the segments replaced before it
        assert set(_files(tmp_path)) == {name for (name,) in store._db.execute("SELECT name FROM segment_files")}


def test_a_sidecar_that_does_not_match_its_store_is_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        store.ensure_namespace("m", "llm", "four-d", DIM)
        store.add_windows("n", [WindowResult("s", 0, [_embedded(_unit(i), rng) for i in range(3)])])
        store.add_windows("m", [WindowResult("s", 0, [_embedded(_unit(i), rng) for i in range(5)])])
        (n_file,), (m_file,) = (store._db.execute("SELECT name FROM segment_files WHERE namespace = ?", (ns,)).fetchone() for ns in "nm")
        folder = tmp_path / sidecar.FOLDER
        good = (folder / n_file).read_bytes()
        shutil.copyfile(folder / m_file, folder / n_file)  # another segment's file under this one's name
        with pytest.raises(InputError, match="not this store's file"):
            store.load_namespace("n")
        flipped = bytearray(good)  # same size, another token
        token_at = 8 + int.from_bytes(good[:8], "little")
        flipped[token_at] ^= 0xFF
        (folder / n_file).write_bytes(bytes(flipped))
        with pytest.raises(InputError, match="token"):
            store.load_namespace("n")
        (folder / n_file).unlink()
        with pytest.raises(InputError, match="missing"):
            store.load_namespace("n")
        (folder / n_file).write_bytes(good)
        assert len(store.load_namespace("n").units) == 3


def test_a_store_of_the_former_layout_opens_upgrades_and_reads_as_written(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    items = [_embedded(_unit(i), rng) for i in range(20)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items, per_window=3)
        segment_count = len(segments.listing(store._db, "n", segments.UNITS))
    store_v3.to_version_3(tmp_path)
    with MemoryStore.open(tmp_path) as store:
        assert store._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "4"
        assert store._db.execute("SELECT COUNT(*) FROM segment_parts WHERE part != 'columns'").fetchone()[0] == 0
        assert len(_files(tmp_path)) == segment_count > 1
        _check_memory(store, items)
        more = [_embedded(_unit(i), rng) for i in range(20, 24)]
        _write(store, more)
        _check_memory(store, items + more)


_CRASH = """
import os, pickle, sys
from qgmem_train.memory import sidecar
from qgmem_train.memory.store import MemoryStore, WindowResult
written = sidecar.write
def write_then_die(*args, **kwargs):
    out = written(*args, **kwargs)
    os._exit(3)
sidecar.write = write_then_die
items = pickle.load(open(sys.argv[2], "rb"))
with MemoryStore.open(sys.argv[1]) as store:
    store.add_windows("n", [WindowResult("s", 7, items)])
"""


def test_a_write_killed_between_its_sidecar_and_its_commit_leaves_the_store_as_before(tmp_path: Path) -> None:
    import pickle

    rng = np.random.default_rng(6)
    items = [_embedded(_unit(i), rng) for i in range(6)]
    store_path = tmp_path / "store"
    with MemoryStore.open(store_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items)
        before = _files(store_path)
    more = [_embedded(_unit(i), rng) for i in range(6, 9)]
    (tmp_path / "more.pkl").write_bytes(pickle.dumps(more))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    died = subprocess.run([sys.executable, "-c", _CRASH, str(store_path), str(tmp_path / "more.pkl")], env=env, cwd=ROOT)
    assert died.returncode == 3
    orphans = set(_files(store_path)) - set(before)
    assert len(orphans) == 1  # the killed write's sidecar, referenced by nothing committed
    with MemoryStore.open(store_path) as store:
        _check_memory(store, items)
        assert store.done_windows("n") == {("s", i) for i in range(0, 6, 2)}
        _write(store, more)
        _check_memory(store, items + more)
        assert not orphans & set(_files(store_path))


def test_a_load_whose_sidecar_a_later_write_removed_reads_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    items = [_embedded(_unit(i), rng) for i in range(4)]
    with MemoryStore.open(tmp_path, create=True) as store:
        store.ensure_namespace("n", "llm", "four-d", DIM)
        _write(store, items)
        reads = []
        real = sidecar.read

        def gone_once(*args, **kwargs):
            reads.append(args[1])
            if len(reads) == 1:  # a merge committed after this read's snapshot began and the next write removed the file
                raise sidecar.SidecarMissing(args[1], "vector sidecar is missing")
            return real(*args, **kwargs)

        monkeypatch.setattr(sidecar, "read", gone_once)
        assert len(store.load_namespace("n").units) == 4 and len(reads) > 1

        def always_gone(*args, **kwargs):
            raise sidecar.SidecarMissing(args[1], "vector sidecar is missing")

        monkeypatch.setattr(sidecar, "read", always_gone)
        with pytest.raises(InputError, match="missing"):
            store.load_namespace("n")
