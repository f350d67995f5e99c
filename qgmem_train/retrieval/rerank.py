"""Query-aware reranking (paper III-B2): score each candidate's structured document against the question.

The rerank document holds what the paper lists: fact, source dialogue, entities, locations, fact time,
utterance time, and the trace trajectory when the unit belongs to one; a trace member also says whether
it is the trace's current state or which unit superseded it. The short structured fields
come first and the free text last, so a reranker that cuts its input to a token budget loses the end
of the dialogue, never the times or entities. A cross-encoder reads the document layout it was trained
on (``fields``, every field labelled; ``compact``; or ``context``, compact with the turn before), recorded
in its folder's ``config.json``. Rerankers:

- ``llm``: yes/no scoring in the Qwen3-Reranker formulation, p(yes) / (p(yes) + p(no)), batched;
- ``cross``: a sentence-transformers CrossEncoder (``models.reranker_model``), e.g. the one
  ``python -m qgmem_train fit-reranker`` trains (``make reranker``). When ``models.reranker_model``
  names a local folder that does not exist (not built yet), one warning line says so and how to build
  it, and the RRF order stands; a hub id that cannot be loaded is an error. On the CPU it runs in torch
  or, with ``models.reranker_runtime: onnxruntime``, in ONNX Runtime (:mod:`.onnx_rerank`);
- ``none``: no reranker; the RRF order stands (ablation).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.prompts import RERANK, RERANK_INSTRUCTION
from qgmem_train.memory.timeparse import spoken_date
from qgmem_train.memory.types import MemoryUnit, TimeSpan, Turn
from qgmem_train.retrieval.cross_encoder import UNRECORDED_LAYOUT, check_layout, load_cross_encoder, set_max_length, tokenizer_panics_refused, trained_document_layout

if TYPE_CHECKING:
    import torch

RERANKER_KINDS = ("llm", "cross", "none")
CONTEXT_WORDS = 24
"""Words of the turn before that a ``context`` document keeps, its last ones (where the question a reply answers sits)."""
BUILD_COMMANDS = {"reranker-cpu-small": "make reranker-small"}
"""The make target that trains a shipped config's cross-encoder folder, by the folder's parent; others: ``make reranker``."""
log = logging.getLogger(__name__)


def format_spans(spans: Sequence[TimeSpan], date_text: Callable[[str], str] = str) -> str:
    """``start..end`` per span (a single day as one date), each date as ``date_text`` writes it, comma-separated; ``unknown`` when there are none."""
    return ", ".join(date_text(s.start) if s.start == s.end else f"{date_text(s.start)}..{date_text(s.end)}" for s in spans) or "unknown"


def state_line(unit: MemoryUnit, current: MemoryUnit) -> str:
    """Whether ``unit`` is its trace's current state, or which unit (id and fact) superseded it."""
    if current.id == unit.id:
        return "State: current"
    return f"State: superseded by {current.id}: {current.fact_text}"


def rerank_document(
    unit: MemoryUnit, trajectory: str | None = None, current: MemoryUnit | None = None, layout: str = UNRECORDED_LAYOUT,
    before: Turn | None = None,
) -> str:
    """The structured document of one unit, as the reranker reads it; ``trajectory`` and ``current`` member of its trace if any.

    Times, entities, locations and the unit's state in its trace first (current, or superseded and by
    which unit: the reranker can pass over a state that no longer holds), then the fact, the trajectory
    and the source dialogue. ``fields`` labels every field, ``unknown`` or ``none`` included;
    ``compact`` puts the known ones on one header line, dates in words (see :func:`compact_header`);
    ``context`` is ``compact`` ending with the last :data:`CONTEXT_WORDS` words of ``before``, the turn
    before the unit's in its session (last, so a token budget cuts it before the unit's own text).
    """
    check_layout(layout, "document layout")
    if layout != "fields":
        lines = [header] if (header := compact_header(unit)) else []
    else:
        lines = [
            f"Utterance time: {unit.utterance_time or 'unknown'}",
            f"Fact time: {format_spans(unit.fact_time)}",
            f"Entities: {', '.join(unit.entities) or 'none'}",
            f"Locations: {', '.join(unit.locations) or 'none'}",
        ]
    if current is not None:
        lines.append(state_line(unit, current))
    lines.append(f"Fact: {unit.fact_text}" if layout == "fields" else unit.fact_text)
    if trajectory:
        lines.append(f"Trajectory: {trajectory}")
    if unit.source_text.strip() and unit.source_text.strip() != unit.fact_text.strip():
        lines.append(f"Source dialogue: {unit.source_text}")
    if layout == "context" and before is not None:
        words = before.text.split()
        kept = " ".join(words[-CONTEXT_WORDS:])
        lines.append(f"Turn before: {before.speaker}: {'... ' if len(words) > CONTEXT_WORDS else ''}{kept}")
    return "\n".join(lines)


