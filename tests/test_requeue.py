"""Slurm's requeue signal on CPU, without Slurm: only the training process notes it, and the save happens at the
next optimizer step, not wherever the signal lands (inside an accumulation window here), followed by one requeue.

The fit runs in its own process group with two forked DataLoader workers and Slurm's variables set; SIGUSR1 goes
to the whole group, as Slurm signals every process of a step. A stand-in ``scontrol`` records its call and then
kills the trainer with SIGKILL, as Slurm stops a requeued job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

FIT = """
import os, signal, sys
import lightning as L
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.lightning_cli import always_on_callbacks
from tests.tiny_decoder import FIXTURE, tiny_module_kwargs

class SignalTheGroup(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 2:  # the first batch of the second accumulation window of two
            os.killpg(os.getpgrp(), signal.SIGUSR1)

L.seed_everything(0)
data = TrajectoryDataModule(str(FIXTURE), batch_size=1, num_workers=2, shuffle=False)
data.setup("fit")
model = GraphAugmentedLM(**tiny_module_kwargs(sys.argv[1], data.feature_dim, val_generate=False))
callbacks = [SignalTheGroup(), *always_on_callbacks()]
trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, accumulate_grad_batches=2, limit_val_batches=0, num_sanity_val_steps=0,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=sys.argv[2], callbacks=callbacks)
trainer.fit(model, datamodule=data)
"""

SCONTROL = """#!/bin/sh
echo "$@" >> "$SCONTROL_LOG"
kill -9 $PPID
"""

SLURM_STEP = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "qgmem-train", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "0", "SLURM_NODELIST": "node1"}  # fmt: skip


def signalled_fit(llm_dir: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    """The fit above, with the callbacks every CLI run gets, under Slurm's variables and the stand-in ``scontrol`` first on PATH."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "scontrol").write_text(SCONTROL)
    (folder / "bin" / "scontrol").chmod(0o755)
    (folder / "fit.py").write_text(FIT)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = {**clean, **SLURM_STEP, "PATH": f"{folder / 'bin'}:{clean['PATH']}", "SCONTROL_LOG": str(folder / "scontrol.log"), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(folder / "fit.py"), str(llm_dir), str(folder / "run")], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600, start_new_session=True,
    )  # fmt: skip


def test_the_signal_saves_once_at_the_next_optimizer_step_and_requeues_once(llm_dir: Path, tmp_path: Path) -> None:
    result = signalled_fit(llm_dir, tmp_path)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert (tmp_path / "scontrol.log").read_text().splitlines() == ["requeue 7"], "one requeue, from the training process only"
    (saved,) = (tmp_path / "run").glob("hpc_ckpt_*.ckpt")
    checkpoint = torch.load(saved, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 2, "saved after the second optimizer step, not inside its accumulation window"
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert progress["processed"] == 4, "every batch of the two steps is in the checkpoint's progress"
