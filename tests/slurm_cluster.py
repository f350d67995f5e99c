"""A local single-node Slurm cluster for tests (through ``scripts/slurm_local.sh``), and a callback that paces a fit's ranks apart.

The cluster runs real ``slurmctld``/``slurmd`` daemons on free ports with every file under one folder;
jobs are submitted with ``sbatch`` and followed with ``scontrol``, as a user would on a real cluster.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from tests.stack_watchdog import Watchdog, pids_with_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"
CANNOT_INSTALL = 3
"""Exit code of ``slurm_local.sh`` when Slurm is missing and cannot be installed here."""
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


class SlurmUnavailable(RuntimeError):
    """Slurm is not installed and cannot be installed on this machine (no root or no apt-get)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalSlurm:
    """Start, use and stop a single-node cluster whose state, logs and config live in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        self.env.update(SLURM_CONF=str(folder / "slurm.conf"), PATH=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")

    def start(self) -> None:
        """Install Slurm when missing, then start munged, slurmctld and slurmd; raise SlurmUnavailable if it cannot be."""
        ports = {"SLURM_LOCAL_CTLD_PORT": str(_free_port()), "SLURM_LOCAL_SLURMD_PORT": str(_free_port())}
        result = subprocess.run(
            ["bash", str(SCRIPT), "start", str(self.folder)], env={**self.env, **ports}, capture_output=True, text=True, timeout=600
        )
        if result.returncode == CANNOT_INSTALL:
            raise SlurmUnavailable(result.stderr.strip())
        if result.returncode != 0:
            raise RuntimeError(f"slurm_local.sh start failed ({result.returncode}): {result.stderr.strip()}")

    def stop(self) -> None:
        """Cancel the cluster's jobs (their processes too), then stop the daemons this folder started, by their PIDs."""
        subprocess.run(["bash", str(SCRIPT), "stop", str(self.folder)], env=self.env, capture_output=True, timeout=60)

    def run(self, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> str:
        """Run a Slurm command (or a submit script) against this cluster; its stdout, or an error with its stderr."""
        result = subprocess.run(list(args), env={**self.env, **(env or {})}, cwd=cwd, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def jobs(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show job`` records of a job (one per task of an array), as key → value."""
        out = self.run("scontrol", "show", "job", "--oneliner", job_id)
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.strip()]

    def wait(self, job_id: str, timeout: float, release_requeued: bool = True, watchdog: Watchdog | None = None) -> dict[str, str]:
        """Poll until every record of the job has finished; return the last. A requeued job waits for its begin time
        (Slurm delays it by minutes): ``release_requeued`` lets it start at once. ``watchdog`` fails a job that stalls."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = self.jobs(job_id)
            if all(r["JobState"] in FINISHED for r in records):
                return records[-1]
            for record in records:
                if release_requeued and record["JobState"] == "PENDING" and record.get("Reason") == "BeginTime":
                    self.run("scontrol", "update", f"JobId={record['JobId']}", "StartTime=now")
            if watchdog is not None:
                watchdog.check(f"job {job_id}")
            time.sleep(1)
        raise TimeoutError(f"job {job_id} still {[r['JobState'] for r in self.jobs(job_id)]} after {timeout:.0f} s")

    def wait_for(self, condition: Callable[[], bool], job_id: str, timeout: float, watchdog: Watchdog | None = None) -> None:
        """Poll ``condition`` while the job runs; an error if the job finishes first, stalls (``watchdog``) or time runs out."""
        deadline = time.monotonic() + timeout
        while not condition():
            states = [r["JobState"] for r in self.jobs(job_id)]
            if all(s in FINISHED for s in states):
                raise RuntimeError(f"job {job_id} ended ({states}) before the awaited condition")
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is {states}; condition still false after {timeout:.0f} s")
            if watchdog is not None:
                watchdog.check(f"job {job_id}")
            time.sleep(0.5)

    def watchdog(self, job_id: str, watched: list[Path], stall_s: float | None = None) -> Watchdog:
        """A watchdog over what the job writes (``watched``) that dumps the stacks of every process of the job (its batch
        script, ranks and loader workers: all carry ``SLURM_JOB_ID``) to ``stacks-<job>.txt`` in the cluster's folder;
        ``stall_s`` as :class:`~tests.stack_watchdog.Watchdog` takes it (default: ``QGMEM_TEST_STALL_S`` or 240 s)."""
        return Watchdog(watched, lambda: pids_with_env("SLURM_JOB_ID", job_id), self.folder / f"stacks-{job_id}.txt", stall_s)


class PaceSteps(Callback):
    """Test-only: each rank sleeps its own random time after every batch, so the ranks reach each collective apart.

    Each rank writes its global step to ``marker_dir/rank<R>`` after every batch of a job's first run, so a test can
    send the requeue signal once training is under way, at no step the ranks were parked at. A requeued run
    (``SLURM_RESTART_COUNT`` > 0) writes nothing.
    """

    def __init__(self, marker_dir: str, max_sleep: float = 0.4) -> None:
        self.marker_dir = Path(marker_dir)
        self.max_sleep = max_sleep

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: object, batch: object, batch_idx: int) -> None:
        """Sleep a random while (its own stream, so the training's random numbers are untouched); note the step."""
        if not hasattr(self, "_random"):
            self._random = random.Random(os.getpid())
        if int(os.environ.get("SLURM_RESTART_COUNT", "0")) == 0:
            self.marker_dir.mkdir(parents=True, exist_ok=True)
            (self.marker_dir / f"rank{trainer.global_rank}").write_text(str(trainer.global_step))
        time.sleep(self._random.uniform(0, self.max_sleep))
