"""The CPU demo config end to end through the CLI: SmolLM2 + MiniLM, a few fit steps, then validate from last.

The logged validation metrics are checked against a recomputation from ``last.ckpt`` (loss, and the
valid-JSON and exact-match rates of the generations), so a metric that is logged from the wrong weights,
averaged wrongly or detached from the generations fails here.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from qgmem_train.__main__ import main
from qgmem_train.answer.parsing import parse_answer
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo-cpu.yaml"
MAX_NEW_TOKENS = 64
"""Room for a whole answer object: the fixture's targets are about 40 SmolLM2 tokens."""


def _metrics(root: Path) -> list[dict[str, str]]:
    files = sorted(root.rglob("metrics.csv"))
    assert files, f"no CSV log under {root}"
    with files[-1].open() as handle:
        return list(csv.DictReader(handle))


def _recompute(ckpt: Path) -> tuple[float, list[dict]]:
    """Mean per-example validation loss and the generation records of the checkpoint, outside the Trainer."""
    model = GraphAugmentedLM.load_from_checkpoint(ckpt, map_location="cpu")
    model.eval()
    data = TrajectoryDataModule.load_from_checkpoint(ckpt)
    data.setup("validate")
    losses, records = [], []
    with torch.no_grad():
        for batch in data.val_dataloader():
            losses.append(model.example_losses(batch))
            records += model.predict_step(batch, 0)
    return torch.cat(losses).mean().item(), records


@pytest.mark.slow
def test_demo_fit_lowers_the_loss_and_validate_resumes_from_last(tmp_path) -> None:
    common = [
        "--config", str(DEMO),
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir", str(tmp_path / "logs"),
        "--checkpoint.dirpath", str(tmp_path / "ckpt"),
        "--data.max_examples", "2",
        "--model.prompt.max_context_tokens", "24",
        "--model.generation.max_new_tokens", str(MAX_NEW_TOKENS),
    ]
    assert main(["fit", *common, "--trainer.max_steps", "4", "--trainer.val_check_interval", "4", "--model.generation.val_generate", "false"]) == 0
    rows = _metrics(tmp_path / "logs")
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert len(losses) == 4
    assert losses[-1] < losses[0], f"the same batch every step, the loss should fall: {losses}"
    fit_val_losses = [float(row["val/loss"]) for row in rows if row.get("val/loss")]
    assert len(fit_val_losses) == 1, "one validation, at step 4"
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    assert ckpt.exists()

    assert main(["validate", *common, "--ckpt_path", "last"]) == 0
    final = next(row for row in reversed(_metrics(tmp_path / "logs")) if row.get("val/json_valid"))
    # last.ckpt holds the weights the fit validated at step 4: reloading them gives the same loss.
    assert float(final["val/loss"]) == pytest.approx(fit_val_losses[0], rel=1e-4)

    loss, records = _recompute(ckpt)
    assert len(records) == 2
    assert float(final["val/loss"]) == pytest.approx(loss, rel=1e-4), "val/loss is the mean per-example loss of the checkpoint"
    for record in records:
        assert record["valid_json"] == (parse_answer(record["generated"]) is not None)
    assert float(final["val/json_valid"]) == pytest.approx(sum(r["valid_json"] for r in records) / len(records))
    assert float(final["val/exact_match"]) == pytest.approx(sum(r["exact_match"] for r in records) / len(records))
    # Depends on constrained decoding of the graph path (issue 13): every generation is then an answer object.
    assert float(final["val/json_valid"]) == 1.0, [r["generated"] for r in records]
