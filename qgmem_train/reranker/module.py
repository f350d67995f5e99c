"""The cross-encoder as a LightningModule: the bundled MiniLM's BERT encoder plus a fresh scoring head.

The model is a sentence-transformers :class:`~sentence_transformers.CrossEncoder` (a
``BertForSequenceClassification`` with one output), so training tokenizes exactly as inference does
(question and document as a pair, cut to ``max_length`` tokens, longest first) and :meth:`save`
writes the CrossEncoder folder that ``models.reranker: cross`` and sentence-transformers load as is.
Each batch holds groups of one positive document followed by its negatives; the loss is listwise
(softmax cross-entropy of the positive against its group) or pairwise (logistic loss of the positive
over each negative). With a ``teacher`` (a trained CrossEncoder, frozen), the step also minimises the
tempered KL divergence of the student's group distribution from the teacher's, so a smaller student
learns the teacher's whole ordering of each group rather than only where the positive is.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch import nn

from qgmem_train.config import BUNDLED_EMBEDDER
from qgmem_train.errors import InputError
from qgmem_train.reranker.data import RerankGroup
from qgmem_train.retrieval.cross_encoder import LAYOUT_CONFIG_KEY, UNRECORDED_LAYOUT
from qgmem_train.retrieval.rerank import build_command, names_missing_folder
from qgmem_train.schedule import warmup_cosine

SCORE_ACTIVATION = "torch.nn.modules.linear.Identity"
"""Saved activation: raw logits, which never tie the way saturated sigmoids do."""
HEAD_MODULES = ("classifier", "pooler")
"""Parameters that start (nearly) untrained and get ``head_learning_rate``: the new head and the pooler it reads."""


def group_loss(scores: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """Loss of ``scores`` (groups × documents, the positive in column 0; ``mask`` marks real documents)."""
    masked = scores.masked_fill(~mask, float("-inf"))
    if kind == "listwise":
        return nn.functional.cross_entropy(masked, torch.zeros(len(scores), dtype=torch.long, device=scores.device))
    margins = (scores[:, 1:] - scores[:, :1]).masked_select(mask[:, 1:])
    return nn.functional.softplus(margins).mean()


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """T²-scaled KL divergence of softmax(student / T) from softmax(teacher / T) over each group's real documents, averaged."""
    student_log = torch.log_softmax((student / temperature).masked_fill(~mask, float("-inf")), dim=1)
    teacher_log = torch.log_softmax((teacher / temperature).masked_fill(~mask, float("-inf")), dim=1)
    divergence = (teacher_log.exp() * (teacher_log - student_log)).masked_fill(~mask, 0.0).sum(dim=1)
    return divergence.mean() * temperature**2


