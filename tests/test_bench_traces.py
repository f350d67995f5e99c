"""bench/bench_traces.py: the add measured with this code and a baseline checkout side by side."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("bench_traces")


def test_adds_of_both_codes_are_reported_beside_one_full_build(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "traces.json"
    assert bench.main(["--sizes", "400", "--old-max", "0", "--cells", "--baseline", str(ROOT), "--add-repeats", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {row["code"]: row for row in report["incremental"]}
    assert set(rows) == {"this", "baseline"} and rows["this"]["full_s"] == rows["baseline"]["full_s"]
    adds = [run for run in report["runs"] if run["algorithm"] == "add"]
    assert sorted(run["code"] for run in adds) == ["baseline", "this"] and all(len(run["all_seconds"]) == 2 for run in adds)
    assert all(row["traces_equal"] == 1.0 and row["added"] == 4 for row in rows.values())
    assert "| 400 | 4 | baseline |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("arguments", [["--baseline", "/nonexistent"], ["--add-repeats", "0"]])
def test_bad_arguments_end_in_one_line(bench: ModuleType, arguments: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(arguments + ["--out", str(tmp_path / "t.json")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
