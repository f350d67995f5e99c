"""The prefix-cache benchmark (``bench/bench_prefix_cache.py``): its argument checks, and its quick run on the tiny decoder."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.tiny_decoder import FIXTURE, fixture_corpus, save_tiny_decoder

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("bench_prefix_cache")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--contexts", "128,lots"], "--contexts: '128,lots' is not a comma-separated list"),
        (["--contexts", "0"], "--contexts: give at least one positive token budget"),
        (["--timing-steps", "0"], "--timing-steps must be at least 1"),
        (["--data", "no/such/folder"], "--data no/such/folder: not a trajectory folder"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(bench: ModuleType, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--data", str(FIXTURE), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_quick_keeps_the_first_context_and_shortens_every_run(bench: ModuleType) -> None:
    args = bench.parse_args(["--data", str(FIXTURE), "--contexts", "600,128", "--timing-steps", "5", "--quick"])
    assert (args.contexts, args.timing_steps, args.answer_repeats, args.max_new_tokens) == ([600], 1, 1, 32)


@pytest.mark.slow
def test_quick_run_on_the_tiny_decoder_writes_both_reports(tmp_path: Path) -> None:
    """Every section runs end to end (GRetriever and the memory child processes included); the figures are not checked."""
    llm = save_tiny_decoder(tmp_path / "tiny", fixture_corpus())
    out = tmp_path / "prefix_cache.json"
    command = [sys.executable, "bench/bench_prefix_cache.py", "--quick", "--llm", str(llm), "--data", str(FIXTURE), "--contexts", "48", "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())["contexts"]["48"]
    assert report["answers"]["identical"], "greedy answers differ with the cache on and off"
    for row in report["loss_check"]:
        assert row["loss_cache_on"] == pytest.approx(row["loss_cache_off"], rel=1e-5)
        assert row["loss_hf_on_our_sequence"] == pytest.approx(row["loss_cache_off"], rel=1e-5)
    assert set(report["step"]) >= {"on_s", "off_s", "pyg_s"} and set(report["memory"]) >= {"on", "off"}
    assert "## Context budget 48 tokens" in out.with_suffix(".md").read_text()
