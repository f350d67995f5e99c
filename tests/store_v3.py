"""Memory stores in schema version 3's layout (every unit segment's vectors as blobs in ``segment_parts``), made from a
store of the current layout: what the upgrade to version 4 reads (tests) and what ``bench/bench_store_load.py`` loads
with the code of before the sidecars."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np

from qgmem_train.memory import segments, sidecar
from qgmem_train.memory.store import STORE_FILE


def to_version_3(path: Path) -> None:
    """Rewrite the store in folder ``path`` in version 3's layout: vectors moved from the sidecars into the database."""
    db = sqlite3.connect(path / STORE_FILE, isolation_level=None)
    folder = path / sidecar.FOLDER
    db.execute("BEGIN")
    for namespace, seq, name, size, token in db.execute("SELECT namespace, seq, name, bytes, token FROM segment_files").fetchall():
        for part, vectors in sidecar.read(folder, name, size, token, f"namespace {namespace}, segment {seq}").items():
            blob = memoryview(np.ascontiguousarray(vectors).reshape(-1).view(np.uint8))
            rows = [(namespace, segments.UNITS, seq, part, k, bytes(blob[at:at + segments.PIECE_BYTES]))
                    for k, at in enumerate(range(0, max(len(blob), 1), segments.PIECE_BYTES))]  # fmt: skip
            db.executemany("INSERT INTO segment_parts VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.execute("DROP TABLE segment_files")
    db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    shutil.rmtree(folder)
