"""The graph-token collapse measurement (``python -m experiments.graph_token.collapse``): the spread measure and its refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.graph_token import collapse

ROOT = Path(__file__).resolve().parents[1]


def test_token_spread_is_zero_for_one_shared_vector_and_grows_with_differences() -> None:
    shared = torch.randn(8)
    assert collapse.token_spread([shared.expand(3, 8), shared.expand(2, 8)]) == pytest.approx(0.0, abs=1e-6)
    opposite = [torch.ones(1, 8), -torch.ones(1, 8)]
    assert collapse.token_spread(opposite) == pytest.approx(1.0)
    assert 0 < collapse.token_spread([shared[None], (shared + 0.1 * torch.randn(8))[None]]) < 0.1


def test_missing_trajectories_are_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "experiments.graph_token.collapse", "--trajectories", str(tmp_path / "none")], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "not a folder of trajectories" in done.stderr
