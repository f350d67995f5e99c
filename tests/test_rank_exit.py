"""Every rank ends on every fault: two CPU ranks started as srun starts them (gloo), loader workers in both, a fault
during validation. Before, a SIGTERM or an exception mid-validation left the training loader's workers running and the
rank hung at exit (the workers ignored the SIGTERM that ``multiprocessing`` ends them with), its peer in a collective.
The guard of :func:`~tests.two_ranks.run_two_ranks` only stops a hung run; the tests assert exit codes and files."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qgmem_train.model.rank_exit import STALL_EXIT_CODE
from tests.two_ranks import run_two_ranks

GUARD_S = 240.0


@pytest.mark.slow
def test_sigterm_during_validation_saves_on_both_ranks_and_both_exit_143(llm_dir: Path, tmp_path: Path) -> None:
    ended = run_two_ranks(llm_dir, tmp_path, "sigterm", "validation", guard_s=GUARD_S)
    assert ended.codes == [128 + signal.SIGTERM] * 2, (ended.codes, [e[-2000:] for e in ended.stderr])
    (saved,) = (tmp_path / "run").glob("hpc_ckpt_*.ckpt")
    assert torch.load(saved, map_location="cpu", weights_only=True)["global_step"] == 2, "the step the pass started from"


@pytest.mark.slow
def test_one_rank_raising_during_validation_ends_both(llm_dir: Path, tmp_path: Path) -> None:
    ended = run_two_ranks(llm_dir, tmp_path, "raise", "validation", guard_s=GUARD_S)
    assert None not in ended.codes and 0 not in ended.codes, (ended.codes, [e[-2000:] for e in ended.stderr])
    assert "RuntimeError: rank 1 fails on purpose" in ended.stderr[1]


@pytest.mark.slow
def test_a_stalled_rank_is_ended_by_the_watchdog_with_one_line_and_its_stacks(llm_dir: Path, tmp_path: Path) -> None:
    """Rank 1 stops mid-validation without failing; its watchdog ends it, and rank 0 does not wait for the collective's timeout."""
    ended = run_two_ranks(llm_dir, tmp_path, "stall", "validation", guard_s=GUARD_S, extra_env={"QGMEM_STALL_LIMIT_S": "20"})
    assert ended.codes[1] == STALL_EXIT_CODE and ended.codes[0] is not None and ended.codes[0] != 0, (ended.codes, [e[-2000:] for e in ended.stderr])
    (line,) = [line for line in ended.stderr[1].splitlines() if line.startswith("error: rank 1 made no progress")]
    assert "in the end of validation batch 0 at step 2" in line and "QGMEM_STALL_LIMIT_S" in line, line
    assert 'Thread' in ended.stderr[1] and "in fault" in ended.stderr[1], "every thread's stack follows the line"


WORKER = """
import os, signal, sys, time
from torch.utils.data import DataLoader
from qgmem_train.model.datamodule import ignore_sigterm

class Slow:
    def __len__(self): return 1000
    def __getitem__(self, i): time.sleep(0.05); return i

iterator = iter(DataLoader(Slow(), num_workers=1, worker_init_fn=ignore_sigterm))
next(iterator)
(worker,) = iterator._workers
print(worker.pid, flush=True)
sys.stdin.readline()  # the test has sent SIGTERM from another process
next(iterator)
print("alive" if worker.is_alive() else "dead", flush=True)
worker.terminate()  # what multiprocessing does to daemon children at exit, before it joins them
worker.join(20)
print("ended" if not worker.is_alive() else "still running", flush=True)
os._exit(0)
"""


def test_a_loader_worker_ignores_sigterm_from_another_process_and_ends_on_its_parents(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    process = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(process.stdout.readline())
        subprocess.run(["kill", "-s", "TERM", str(pid)], check=True)
        time.sleep(0.5)
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "alive", "Slurm's SIGTERM must not end a worker before the rank saves"
        assert process.stdout.readline().strip() == "ended", "the training process's own SIGTERM ends it (else the exit joins forever)"
    finally:
        process.kill()