def compact_header(unit: MemoryUnit) -> str:
    """``8 May 2023 | about 1 May 2023..7 May 2023 | Caroline | at Boston``: the known fields only, dates in words.

    An ISO timestamp costs a WordPiece tokenizer 16 tokens and a labelled empty field 3 to 6, a fifth of
    a turn's document; the date in words is 3 and is how LoCoMo's questions and answers name days.
    """
    parts = [spoken_date(unit.utterance_time)] if unit.utterance_time else []
    if unit.fact_time:
        parts.append("about " + format_spans(unit.fact_time, spoken_date))
    if unit.entities:
        parts.append(", ".join(unit.entities))
    if unit.locations:
        parts.append("at " + ", ".join(unit.locations))
    return " | ".join(parts)


class Reranker(Protocol):
    """Scores documents for one query; higher is more relevant."""

    name: str
    model_id: str
    document_layout: str
    """The :data:`~qgmem_train.retrieval.cross_encoder.DOCUMENT_LAYOUTS` entry its documents are written in (a reranker without it reads ``fields``)."""

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """One relevance score per document."""


class LLMReranker:
    """Yes/no relevance from a chat LLM: the Qwen3-Reranker prompt, scored in batches."""

    name = "llm"
    document_layout = UNRECORDED_LAYOUT

    def __init__(self, llm: ChatLLM, *, batch_size: int = 8, instruction: str = RERANK_INSTRUCTION):
        self.llm = llm
        self.model_id = llm.model_id
        self.batch_size = batch_size
        self.instruction = instruction

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """p(yes) / (p(yes) + p(no)) for every (query, document) pair."""
        chats = [RERANK.render(instruction=self.instruction, query=query, document=d) for d in documents]
        scores: list[float] = []
        for start in range(0, len(chats), self.batch_size):
            scores += self.llm.score_yes_no(chats[start : start + self.batch_size])
        return np.asarray(scores, dtype=np.float32)


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder over (query, document) pairs."""

    name = "cross"

    def __init__(self, ref: str, *, batch_size: int = 8, device: str = "auto", cache_dir: str | None = None, quantization: str = "none",
                 max_length: int | None = None):
        from qgmem_train.llm.resolver import pick_device, resolve_model_dir

        device = pick_device(device)
        self.model_id = ref
        self.batch_size = batch_size
        folder = resolve_model_dir(ref, cache_dir)
        self.cross_encoder = load_cross_encoder(folder, ref, device)
        self.document_layout = trained_document_layout(self.cross_encoder, folder)
        set_max_length(self.cross_encoder, max_length, ref)
        if quantization == "int8" and device == "cpu":
            quantize_linear_int8(self.cross_encoder)
        elif quantization != "none":
            log.info("reranker quantization %s is for the CPU; on %s the cross-encoder runs unquantized", quantization, device)

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """The cross-encoder's relevance score for every pair."""
        if not documents:
            return np.zeros(0, np.float32)
        pairs = [(query, d) for d in documents]
        with tokenizer_panics_refused(self.model_id):
            scores = self.cross_encoder.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        return np.asarray(scores, dtype=np.float32).reshape(-1)


