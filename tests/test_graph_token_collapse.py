"""bench/graph_token_collapse.py: the spread measure and its refusals."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def collapse(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("graph_token_collapse")


def test_token_spread_is_zero_for_one_shared_vector_and_grows_with_differences(collapse: ModuleType) -> None:
    shared = torch.randn(8)
    assert collapse.token_spread([shared.expand(3, 8), shared.expand(2, 8)]) == pytest.approx(0.0, abs=1e-6)
    opposite = [torch.ones(1, 8), -torch.ones(1, 8)]
    assert collapse.token_spread(opposite) == pytest.approx(1.0)
    assert 0 < collapse.token_spread([shared[None], (shared + 0.1 * torch.randn(8))[None]]) < 0.1


def test_missing_trajectories_are_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "graph_token_collapse.py"), "--trajectories", str(tmp_path / "none")], capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "not a folder of trajectories" in done.stderr
