"""Two CPU ranks of a fit started as ``srun`` starts them (gloo, Slurm's variables, one process group), with a fault.

Each rank runs the tiny decoder's fit with two loader workers and the callbacks every CLI run gets. The fault is a
SIGTERM to the whole group, sent by another process as Slurm's ``scancel`` does, an exception on rank 1 (``raise``), or
rank 1 stopping without failing (``stall``); it comes at
the third training batch (``train``) or at the second batch of the first validation pass (``validation``). The result
holds each rank's exit code and the seconds from the fault to each rank's exit, or ``None`` for a rank still running at
the guard's limit (then the group is killed).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIT = """
import os, signal, subprocess, sys, time
import lightning as L
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.lightning_cli import always_on_callbacks
from tests.tiny_decoder import FIXTURE, tiny_module_kwargs

LLM, RUN, FAULT, WHEN = sys.argv[1:5]

def fault(trainer):
    with open(os.path.join(RUN, "fault_at"), "w") as f:
        f.write(repr(time.time()))
    if FAULT == "sigterm":
        # Another process signals the group, as slurmstepd does: the loader workers ignore it, the ranks note it.
        subprocess.run(["kill", "-s", "TERM", "--", f"-{os.getpgrp()}"], check=False)
    elif FAULT == "stall":
        time.sleep(3600)  # a rank that stops without failing: its peer waits in the next collective
    else:
        raise RuntimeError(f"rank {trainer.global_rank} fails on purpose")

class Fault(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if WHEN == "train" and batch_idx == 2 and trainer.global_rank == (0 if FAULT == "sigterm" else 1):
            fault(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if WHEN == "validation" and batch_idx == 1 and not trainer.sanity_checking and trainer.global_rank == (0 if FAULT == "sigterm" else 1):
            fault(trainer)

L.seed_everything(0)
data = TrajectoryDataModule(str(FIXTURE), batch_size=1, num_workers=2, shuffle=False)
data.setup("fit")
data.splits["validation"] = data.splits["train"][:6]
model = GraphAugmentedLM(**tiny_module_kwargs(LLM, data.feature_dim, generation={"val_generate": False}))
trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp", max_steps=6, limit_val_batches=3, val_check_interval=2,
                    num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=RUN, callbacks=[Fault(), *always_on_callbacks()])
trainer.fit(model, datamodule=data)
"""


@dataclass
class RankExits:
    """How the two ranks ended: exit codes (``None``: still running at the guard), seconds from the fault to each exit, stderr."""

    codes: list[int | None]
    seconds_to_exit: list[float | None]
    stderr: list[str]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_two_ranks(
    llm_dir: Path, folder: Path, fault: str, when: str, guard_s: float = 300.0, extra_env: dict[str, str] | None = None, root: Path = ROOT
) -> RankExits:
    """Start both ranks in one new process group, wait for both (at most ``guard_s``), kill the group if they hang.

    ``root`` is the checkout whose code the ranks run (another commit's, to time a fault before a change).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fit.py").write_text(FIT)
    run = folder / "run"
    run.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    base = {
        **clean, "PYTHONPATH": str(root), "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
        "SLURM_JOB_NAME": "qgmem-train", "SLURM_JOB_ID": "7", "SLURM_NODELIST": "localhost", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()), **(extra_env or {}),
    }  # fmt: skip
    ranks: list[subprocess.Popen[str]] = []
    for rank in (0, 1):
        env = {**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}
        group = 0 if rank == 0 else ranks[0].pid
        ranks.append(
            subprocess.Popen(
                [sys.executable, str(folder / "fit.py"), str(llm_dir), str(run), fault, when], cwd=root, env=env, stdout=subprocess.DEVNULL,
                stderr=open(folder / f"rank{rank}.err", "w"), text=True, process_group=group,
            )  # fmt: skip
        )
    ended: list[float | None] = [None, None]
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline and None in ended:
        for rank, process in enumerate(ranks):
            if ended[rank] is None and process.poll() is not None:
                ended[rank] = time.time()
        time.sleep(0.1)
    if None in ended:
        os.killpg(ranks[0].pid, signal.SIGKILL)
    for process in ranks:
        process.wait()
    fault_at = float((run / "fault_at").read_text()) if (run / "fault_at").exists() else None
    return RankExits(
        codes=[p.returncode if t is not None else None for p, t in zip(ranks, ended)],
        seconds_to_exit=[t - fault_at if t is not None and fault_at is not None else None for t in ended],
        stderr=[(folder / f"rank{rank}.err").read_text() for rank in (0, 1)],
    )
