"""Settings a fit refuses with one line and exit 2 before it loads anything: a ``*-true`` precision, and a stale
Slurm requeue checkpoint that Lightning would silently resume from when no ``ckpt_path`` is given."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from qgmem_train.__main__ import main
from qgmem_train.model.launch_checks import stale_requeue_checkpoints
from tests.in_process import run_main

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo-cpu.yaml"
SLURM_STEP = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "qgmem-train", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "0", "SLURM_NODELIST": "node1"}  # fmt: skip


def fit(llm_dir: Path, root: Path, capfd: pytest.CaptureFixture[str], *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One CPU step of the demo config over the tiny decoder, by the command's main in this process."""
    clean = {k: None for k in os.environ if k.startswith("SLURM_")}
    command = [
        "fit", "--config", str(DEMO), "--pipeline.models.llm", str(llm_dir),
        "--trainer.default_root_dir", str(root), "--trainer.logger", "false", "--checkpoint.dirpath", str(root / "ckpt"),
        "--data.max_examples", "2", "--model.prompt.max_context_tokens", "24", "--model.encoder.hidden_dim", "32", "--model.projector.hidden_dim", "32",
        "--trainer.max_steps", "1", "--trainer.val_check_interval", "1", "--model.generation.val_generate", "false", *extra,
    ]  # fmt: skip
    return run_main(main, command, capfd, env={**clean, **(env or {})})


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_a_true_half_precision_is_refused_with_one_line(llm_dir: Path, tmp_path: Path, precision: str, capfd: pytest.CaptureFixture[str]) -> None:
    result = fit(llm_dir, tmp_path, capfd, "--trainer.precision", precision)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert f"trainer.precision: {precision} casts" in result.stderr and "bf16-mixed" in result.stderr


def test_a_stale_requeue_checkpoint_under_slurm_is_refused_with_one_line(llm_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """RESUME=none under Slurm: no ckpt_path, yet Lightning would resume from hpc_ckpt_1.ckpt of an earlier job."""
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"an earlier job's checkpoint")
    result = fit(llm_dir, tmp_path, capfd, env=SLURM_STEP)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert f"{tmp_path / 'hpc_ckpt_1.ckpt'}: a requeue checkpoint of an earlier job" in result.stderr
    assert not (tmp_path / "ckpt").exists(), "nothing trained"


def test_a_requeued_job_may_resume_its_own_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a requeue (SLURM_RESTART_COUNT > 0) the hpc checkpoint is this job's own: Lightning resumes it."""
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"x")
    for key, value in SLURM_STEP.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert stale_requeue_checkpoints(tmp_path, ckpt_path=None) == [tmp_path / "hpc_ckpt_1.ckpt"]
    assert stale_requeue_checkpoints(tmp_path, ckpt_path="last") == [], "an explicit ckpt_path wins over the hpc one"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert stale_requeue_checkpoints(tmp_path, ckpt_path=None) == []
    monkeypatch.delenv("SLURM_NTASKS")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert stale_requeue_checkpoints(tmp_path, ckpt_path=None) == [], "outside Slurm Lightning ignores hpc checkpoints"


@pytest.mark.parametrize(("every", "refused"), [(3, True), (4, False)])
def test_validation_inside_an_accumulation_window_is_refused(llm_dir: Path, tmp_path: Path, every: int, refused: bool) -> None:
    """Accumulating 2 batches a step, validating after batch 3 would checkpoint half a step's gradients, lost on resume."""
    import lightning as L

    from qgmem_train.errors import InputError
    from qgmem_train.lightning_cli import always_on_callbacks
    from qgmem_train.model.datamodule import TrajectoryDataModule
    from qgmem_train.model.module import GraphAugmentedLM
    from tests.tiny_decoder import FIXTURE, tiny_module_kwargs

    data = TrajectoryDataModule(str(FIXTURE), batch_size=1)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, generation={"val_generate": False}))
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, accumulate_grad_batches=2, val_check_interval=every, limit_val_batches=1, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=always_on_callbacks(),
    )  # fmt: skip
    if refused:
        with pytest.raises(InputError, match="trainer.val_check_interval: validates every 3 batches, inside an accumulation window of 2"):
            trainer.fit(model, datamodule=data)
        assert model.llm is None, "refused in setup, before the LLM loads and the sanity validation runs"
    else:
        trainer.fit(model, datamodule=data)
        assert trainer.global_step == 1


def test_timed_checkpoints_with_accumulation_are_refused_before_the_model_loads(llm_dir: Path, tmp_path: Path) -> None:
    """A checkpoint on a timer lands wherever the clock says, inside an accumulation window too."""
    from datetime import timedelta

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from qgmem_train.errors import InputError
    from qgmem_train.lightning_cli import always_on_callbacks
    from qgmem_train.model.datamodule import TrajectoryDataModule
    from qgmem_train.model.module import GraphAugmentedLM
    from tests.tiny_decoder import FIXTURE, tiny_module_kwargs

    data = TrajectoryDataModule(str(FIXTURE), batch_size=1)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, generation={"val_generate": False}))
    timed = ModelCheckpoint(dirpath=tmp_path / "ckpt", train_time_interval=timedelta(minutes=30))
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, accumulate_grad_batches=2, limit_val_batches=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[timed, *always_on_callbacks()],
    )  # fmt: skip
    with pytest.raises(InputError, match="checkpoint.train_time_interval: saves on a timer, inside an accumulation window of 2"):
        trainer.fit(model, datamodule=data)
    assert model.llm is None
