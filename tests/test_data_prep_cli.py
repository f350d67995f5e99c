"""Data-prep CLI errors: one line, exit code 2, never a traceback, nothing written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


MODEL_LIBRARIES = re.compile(r"\|\s+(torch|lightning|torch_geometric|transformers)$")
"""An ``-X importtime`` line of a library that only the pipeline's models need."""


def run(*args: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-m", "data_prep", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


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


@pytest.mark.parametrize(
    ("section", "message"),
    [("sauce: x", "data_prep.sauce: unknown setting"), (f"source: {ROOT / 'samples' / 'convomem_cases'}\n  categories: {{user_evidence: 1}}", "no cases for categories")],
)
def test_config_and_source_errors_come_before_the_model_libraries_load(tmp_path: Path, section: str, message: str) -> None:
    """A typo in a config is reported in a moment, not after torch, Lightning and PyG have loaded (about 10 s)."""
    config = tmp_path / "c.yaml"
    config.write_text(f"data_prep:\n  {section}\n  out: {tmp_path / 'out'}\n")
    result = run("--config", str(config), flags=("-X", "importtime"))
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert not [line for line in result.stderr.splitlines() if MODEL_LIBRARIES.search(line)]


def test_bad_shard_argument() -> None:
    result = run("--config", "x.yaml", "--shard", "3/2")
    assert result.returncode == 2
    assert "shard index 3 is not in 0..1" in result.stderr


def _main_error(args: list[str], capsys) -> str:
    """Run ``python -m data_prep`` in process; expects exit code 2 and returns its one stderr line."""
    from data_prep.__main__ import main

    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("total_cases: many", "data_prep.total_cases: expected an integer, got 'many'"),
        ("total_cases: 0", "data_prep.total_cases: must be at least 1, got 0"),
        ("seed: 1.5", "data_prep.seed: expected an integer, got 1.5"),
        ("max_sessions_per_case: 0", "data_prep.max_sessions_per_case: must be at least 1, got 0"),
        ("judge_repeats: 0", "data_prep.judge_repeats: must be at least 1, got 0"),
        ("validation_fraction: 1.5", r"data_prep.validation_fraction: must lie in [0, 1], got 1.5"),
        ("test_fraction: 0.6\n  validation_fraction: 0.6", "data_prep.test_fraction: validation_fraction + test_fraction is 1.2, above 1"),
        ("categories: [user_evidence]", "data_prep.categories: expected a mapping of string to number, got ['user_evidence']"),
        ("categories: {user_evidence: 0}", "data_prep.categories: needs non-negative weights with a positive sum"),
        ("intent: regex", "data_prep.intent: expected one of llm, rules, got 'regex'"),
        ("source: 3", "data_prep.source: expected a string, got 3"),
    ],
)
def test_a_setting_of_the_wrong_type_or_range_is_one_line(tmp_path: Path, capsys, setting: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"data_prep:\n  source: {tmp_path / 'no-such-source'}\n  out: {tmp_path / 'out'}\n  {setting}\n")
    assert _main_error(["--config", str(config)], capsys).endswith(message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"shard": 0, "num_sh', "shard.json: not valid JSON: Unterminated string starting at: line 1 column 14"),
        ("", "shard.json: not valid JSON: Expecting value: line 1 column 1"),
        ('{"shard": 0, "num_shards": "1", "fingerprint": "x", "sampling": {}, "cases": [], "done": true}', "shard.json: num_shards: missing or not int"),
        ("[1, 2]", "shard.json: expected a JSON object"),
    ],
)
@pytest.mark.parametrize("command", ["run", "merge"])
def test_a_corrupt_shard_state_is_one_line(tmp_path: Path, capsys, content: str, message: str, command: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"data_prep:\n  source: {ROOT / 'samples' / 'convomem_cases'}\n  categories: {{category_2_temporal: 1}}\n  out: {tmp_path / 'out'}\n")
    state = tmp_path / "out" / "shards" / "0-of-1" / "shard.json"
    state.parent.mkdir(parents=True)
    state.write_text(content)
    err = _main_error([command, "--config", str(config)], capsys)
    assert f"{state}" in err and message in err and "delete this shard's folder" in err
    assert state.read_text() == content
