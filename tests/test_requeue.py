"""Slurm's requeue signal and SIGTERM on CPU, without Slurm: only the training process notes them, and the save happens
at the next optimizer step, not wherever the signal lands (inside an accumulation window, or mid-validation, where the
pass stops at the next batch), followed by one requeue (SIGUSR1) or the end of the fit (SIGTERM: scancel, preemption).

The fit runs in its own process group with two forked DataLoader workers and Slurm's variables set; the signal goes
to the whole group, as Slurm signals every process of a step. A stand-in ``scontrol`` records its call and then
kills the trainer with SIGKILL, as Slurm stops a requeued job.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

FIT = """
import os, signal, subprocess, sys
import lightning as L
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.lightning_cli import always_on_callbacks
from tests.tiny_decoder import FIXTURE, tiny_module_kwargs

SIGNAL, WHEN = sys.argv[3], sys.argv[4]

def signal_the_group():
    # From another process, as Slurm signals a step: a loader worker ends on a SIGTERM from its own training process.
    subprocess.run(["kill", "-s", SIGNAL.removeprefix("SIG"), "--", f"-{os.getpgrp()}"], check=False)  # kill is in the group too

class SignalTheGroup(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if WHEN == "train" and batch_idx == 2:  # the first batch of the second accumulation window of two
            signal_the_group()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if WHEN == "validation" and batch_idx == 1 and trainer.global_step == 1:  # mid-way through the first pass
            signal_the_group()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        with open(os.path.join(sys.argv[2], "validated.log"), "a") as log:
            log.write(f"{trainer.global_step} {batch_idx}\\n")

L.seed_everything(0)
data = TrajectoryDataModule(str(FIXTURE), batch_size=1, num_workers=2, shuffle=False)
data.setup("fit")
data.splits["validation"] = data.splits["train"][:3]
model = GraphAugmentedLM(**tiny_module_kwargs(sys.argv[1], data.feature_dim, generation={"val_generate": False}))
callbacks = [SignalTheGroup(), *always_on_callbacks()]
validation = {"limit_val_batches": 0} if WHEN == "train" else {"limit_val_batches": 3, "val_check_interval": 2}
trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, accumulate_grad_batches=2, num_sanity_val_steps=0, **validation,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=sys.argv[2], callbacks=callbacks)
trainer.fit(model, datamodule=data, ckpt_path=sys.argv[5] if len(sys.argv) > 5 else None)
"""

SCONTROL = """#!/bin/sh
echo "$@" >> "$SCONTROL_LOG"
kill -9 $PPID
"""

SLURM_STEP = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "qgmem-train", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "0", "SLURM_NODELIST": "node1"}  # fmt: skip


def signalled_fit(
    llm_dir: Path, folder: Path, signal_name: str = "SIGUSR1", when: str = "train", resume: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The fit above, with the callbacks every CLI run gets, under Slurm's variables and the stand-in ``scontrol`` first on PATH.

    ``signal_name`` goes to the fit's process group at its third training batch (``when="train"``) or at the second batch
    of its first validation pass (``"validation"``, after the first optimizer step); ``resume`` runs it again from that
    checkpoint (``when="none"``: no signal, validation as with ``"validation"``), in the same folder.
    """
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    (folder / "bin" / "scontrol").write_text(SCONTROL)
    (folder / "bin" / "scontrol").chmod(0o755)
    (folder / "fit.py").write_text(FIT)
    (folder / "run").mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = {**clean, **SLURM_STEP, "PATH": f"{folder / 'bin'}:{clean['PATH']}", "SCONTROL_LOG": str(folder / "scontrol.log"), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(folder / "fit.py"), str(llm_dir), str(folder / "run"), signal_name, when, *([str(resume)] if resume else [])], cwd=ROOT,
        env=env, capture_output=True, text=True,
        timeout=600, start_new_session=True,
    )  # fmt: skip


@pytest.mark.slow
def test_the_signal_saves_once_at_the_next_optimizer_step_and_requeues_once(llm_dir: Path, tmp_path: Path) -> None:
    result = signalled_fit(llm_dir, tmp_path)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert (tmp_path / "scontrol.log").read_text().splitlines() == ["requeue 7"], "one requeue, from the training process only"
    (saved,) = (tmp_path / "run").glob("hpc_ckpt_*.ckpt")
    checkpoint = torch.load(saved, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 2, "saved after the second optimizer step, not inside its accumulation window"
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert progress["processed"] == 4, "every batch of the two steps is in the checkpoint's progress"


@pytest.fixture(scope="module")
def stopped_in_validation(llm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One fit signalled at the second batch of its first validation pass, run once for the two tests below: its folder (read
    it, or copy it before resuming) and its process."""
    folder = tmp_path_factory.mktemp("stopped_in_validation")
    return folder, signalled_fit(llm_dir, folder, when="validation")


@pytest.mark.slow
def test_the_signal_during_validation_stops_the_pass_at_the_next_batch_and_saves_the_step_it_started_from(
    stopped_in_validation: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """Validation (3 batches) after the first optimizer step; the signal lands at its second batch."""
    tmp_path, result = stopped_in_validation
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert (tmp_path / "run" / "validated.log").read_text().split("\n")[:-1] == ["1 0", "1 1"], "the pass stopped after the batch that was running"
    assert (tmp_path / "scontrol.log").read_text().splitlines() == ["requeue 7"]
    (saved,) = (tmp_path / "run").glob("hpc_ckpt_*.ckpt")
    checkpoint = torch.load(saved, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 1, "saved at the step boundary the pass started from, not at the next step"
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert progress["processed"] == progress["completed"] == 2


@pytest.mark.slow
def test_a_validation_stopped_by_the_signal_runs_again_on_resume(
    llm_dir: Path, tmp_path: Path, stopped_in_validation: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    """The resumed run validates step 1 in full before training on, so no validation pass (metrics, best checkpoint) is lost."""
    stopped, result = stopped_in_validation
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    shutil.copytree(stopped, tmp_path, dirs_exist_ok=True)  # resumed in a copy: the stopped run's folder stays as it ended
    (saved,) = (tmp_path / "run").glob("hpc_ckpt_*.ckpt")
    resumed = signalled_fit(llm_dir, tmp_path, when="none", resume=saved)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    validated = (tmp_path / "run" / "validated.log").read_text().split("\n")[:-1]
    assert validated[:2] == ["1 0", "1 1"], "the first run stopped its pass after batch 1"
    assert validated[2:5] == ["1 0", "1 1", "1 2"], f"the resumed run validates step 1 again first: {validated}"
    assert "the validation at step 1 was stopped by a signal; running it again" in resumed.stderr


@pytest.mark.slow
def test_sigterm_saves_at_the_next_optimizer_step_and_ends_the_fit_without_a_requeue(llm_dir: Path, tmp_path: Path) -> None:
    """scancel or preemption: the same flag and step boundary as the requeue signal, then the fit ends (exit 143)."""
    result = signalled_fit(llm_dir, tmp_path, signal_name="SIGTERM")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert not (tmp_path / "scontrol.log").exists(), "a cancelled or preempted job is not requeued by the fit"
    (saved,) = (tmp_path / "run").glob("hpc_ckpt_*.ckpt")
    checkpoint = torch.load(saved, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 2, "saved after the second optimizer step, not inside its accumulation window"