def quantize_linear_int8(model: torch.nn.Module) -> None:
    """Swap every linear layer of ``model`` for torch's dynamic int8 one, in place: weights per output channel, activations per batch.

    The matrix products then run in int8 (fbgemm on x86); activations are quantized with each batch's
    own range, so a score can move slightly with the batch it is computed in. torch marks this eager
    API deprecated in favour of torchao (whose eager int8 ran half as fast on a 2-core AVX2 CPU) and warns
    on every call; the warnings are silenced here, and a torch without the API is one line.
    """
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        try:
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        except ImportError:
            raise ModelUnavailableError(f"models.reranker_quantization int8 needs torch.ao.quantization, which torch {torch.__version__} "
                                        "does not have: set it to none") from None
        quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


def names_missing_folder(ref: str) -> bool:
    """Whether a model reference is a local path (starts with ``.``, ``/`` or ``~``, or has two ``/``) that does not exist."""
    looks_local = ref.startswith((".", "/", "~")) or ref.count("/") > 1
    return looks_local and not Path(ref).expanduser().exists()


def build_command(ref: str) -> str:
    """The make target that trains the cross-encoder folder ``ref`` (``make reranker`` unless a shipped config names another)."""
    return BUILD_COMMANDS.get(Path(ref).parent.name, "make reranker")


def reranker_line(cfg: PipelineConfig, kind: str | None = None) -> str:
    """One line saying which reranker the pipeline uses (``kind``, default ``models.reranker``) and, for a
    cross-encoder folder not built yet, that the fused order stands and which make target builds it."""
    kind = kind or cfg.models.reranker
    ref = cfg.models.reranker_model
    if kind == "none":
        return "reranker: none, the fused (RRF) order stands"
    if kind == "llm":
        return f"reranker: yes/no scoring by the LLM {ref or cfg.models.llm}"
    if not ref:
        return "reranker: cross, but models.reranker_model names no CrossEncoder"
    if names_missing_folder(ref):
        return f"reranker: none yet, the fused (RRF) order stands; the trained cross-encoder {ref} is not built (`{build_command(ref)}` trains it)"
    precision = ", int8" if cfg.models.reranker_quantization == "int8" else ""
    return f"reranker: the cross-encoder {ref} ({cfg.models.reranker_runtime}{precision})"


def build_reranker(cfg: PipelineConfig, kind: str | None = None, *, llm: ChatLLM | None = None) -> Reranker | None:
    """The reranker of ``kind`` (default ``cfg.models.reranker``); ``None`` for ``none``.

    ``None`` too, with one warning line, for a ``cross`` model folder that has not been built.

    The ``llm`` kind uses ``llm`` when given, else the configured reranker LLM.
    """
    kind = kind or cfg.models.reranker
    batch_size = cfg.retrieval.rerank_batch_size
    if kind == "none":
        return None
    if kind == "llm":
        if llm is None:
            from qgmem_train.llm.factory import build_reranker_llm

            llm = build_reranker_llm(cfg)
        return LLMReranker(llm, batch_size=batch_size)
    if kind == "cross":
        ref = cfg.models.reranker_model
        if not ref:
            raise ModelUnavailableError("reranker 'cross' needs models.reranker_model (a CrossEncoder path or hub id)")
        if names_missing_folder(ref):
            log.warning("warning: cross-encoder folder %s not found (build it with `%s`); no reranker, the fused order stands", ref, build_command(ref))
            return None
        from qgmem_train.llm.resolver import pick_device

        device = pick_device(cfg.models.device)
        if cfg.models.reranker_runtime == "onnxruntime" and device == "cpu":
            from qgmem_train.retrieval.onnx_rerank import OnnxCrossEncoderReranker

            return OnnxCrossEncoderReranker(ref, batch_size=batch_size, cache_dir=cfg.models.cache_dir, quantization=cfg.models.reranker_quantization,
                                            max_length=cfg.models.reranker_max_length)
        if cfg.models.reranker_runtime == "onnxruntime":
            log.info("reranker runtime onnxruntime is for the CPU; on %s the cross-encoder runs in torch", device)
        return CrossEncoderReranker(ref, batch_size=batch_size, device=device, cache_dir=cfg.models.cache_dir,
                                    quantization=cfg.models.reranker_quantization, max_length=cfg.models.reranker_max_length)
    raise InputError("--reranker", f"unknown reranker {kind!r} (known: {', '.join(RERANKER_KINDS)})")
