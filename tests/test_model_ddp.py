"""DDP on 2 CPU processes (gloo) trains the same parameters as one process with the same global batch, with
validation generating answers and all-reducing their scores across the processes as the cluster configs do."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from qgmem_train.model.checkpoint import trainable_state_dict
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, fixture_corpus, save_tiny_decoder, tiny_module_kwargs


def _train(llm_dir, root, devices: int, batch_size: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, float]]:
    """Initial and trained trainable parameters after 2 steps, and the validation metrics (sanity check + epoch end)."""
    L.seed_everything(0)
    data = TrajectoryDataModule(str(FIXTURE), batch_size=batch_size)
    data.setup("fit")
    torch.manual_seed(0)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, generation={"val_generate": True}))
    initial = {k: v.clone() for k, v in trainable_state_dict(model).items()}
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp_spawn" if devices > 1 else "auto", max_steps=2,
        limit_val_batches=1, num_sanity_val_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=root,
    )
    trainer.fit(model, datamodule=data)
    trained = {k: v.clone() for k, v in trainer.lightning_module.state_dict().items() if k in initial}
    return initial, trained, {k: float(v) for k, v in trainer.callback_metrics.items()}


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_with_the_same_global_batch(tmp_path) -> None:
    llm_dir = save_tiny_decoder(tmp_path / "tiny", fixture_corpus())
    initial, single, _ = _train(llm_dir, tmp_path / "single", devices=1, batch_size=4)
    _, ddp, metrics = _train(llm_dir, tmp_path / "ddp", devices=2, batch_size=2)
    assert {"val/loss", "val/json_valid", "val/exact_match", "val/f1", "val/bleu1"} <= set(metrics)
    assert metrics["val/json_valid"] == 1.0, "graph-path answers decode under the answer schema"
    assert set(single) == set(ddp) == set(initial)
    assert any(not torch.equal(initial[name], single[name]) for name in single), "training changed nothing"
    for name, value in single.items():
        assert torch.allclose(value, ddp[name], atol=1e-5), name
