"""The CPU demo config end to end through the CLI: SmolLM2 + MiniLM, a few fit steps, then validate from last."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from qgmem_train.__main__ import main

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo-cpu.yaml"


def _metrics(root: Path) -> list[dict[str, str]]:
    files = sorted(root.rglob("metrics.csv"))
    assert files, f"no CSV log under {root}"
    with files[-1].open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_demo_fit_lowers_the_loss_and_validate_resumes_from_last(tmp_path) -> None:
    common = [
        "--config", str(DEMO),
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir", str(tmp_path / "logs"),
        "--checkpoint.dirpath", str(tmp_path / "ckpt"),
        "--data.max_examples", "2",
        "--model.max_context_tokens", "24",
        "--model.max_new_tokens", "12",
    ]
    assert main(["fit", *common, "--trainer.max_steps", "4", "--trainer.val_check_interval", "4", "--model.val_generate", "false"]) == 0
    losses = [float(row["train/loss"]) for row in _metrics(tmp_path / "logs") if row.get("train/loss")]
    assert len(losses) == 4
    assert losses[-1] < losses[0], f"the same batch every step, the loss should fall: {losses}"
    assert (tmp_path / "ckpt" / "last.ckpt").exists()

    assert main(["validate", *common, "--ckpt_path", "last"]) == 0
    rows = _metrics(tmp_path / "logs")
    final = next(row for row in reversed(rows) if row.get("val/json_valid"))
    assert 0.0 <= float(final["val/json_valid"]) <= 1.0 and 0.0 <= float(final["val/exact_match"]) <= 1.0
    assert float(final["val/loss"]) > 0
