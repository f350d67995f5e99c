"""The top-level dispatcher: help lists every command, unknown commands and bad input exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qgmem_train.__main__ import COMMANDS


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qgmem_train", *args], capture_output=True, text=True, timeout=600)


def test_help_lists_every_command() -> None:
    result = run("--help")
    assert result.returncode == 0
    for name in COMMANDS:
        assert f"  {name}" in result.stdout


def test_unknown_command_exits_2() -> None:
    result = run("frobnicate")
    assert result.returncode == 2
    assert "unknown command 'frobnicate'" in result.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower()


def test_bad_config_is_one_line_and_exit_2(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  llmm: x\n")
    result = run("doctor", "--config", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "pipeline.models.llmm: unknown setting" in result.stderr


def test_verbose_flag_is_taken_before_dispatch() -> None:
    result = run("-v", "frobnicate", "--verbose")
    assert result.returncode == 2
    assert "unknown command 'frobnicate'" in result.stderr and "-v, --verbose" in result.stderr
