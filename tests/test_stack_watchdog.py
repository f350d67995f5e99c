"""The watchdog of tests that wait on other processes (the Slurm test's jobs): a stall dumps every process's Python stack.

Checked without Slurm on a deliberately stuck process tree: a parent that blocks in one function after starting a child
that blocks in another, both found as a job's processes are (by a variable in their environment).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.stack_watchdog import STALL_ENV, Stalled, Watchdog, pids_with_env

STUCK_TREE = """
import subprocess, sys, time
from pathlib import Path

def parent_stuck_here(child):
    child.wait()

progress = Path(sys.argv[1])
progress.write_text("started")
child = subprocess.Popen([sys.executable, "-c", "import time\\ndef child_stuck_here():\\n    time.sleep(600)\\nchild_stuck_here()"])
progress.write_text(f"child {child.pid}")
parent_stuck_here(child)
"""


@pytest.fixture
def stuck_tree(tmp_path: Path):
    """A parent and its child, both asleep in named functions, marked by a variable in their environment; ended after."""
    token = uuid.uuid4().hex
    progress = tmp_path / "progress"
    parent = subprocess.Popen([sys.executable, "-c", STUCK_TREE, str(progress)], env={**os.environ, "QGMEM_WATCHDOG_TEST": token})
    deadline = time.monotonic() + 60
    while not (progress.exists() and progress.read_text().startswith("child")) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(progress.read_text().split()[1])
    try:
        yield token, progress, parent.pid, child
    finally:
        for pid in (child, parent.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        parent.wait(timeout=30)


def test_a_stall_dumps_the_stacks_of_parent_and_child_then_fails(stuck_tree, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token, progress, parent, child = stuck_tree
    assert sorted(pids_with_env("QGMEM_WATCHDOG_TEST", token)) == sorted([parent, child])
    artifact = tmp_path / "stacks.txt"
    watchdog = Watchdog([progress], lambda: pids_with_env("QGMEM_WATCHDOG_TEST", token), artifact, stall_s=1.0)
    deadline = time.monotonic() + 60
    with pytest.raises(Stalled) as stalled:
        while time.monotonic() < deadline:
            watchdog.check("the stuck tree")
            time.sleep(0.2)
    assert f"the stuck tree made no progress for 1 s; Python stacks of 2 processes in {artifact}" == str(stalled.value)
    dump = artifact.read_text()
    assert f"Process {parent}" in dump and "parent_stuck_here" in dump
    assert f"Process {child}" in dump and "child_stuck_here" in dump
    assert "child_stuck_here" in capsys.readouterr().out, "the dump is in the test's output too"


def test_progress_keeps_the_watchdog_quiet_until_it_stops(stuck_tree, tmp_path: Path) -> None:
    token, progress, parent, _ = stuck_tree
    watchdog = Watchdog([tmp_path], lambda: [parent], tmp_path / "stacks.txt", stall_s=1.0)
    for step in range(12):  # 2.4 s of progress, more than twice the stall limit
        (tmp_path / "steps").write_text(str(step))
        watchdog.check("a job that progresses")
        time.sleep(0.2)
    with pytest.raises(Stalled):
        for _ in range(50):
            watchdog.check("a job that stopped")
            time.sleep(0.2)
    assert "parent_stuck_here" in (tmp_path / "stacks.txt").read_text()


def test_the_stall_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(STALL_ENV, "7.5")
    assert Watchdog([tmp_path], list, tmp_path / "stacks.txt").stall_s == 7.5
    monkeypatch.delenv(STALL_ENV)
    assert Watchdog([tmp_path], list, tmp_path / "stacks.txt").stall_s == 240.0
