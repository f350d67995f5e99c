"""The top-level dispatcher: help lists every command, unknown commands and bad input exit 2."""

from __future__ import annotations

import subprocess
import sys

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


HELP_IN_ONE_PROCESS = """
import contextlib, io, sys
from qgmem_train.__main__ import main
for command in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main([command, "--help"])
        except SystemExit as exit:
            code = exit.code
    print(f"== {command} exit {code or 0} usage {'usage' in out.getvalue().lower()}")
"""
"""``COMMAND --help`` of each command given, in one interpreter: the training commands import Lightning (about 10 s) once, not once each."""


def test_every_command_has_help() -> None:
    result = subprocess.run([sys.executable, "-c", HELP_IN_ONE_PROCESS, *sorted(COMMANDS)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    summaries = [line for line in result.stdout.splitlines() if line.startswith("== ")]
    assert summaries == [f"== {command} exit 0 usage True" for command in sorted(COMMANDS)], result.stdout[-2000:]


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