class CrossEncoderModule(pl.LightningModule):
    """Trains a CrossEncoder on groups of one positive and its hard negatives."""

    def __init__(
        self,
        base_model: str = BUNDLED_EMBEDDER,
        max_length: int = 160,
        loss: Literal["listwise", "pairwise"] = "listwise",
        learning_rate: float = 4e-5,
        head_learning_rate: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_fraction: float = 0.1,
        min_lr_ratio: float = 0.0,
        chunk_size: int = 16,
        num_layers: int | None = None,
        teacher: str | None = None,
        distill_weight: float = 0.5,
        distill_temperature: float = 1.0,
        cache_dir: str | None = None,
    ) -> None:
        """
        Args:
            base_model: the encoder to start from (its BERT weights; the scoring head is new): hub id, folder or ``pkg:<package>``.
            max_length: token budget of question plus document; longer pairs lose tokens from the end of the longer part.
            loss: ``listwise`` (softmax over the group) or ``pairwise`` (positive over each negative).
            learning_rate: peak AdamW rate of the encoder.
            head_learning_rate: peak AdamW rate of the scoring head and the pooler it reads.
            weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
            warmup_fraction: share of the optimizer steps spent warming up linearly.
            min_lr_ratio: the rates decay (cosine) to this share of their peak at the last step.
            chunk_size: pairs per forward pass (a batch's pairs are sorted by length first); the loss is the same for any size.
            num_layers: keep only the base's first this many encoder layers (a smaller, faster reranker); null keeps them all.
            teacher: a trained CrossEncoder (folder or hub id) to distil from, frozen; null trains on the labels alone.
            distill_weight: share of the step's loss that is the KL to the teacher (the rest is the label loss); 0..1.
            distill_temperature: softmax temperature of both score distributions in the KL; above 0.
            cache_dir: where converted bundled models are cached.
        """
        super().__init__()
        if not 0.0 <= distill_weight <= 1.0:
            raise InputError("model.distill_weight", f"{distill_weight} is outside 0..1")
        if distill_temperature <= 0:
            raise InputError("model.distill_temperature", f"{distill_temperature} must be above 0")
        for setting, ref in (("base_model", base_model), ("teacher", teacher)):
            if ref is not None and names_missing_folder(ref):
                raise InputError(f"model.{setting}", f"folder {ref} not found (build it with `{build_command(ref)}`)")
        self.save_hyperparameters()
        self.cross_encoder = load_cross_encoder(base_model, max_length=max_length, cache_dir=cache_dir, num_layers=num_layers)
        self.teacher = None
        if teacher is not None:
            self.teacher = load_cross_encoder(teacher, max_length=max_length, cache_dir=cache_dir).eval().requires_grad_(False)

    def train(self, mode: bool = True) -> CrossEncoderModule:
        """Switch the student's mode; the teacher stays in eval mode (no dropout), whatever Lightning asks."""
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def scores(self, groups: list[RerankGroup], cross_encoder: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores of ``cross_encoder`` (the student by default): groups × longest group, padded, and the mask of real documents.

        Pairs go through the model in chunks of similar length (sorted by characters), so short pairs
        are not padded to the longest of the batch; the scores are put back in group order.
        """
        cross_encoder = self.cross_encoder if cross_encoder is None else cross_encoder
        pairs = [(g.question, d) for g in groups for d in g.documents]
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        parts = []
        for start in range(0, len(order), self.hparams.chunk_size):
            features = cross_encoder.preprocess([pairs[i] for i in order[start : start + self.hparams.chunk_size]])
            features = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
            parts.append(cross_encoder(features)["scores"].reshape(-1))
        flat = torch.empty(len(pairs), dtype=parts[0].dtype, device=parts[0].device)
        flat = flat.index_copy(0, torch.tensor(order, device=flat.device), torch.cat(parts))
        width = max(len(g.documents) for g in groups)
        mask = torch.zeros(len(groups), width, dtype=torch.bool, device=flat.device)
        for row, group in enumerate(groups):
            mask[row, : len(group.documents)] = True
        out = torch.zeros(len(groups), width, dtype=flat.dtype, device=flat.device).masked_scatter(mask, flat)
        return out, mask

    def losses(self, groups: list[RerankGroup]) -> dict[str, torch.Tensor]:
        """``label`` (the loss against the positives), ``top1``, and with a teacher ``distill``; ``loss`` is what a step minimises."""
        scores, mask = self.scores(groups)
        label = group_loss(scores, mask, self.hparams.loss)
        out = {"label": label, "loss": label, "top1": (scores.masked_fill(~mask, float("-inf")).argmax(dim=1) == 0).float().mean()}
        if self.teacher is not None:
            with torch.no_grad():
                teacher_scores, _ = self.scores(groups, self.teacher)
            out["distill"] = distillation_loss(scores, teacher_scores, mask, self.hparams.distill_temperature)
            weight = self.hparams.distill_weight
            out["loss"] = (1 - weight) * label + weight * out["distill"]
        return out

    def _step(self, groups: list[RerankGroup], stage: str) -> torch.Tensor:
        losses = self.losses(groups)
        self.log(f"{stage}/loss", losses["label"], batch_size=len(groups), prog_bar=True)
        self.log(f"{stage}/top1", losses["top1"], batch_size=len(groups))
        if "distill" in losses:
            self.log(f"{stage}/distill", losses["distill"], batch_size=len(groups))
        return losses["loss"]

    def training_step(self, batch: list[RerankGroup], batch_idx: int) -> torch.Tensor:
        """Loss of one batch of groups."""
        return self._step(batch, "train")

    def validation_step(self, batch: list[RerankGroup], batch_idx: int) -> None:
        """Validation loss and how often the positive scores first in its group."""
        self._step(batch, "val")

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW with two rates (encoder, head) and a linear warm-up then cosine decay over the run's steps."""
        hp = self.hparams
        groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
        for name, parameter in self.cross_encoder.named_parameters():
            if parameter.requires_grad:
                head = any(f".{module}." in f".{name}" for module in HEAD_MODULES)
                decay = parameter.ndim > 1
                groups.setdefault((head, decay), []).append(parameter)
        optimizer = torch.optim.AdamW([
            {"params": params, "lr": hp.head_learning_rate if head else hp.learning_rate, "weight_decay": hp.weight_decay if decay else 0.0}
            for (head, decay), params in groups.items()
        ])  # fmt: skip
        schedule = warmup_cosine(self.trainer.estimated_stepping_batches, hp.warmup_fraction, hp.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def save(self, folder: Path, document_layout: str = UNRECORDED_LAYOUT) -> None:
        """Write the CrossEncoder folder (config naming the document layout it trained on, safetensors weights, tokenizer) into ``folder``."""
        save_cross_encoder(self.cross_encoder, folder, document_layout)


def load_cross_encoder(
    ref: str, *, max_length: int | None = None, cache_dir: str | None = None, device: str = "cpu", num_layers: int | None = None
) -> Any:
    """A one-output CrossEncoder from ``ref``; a sentence-embedding checkpoint gets a new head (seeded by torch's RNG).

    ``num_layers`` keeps the checkpoint's first encoder layers only (their trained weights); it must lie
    between 1 and the checkpoint's own depth.
    """
    from sentence_transformers import CrossEncoder
    from transformers import AutoConfig

    from qgmem_train.llm.resolver import resolve_model_dir

    folder = resolve_model_dir(ref, cache_dir)
    config_kwargs = None
    if num_layers is not None:
        depth = AutoConfig.from_pretrained(str(folder)).num_hidden_layers
        if not 1 <= num_layers <= depth:
            raise InputError("model.num_layers", f"{num_layers} is outside 1..{depth}, the encoder layers of {ref}")
        config_kwargs = {"num_hidden_layers": num_layers}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CrossEncoder(str(folder), num_labels=1, max_length=max_length, device=device, activation_fn=nn.Identity(), config_kwargs=config_kwargs)


def save_cross_encoder(cross_encoder: Any, folder: Path, document_layout: str = UNRECORDED_LAYOUT) -> None:
    """Save in sentence-transformers' format, the activation also named in config.json (older loaders read it there), with the
    document layout its reranker reads (:data:`~qgmem_train.retrieval.cross_encoder.LAYOUT_CONFIG_KEY`)."""
    import sentence_transformers

    cross_encoder.model.config.sentence_transformers = {"activation_fn": SCORE_ACTIVATION, "version": sentence_transformers.__version__}
    setattr(cross_encoder.model.config, LAYOUT_CONFIG_KEY, document_layout)
    cross_encoder.save(str(folder))
