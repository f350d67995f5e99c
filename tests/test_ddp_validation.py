"""Validation on several ranks counts every example once: DistributedSampler pads a split that does not divide by
the ranks with repeated examples, which would weigh them twice in the logged metrics and the best-checkpoint choice."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest

from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, tiny_module_kwargs


def _validate(llm_dir: Path, root: Path, devices: int) -> dict[str, float]:
    data = TrajectoryDataModule(str(FIXTURE), batch_size=1)
    data.setup("fit")
    data.splits["validation"] = (data.splits["validation"] + data.splits["test"])[:3]
    assert len(data.splits["validation"]) == 3, "an odd split: two ranks would pad it to four"
    L.seed_everything(0)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, generation={"val_generate": False}))
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp_spawn" if devices > 1 else "auto", logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=root,
    )  # fmt: skip
    (metrics,) = trainer.validate(model, datamodule=data)
    return metrics


@pytest.mark.slow
def test_two_ranks_report_the_validation_loss_and_shuffle_gap_of_one(llm_dir: Path, tmp_path: Path) -> None:
    """Each example takes its donor's graph from the whole split, whichever rank validates either of them."""
    two, one = _validate(llm_dir, tmp_path / "two", devices=2), _validate(llm_dir, tmp_path / "one", devices=1)
    assert two["val/loss"] == pytest.approx(one["val/loss"], rel=1e-5)
    assert two["val/graph_shuffle_gap"] == pytest.approx(one["val/graph_shuffle_gap"], rel=1e-5) and one["val/graph_shuffle_gap"] != 0, (one, two)


class RefusedBeforeLoading(GraphAugmentedLM):
    """A module whose backbone must never load: the refusal comes first."""

    def configure_model(self) -> None:
        raise AssertionError("the LLM loaded before the split was refused")


@pytest.mark.slow
def test_a_validation_split_smaller_than_the_ranks_is_refused_before_the_model_loads(llm_dir: Path, tmp_path: Path) -> None:
    """Two ranks and one validation example: UnrepeatedDistributedSampler would assert after every rank loaded the LLM."""
    data = TrajectoryDataModule(str(FIXTURE), batch_size=1)
    data.setup("fit")
    data.splits["validation"] = data.splits["validation"][:1]
    model = RefusedBeforeLoading(**tiny_module_kwargs(llm_dir, data.feature_dim, generation={"val_generate": False}))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=tmp_path,
    )  # fmt: skip
    with pytest.raises(Exception, match=r"validation split: 1 example for 2 ranks") as refused:
        trainer.validate(model, datamodule=data)
    assert "InputError" in str(refused.value) and "the LLM loaded" not in str(refused.value)
