"""Prompt and target ids are tokenised once per example, in the loader (its worker processes when it has some), not in
the training process at every step: collated batches carry them and the training step reads them."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, tiny_module_kwargs


class NoTokenizing:
    """A tokenizer stand-in for the training process: any call fails."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the training process tokenised ({name})")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the training process tokenised")


class TokenizerGoneAtTheFirstStep(L.Callback):
    """Once the loader is set up, the module's tokenizer fails on use; batches must bring their own ids."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self.batches.append(batch)
        pl_module.tokenizer = NoTokenizing()


def test_batches_carry_the_modules_ids_and_the_training_step_does_not_tokenise(llm_dir, tmp_path) -> None:
    data = TrajectoryDataModule(str(FIXTURE), batch_size=2)
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, generation={"val_generate": False}))
    reference = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, generation={"val_generate": False}))
    seen = TokenizerGoneAtTheFirstStep()
    trainer = L.Trainer(
        accelerator="cpu", max_steps=2, limit_val_batches=0, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[seen],
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    assert trainer.global_step == 2
    batch = seen.batches[0]
    assert batch["prompts"] == [reference.prompt_ids(ex) for ex in batch["examples"]]
    assert batch["targets"] == [reference.prompt_tokens.target(ex) for ex in batch["examples"]]
    assert torch.isfinite(model.example_losses(seen.batches[1]).detach()).all()
