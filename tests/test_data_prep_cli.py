"""Data-prep CLI errors: one line, exit code 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "data_prep", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_unknown_setting_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"data_prep:\n  sauce: x\n  out: {tmp_path / 'out'}\n")
    result = run("--config", str(config))
    assert result.returncode == 2
    assert "data_prep.sauce: unknown setting" in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out").exists()


def test_missing_category_names_the_source(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data_prep:\n  source: {ROOT / 'samples' / 'convomem_cases'}\n  categories: {{user_evidence: 1}}\n  out: {tmp_path / 'out'}\n"
    )
    result = run("--config", str(config))
    assert result.returncode == 2
    assert "no cases for categories ['user_evidence']" in result.stderr


def test_hub_source_offline_fails_at_once(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"data_prep:\n  source: Salesforce/ConvoMem\n  out: {tmp_path / 'out'}\n")
    result = run("--config", str(config))
    assert result.returncode == 2
    assert "the Hub is offline" in result.stderr


def test_bad_shard_argument() -> None:
    result = run("--config", "x.yaml", "--shard", "3/2")
    assert result.returncode == 2
    assert "shard index 3 is not in 0..1" in result.stderr
