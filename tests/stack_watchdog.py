"""A watchdog for tests that wait on other processes: when nothing they write changes for a while, it dumps the Python
stack of every watched process with py-spy, into the test's output and an artifact file, then fails the wait.

A requeued Slurm job once hung with both ranks and four loader workers alive at 0% CPU and was not reproduced in 14 later
runs; with this, the next occurrence names where each process waits. The stall limit is ``QGMEM_TEST_STALL_S`` seconds
(default 240: a rank writes its step marker and metrics every step, and loading takes under a minute here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

STALL_ENV = "QGMEM_TEST_STALL_S"
DEFAULT_STALL_S = 240.0


class Stalled(RuntimeError):
    """The watched processes made no progress for the stall limit; the message names the stack dump."""


def pids_with_env(name: str, value: str) -> list[int]:
    """Processes whose environment sets ``name`` to ``value`` (a Slurm job's: ``SLURM_JOB_ID``; forked workers inherit it)."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # ended meanwhile, or another user's
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def py_spy() -> str | None:
    """The py-spy executable: beside this interpreter (the venv's, from the test extra) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump_stacks(pids: list[int], artifact: Path) -> str:
    """``py-spy dump --pid`` of each process (what it printed, or why it could not), written to ``artifact``; the text."""
    spy = py_spy()
    sections = []
    for pid in sorted(pids):
        if spy is None:
            sections.append(f"== pid {pid}: py-spy is not installed (pip install -e '.[test]')")
            continue
        try:
            result = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            sections.append(f"== pid {pid} (py-spy exit {result.returncode})\n{result.stdout}{result.stderr}")
        except subprocess.TimeoutExpired:
            sections.append(f"== pid {pid}: py-spy dump did not return in 60 s")
    text = "\n".join(sections) + "\n"
    artifact.parent.mkdir(parents=True, exist_ok=True)
    artifact.write_text(text)
    return text


def files_under(root: Path) -> list[Path]:
    """``root`` itself when it is a file, else every file under it (none while it does not exist)."""
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


class Watchdog:
    """Fails a wait whose ``watched`` files (folders: every file under them) have not changed for ``stall_s`` seconds,
    after dumping the stacks of ``processes()`` to ``artifact`` and to stdout."""

    def __init__(self, watched: list[Path], processes: Callable[[], list[int]], artifact: Path, stall_s: float | None = None) -> None:
        self.watched, self.processes, self.artifact = watched, processes, artifact
        self.stall_s = stall_s if stall_s is not None else float(os.environ.get(STALL_ENV, DEFAULT_STALL_S))
        self._seen: tuple[int, ...] = ()
        self._since = time.monotonic()

    def progress(self) -> tuple[int, ...]:
        """Size and modification time of every watched file: anything a job writes changes it."""
        state = []
        for path in (p for root in self.watched for p in files_under(root)):
            try:
                info = path.stat()
            except OSError:  # removed meanwhile
                continue
            state += [info.st_size, info.st_mtime_ns]
        return tuple(state)

    def check(self, what: str) -> None:
        """Note progress; past the stall limit without any, dump the stacks and raise :class:`Stalled` naming ``what``."""
        seen = self.progress()
        if seen != self._seen:
            self._seen, self._since = seen, time.monotonic()
            return
        if time.monotonic() - self._since < self.stall_s:
            return
        pids = self.processes()
        print(dump_stacks(pids, self.artifact), flush=True)
        raise Stalled(f"{what} made no progress for {self.stall_s:g} s; Python stacks of {len(pids)} processes in {self.artifact}")
