"""bench/bench_serve_load.py at its smoke size, end to end on its PostgreSQL arm (two servers over one database; the
SQLite arm's one server runs the same code over a folder, whose kill-and-retry case tests/test_session_retry.py covers):
real server processes, HTTP clients across tenants, a server killed with ``kill -9`` mid-write. The invariants are
checked, never the timings; bench/bench_serve_curve.py (timings only) is checked for its refusals."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "bench"))
        return importlib.import_module("bench_serve_load")


@pytest.fixture(scope="module", params=["postgresql"])
def arm(request: pytest.FixtureRequest, bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One smoke run of the arm, its report entry (PostgreSQL: a server the pgserver wheel starts, or QGMEM_TEST_POSTGRES)."""
    out = tmp_path_factory.mktemp(request.param)
    bench.main(["--smoke", "--arms", request.param, "--out", str(out)])
    return json.loads((out / "serve_load.json").read_text())["arms"][request.param]


@pytest.mark.slow
def test_every_acknowledged_session_is_listed_whole_through_every_server(arm: dict[str, Any]) -> None:
    verified = arm["verified"]
    assert arm["requests"]["add"]["200"] >= 1 and verified["sessions"] == arm["sessions_acked"] >= 2
    assert verified["servers_checked"] == arm["servers"] and verified["lost"] == [] and verified["intruder_sessions"] == []
    assert verified["searched"] >= 1 and verified["found_by_search"] == verified["searched"]


@pytest.mark.slow
def test_no_token_reads_or_writes_another_tenants_namespace(arm: dict[str, Any]) -> None:
    isolation = arm["isolation"]
    assert isolation["namespaces_tried"] >= 1 and isolation["attempts"] >= 5 * isolation["namespaces_tried"]
    assert isolation["leaks"] == [] and arm["load_leaks"] == [] and arm["tokens_in_logs"] == 0
    assert set(arm["requests"].get("foreign", {"404": 0})) == {"404"}


@pytest.mark.slow
def test_sessions_in_flight_at_the_kill_are_retried_and_stored_once(arm: dict[str, Any]) -> None:
    fault = arm["fault"]
    assert fault["windows_of_long_session_stored_at_kill"] is not None and fault["in_flight"] >= 1
    assert len(fault["absent"]) + len(fault["whole"]) + len(fault["partial"]) == fault["in_flight"]
    assert len(fault["retried_stored_once"]) == fault["in_flight"] and fault["problems"] == []
    assert all(value is not None and value > 0 for value in arm["peak_rss_mib"])


@pytest.mark.slow
def test_a_server_killed_mid_write_leaves_no_session_visible_in_part(arm: dict[str, Any]) -> None:
    assert arm["fault"]["partial"] == []


@pytest.mark.parametrize(("arguments", "needle"), [(["--clients", "0"], "--clients"), (["--tenants", "1"], "--tenants"), (["--mix", "add=0"], "--mix")])
def test_bad_sizes_are_one_line_and_exit_2(bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], needle: str) -> None:
    assert bench.main([*arguments, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("arguments", "needle"), [(["--clients", "0"], "--clients"), (["--rates", "0", "5"], "--rates"), (["--torch-threads", "0"], "--torch-threads")])
def test_the_curve_refuses_bad_sizes_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], needle: str) -> None:
    curve = importlib.import_module("bench.bench_serve_curve")
    assert curve.main([*arguments, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and not list(tmp_path.iterdir())
