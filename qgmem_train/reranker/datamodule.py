"""Reranker data as a LightningDataModule: pools built (or read from cache), split by conversation, grouped.

Training groups draw their negatives afresh each epoch from ``(seed, epoch)``; validation groups are
drawn once from ``seed`` alone, so every validation pass scores the same groups.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from qgmem_train.config import BUNDLED_EMBEDDER, ModelsConfig, PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.reranker.data import RerankData, RerankGroup, load_or_build, mined_pools, rerank_groups
from qgmem_train.retrieval.rerank import Reranker, build_command, build_reranker, names_missing_folder

DEFAULT_INPUT = "../shared/data/locomo/locomo_dev.json"
VALIDATION_SEED_OFFSET = 1_000_003
"""Added to the seed for the validation draw, so it never repeats a training draw."""


def _keep(batch: list[RerankGroup]) -> list[RerankGroup]:
    """Collate: a batch is the list of its groups (tokenized by the model, as at inference)."""
    return batch


class RerankDataModule(pl.LightningDataModule):
    """Groups of (question, positive document, negative documents) from LoCoMo over a turns-mode store."""

    def __init__(
        self,
        input: str = DEFAULT_INPUT,
        store: str = "out/reranker/locomo_turns",
        cache: str | None = "out/reranker/pools.json",
        val_conversations: list[str] | None = None,
        negatives: int = 7,
        batch_size: int = 4,
        seed: int = 0,
        embedder: str = BUNDLED_EMBEDDER,
        device: str = "cpu",
        document_layout: Literal["fields", "compact", "context"] = "fields",
        mine_with: str | None = None,
    ) -> None:
        """
        Args:
            input: LoCoMo file (locomo10.json schema) whose questions and gold evidence to train on.
            store: turns-mode store of the same conversations; built (or extended) when it lacks some.
            cache: JSON file of the pools and documents, reused while input, store and settings are unchanged; null: no cache.
            val_conversations: conversation ids held out for validation (never trained on); at least one.
            negatives: negative documents per positive (hard half from the pool's top 50, the rest from below).
            batch_size: groups per optimizer step (each group is 1 + negatives documents).
            seed: seed of the negative draws.
            embedder: sentence embedder of the store and the dense channel.
            device: torch device of the embedder while pools are built.
            document_layout: how each unit's document is written (``fields`` labels every field, ``compact`` puts the known
                ones on one line, dates in words: about a quarter fewer tokens; ``context`` adds the end of the turn before);
                recorded in the saved model, whose reranker then reads documents in it.
            mine_with: a trained cross-encoder folder (same document layout) whose scores reorder the training pools, so the
                hard half of the negatives is what it ranks highest (a second round of hard negatives); null: the fused order.
        """
        super().__init__()
        if not val_conversations:
            raise InputError("data.val_conversations", "name at least one conversation to hold out for validation")
        if negatives < 1 or batch_size < 1:
            raise InputError("data.negatives" if negatives < 1 else "data.batch_size", "must be at least 1")
        self.input, self.store = Path(input), Path(store)
        self.cache = Path(cache) if cache else None
        self.val_conversations = list(val_conversations)
        self.negatives, self.batch_size, self.seed = negatives, batch_size, seed
        self.document_layout = document_layout
        self.mine_with = mine_with
        self.pipeline = PipelineConfig(models=ModelsConfig(embedder=embedder, device=device))
        self.train_data: RerankData | None = None
        self.val_data: RerankData | None = None

    def setup(self, stage: str | None = None) -> None:
        """Build or load the pools, then split them by conversation."""
        if self.train_data is None:
            data = load_or_build(self.input, self.store, self.cache, self.pipeline, self.document_layout)
            self.train_data, self.val_data = data.split(self.val_conversations)
            if self.mine_with:
                self.train_data = mined_pools(self.train_data, self.mining_reranker())

    def mining_reranker(self) -> Reranker:
        """The ``mine_with`` cross-encoder as the pipeline runs it (ONNX Runtime int8 on the CPU), refused when it is missing
        or reads another document layout than the data's."""
        models = ModelsConfig(reranker="cross", reranker_model=self.mine_with, reranker_runtime="onnxruntime", reranker_quantization="int8",
                              device=self.pipeline.models.device)
        if names_missing_folder(self.mine_with):
            raise InputError("data.mine_with", f"no cross-encoder folder at {self.mine_with} (build it with `{build_command(self.mine_with)}`)")
        reranker = build_reranker(PipelineConfig(models=models))
        self.check_layout_of("data.mine_with", self.mine_with, reranker.document_layout)
        return reranker

    def check_layout_of(self, field: str, folder: str, trained: str) -> None:
        """Refuse the model of ``folder`` (named by ``field``) when it was ``trained`` on another document layout than the
        data's: it would score documents it never read."""
        if trained != self.document_layout:
            raise InputError(field, f"{folder} was trained on {trained} documents and data.document_layout is {self.document_layout}: "
                                    f"retrain it with {self.document_layout} documents (`{build_command(folder)}`) or set "
                                    f"data.document_layout to {trained}")

    def train_dataloader(self) -> DataLoader:
        """This epoch's groups, shuffled (the order follows Lightning's seed)."""
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        groups = rerank_groups(self.train_data, self.negatives, self.seed, epoch)
        return DataLoader(groups, batch_size=self.batch_size, shuffle=True, collate_fn=_keep)

    def val_dataloader(self) -> DataLoader:
        """The fixed validation groups."""
        groups = rerank_groups(self.val_data, self.negatives, self.seed + VALIDATION_SEED_OFFSET)
        return DataLoader(groups, batch_size=self.batch_size, shuffle=False, collate_fn=_keep)
