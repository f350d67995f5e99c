"""Atomic file output: readers see the old file or the complete new one, never half of it."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_output(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A file handle whose content replaces ``path`` only when the block completes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON to ``path`` atomically."""
    with atomic_output(Path(path)) as handle:
        json.dump(value, handle, indent=2, ensure_ascii=False, default=str)
        handle.write("\n")


def write_report_atomic(path: Path, value: Any, markdown: str) -> None:
    """Write ``value`` as JSON to ``path`` and ``markdown`` beside it (``.md``), each atomically."""
    write_json_atomic(path, value)
    with atomic_output(Path(path).with_suffix(".md")) as handle:
        handle.write(markdown)
