"""Every results folder of the studies and the benchmarks has an INDEX.md that lists each of its files (directly, or
through a listed folder) as current or superseded, and names only files that exist: no orphan, no dead entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)]+)\)")
STATUS = re.compile(r"^(current|superseded by .+)$")


def results_folders() -> list[Path]:
    """The results folders: each study's ``experiments/<study>/results`` and ``bench/results``."""
    return sorted(REPO.glob("experiments/*/results")) + [REPO / "bench" / "results"]


def index_problems(folder: Path) -> list[str]:
    """What is wrong with ``folder``'s INDEX.md: a missing index, a row without a status, an entry that names nothing,
    or a file no entry covers."""
    index = folder / "INDEX.md"
    if not index.is_file():
        return [f"{folder}: no INDEX.md"]
    problems, listed = [], set()
    rows = [line for line in index.read_text(encoding="utf-8").splitlines() if line.startswith("| ") and LINK.search(line.split("|")[1])]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if len(cells) < 2 or not STATUS.match(cells[1]):
            problems.append(f"{index}: {cells[0]}: status is neither 'current' nor 'superseded by ...'")
        for target in LINK.findall(cells[0]):
            path = (folder / target).resolve()
            if not path.exists():
                problems.append(f"{index}: {target} does not exist")
            listed.add(path)
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and p != index):
        if not any(file == entry or entry in file.parents for entry in listed):
            problems.append(f"{index}: {file.relative_to(folder)} is not listed")
    return problems


def test_the_check_finds_an_orphan_a_dead_entry_and_a_row_without_status(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    for name in ("a.md", "runs/r.json", "orphan.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "INDEX.md").write_text(
        "| report | status | what |\n|---|---|---|\n"
        "| [a.md](a.md), [runs/](runs/) | current | a |\n"
        "| [gone.md](gone.md) | superseded by [a.md](a.md) | b |\n"
        "| [a.md](a.md) | kept | c |\n"
    )
    assert index_problems(tmp_path) == [
        f"{tmp_path / 'INDEX.md'}: gone.md does not exist",
        f"{tmp_path / 'INDEX.md'}: [a.md](a.md): status is neither 'current' nor 'superseded by ...'",
        f"{tmp_path / 'INDEX.md'}: orphan.json is not listed",
    ]
    assert index_problems(tmp_path / "runs") == [f"{tmp_path / 'runs'}: no INDEX.md"]


@pytest.mark.parametrize("folder", results_folders(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_result_file_is_indexed_and_every_entry_exists(folder: Path) -> None:
    assert index_problems(folder) == []
