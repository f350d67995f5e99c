"""A trained cross-encoder folder as the rerankers load it, in torch or in ONNX Runtime: the model, its token cap and
the document layout its ``config.json`` records (:func:`qgmem_train.retrieval.rerank.rerank_document` writes them)."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from qgmem_train.errors import InputError, first_line, rust_panics_as_input_errors

DOCUMENT_LAYOUTS = ("fields", "compact", "context")
"""How a rerank document is written (:func:`~qgmem_train.retrieval.rerank.rerank_document`); a cross-encoder reads the layout it was trained on."""
UNRECORDED_LAYOUT = "fields"
"""The layout of a reranker that records none (every model trained before layouts) and the default of a document."""
LAYOUT_CONFIG_KEY = "qgmem_document_layout"
"""Key of a trained CrossEncoder's ``config.json`` naming its document layout; folders without it read ``fields``."""
TRAINING_RECORD = "training.json"
"""What ``fit-reranker`` (and ``average-rerankers``, ``fit-embedder``) write beside a trained model: its data, settings and scores."""


def check_layout(layout: str, where: str) -> str:
    """``layout`` when it is one of :data:`DOCUMENT_LAYOUTS`; else an :class:`InputError` at ``where``."""
    if layout not in DOCUMENT_LAYOUTS:
        raise InputError(where, f"document layout {layout!r} is not one of {', '.join(DOCUMENT_LAYOUTS)}")
    return layout


def load_cross_encoder(folder: Path, ref: str, device: str) -> Any:
    """The sentence-transformers CrossEncoder in ``folder`` (named ``ref``); a config that does not fit its weights
    (or files that are no cross-encoder) is one :class:`InputError`, not transformers' multi-line report."""
    from sentence_transformers import CrossEncoder

    try:
        with tokenizer_panics_refused(ref):
            cross_encoder = CrossEncoder(str(folder), device=device)
    except (RuntimeError, ValueError) as exc:
        raise InputError(ref, f"the cross-encoder does not load: {first_line(exc)}") from None
    check_weights_fit(cross_encoder, Path(folder) / "model.safetensors", ref)
    return cross_encoder


def check_weights_fit(cross_encoder: Any, weights: Path, ref: str) -> None:
    """Refuse a cross-encoder whose config builds a model its saved weights do not fill exactly (``model_type: gpt2``
    over BERT weights loads with every parameter newly initialised, and ranks at random; an embedder's weights leave the
    classification head new). Names are compared without the base model's prefix, as transformers loads them."""
    from safetensors import safe_open

    if not weights.is_file():
        return
    prefix = f"{getattr(cross_encoder.model, 'base_model_prefix', '')}."

    def unprefixed(names: Iterable[str]) -> set[str]:
        return {name.removeprefix(prefix) if prefix != "." else name for name in names}

    with safe_open(str(weights), framework="pt") as handle:
        saved = unprefixed(handle.keys())
    expected = unprefixed(cross_encoder.model.state_dict())
    missing, unused = sorted(expected - saved), sorted(saved - expected)
    if missing or unused:
        raise InputError(f"{ref}: config.json", f"builds a model its weights do not fit: {len(missing)} parameter(s) not in {weights.name} "
                         f"(e.g. {missing[:2]}), {len(unused)} of its tensors unused (e.g. {unused[:2]}); it would rank with new random weights")


def tokenizer_panics_refused(ref: str) -> AbstractContextManager[None]:
    """A panic of the cross-encoder ``ref``'s tokenizer (the tokenizers library on a hostile tokenizer.json, such as a
    regex past Oniguruma's backtracking limit) as one :class:`InputError` naming it, at load and on every pool."""
    return rust_panics_as_input_errors(f"{ref}: tokenizer.json", "the tokenizer")


def set_max_length(cross_encoder: Any, max_length: int | None, ref: str) -> None:
    """Cut pairs to ``max_length`` tokens (``models.reranker_max_length``; None: the model's own limit); a length past
    the model's position embeddings is refused here, not met as an index error on the first long pool."""
    if max_length is None:
        return
    positions = getattr(cross_encoder.model.config, "max_position_embeddings", None)
    if positions is not None and max_length > positions:
        raise InputError("pipeline.models.reranker_max_length", f"is {max_length}, more than the {positions} positions of the cross-encoder {ref}")
    cross_encoder.max_seq_length = max_length


def trained_document_layout(cross_encoder: Any, folder: Path) -> str:
    """The document layout the CrossEncoder of ``folder`` was trained on: its ``config.json`` record, ``fields`` without one."""
    return check_layout(getattr(cross_encoder.model.config, LAYOUT_CONFIG_KEY, UNRECORDED_LAYOUT), f"{Path(folder) / 'config.json'}: {LAYOUT_CONFIG_KEY}")
