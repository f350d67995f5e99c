"""Reranker training data from the pipeline itself: gold units and hard negatives from the fused candidate pool.

For every LoCoMo question (categories 1-4 with gold evidence) over a turns-mode store, the question
is activated without a reranker (rule-based intent, the configured channels and RRF): the fused pool
of ``retrieval.n`` units is kept in order, and every unit whose source turns hold gold evidence is a
positive. Negatives are the pool minus the gold units, drawn half from the pool's first
:data:`HARD_TOP` ranks and half from below (a model shown only top-ranked negatives ranks the bottom
half of the pool into its top 10). Documents are :meth:`~qgmem_train.retrieval.activation.ActivationIndex.document`,
exactly what the reranker reads at inference; the token budget is applied by the model's tokenizer.
Splits are by conversation, so no validation question shares a dialogue with a training one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig, RetrievalConfig
from qgmem_train.errors import InputError
from qgmem_train.fileio import read_text, write_json_atomic
from qgmem_train.memory.store_uri import shown_store
from qgmem_train.retrieval.cross_encoder import UNRECORDED_LAYOUT
from qgmem_train.retrieval.rerank import Reranker

HARD_TOP = 50
"""Pool ranks above this count as the hard half of the negatives."""
DATA_VERSION = 1


def ensure_turns_store(input_path: Path, store: Path, *, dataset: str = "locomo", embedder: str = BUNDLED_EMBEDDER,
                       conversations: Sequence[str] | None = None) -> None:
    """Build, or extend, a turns-mode store (no LLM, no traces) of every conversation of the input, or of ``conversations``.

    The build resumes: conversations already stored are left as they are, so a complete store costs only the check.
    """
    from qgmem_train.config import ConstructionConfig, ModelsConfig
    from qgmem_train.memory.loaders import load_conversations
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.pipeline.construction import build_conversations
    from qgmem_train.pipeline.models import PipelineModels

    found = load_conversations(dataset, str(input_path), list(conversations) if conversations else None)
    if not found:
        raise InputError(str(input_path), "no conversations found")
    cfg = PipelineConfig(models=ModelsConfig(embedder=embedder), construction=ConstructionConfig(units="turns", traces=False))
    with MemoryStore.open(store, create=True) as memory_store:
        build_conversations(memory_store, found, PipelineModels(cfg))


@dataclass
class RerankExample:
    """One question, its fused candidate pool (unit ids, best first) and its gold units (in the pool or not)."""

    conversation_id: str
    qa_index: int
    category: int
    question: str
    pool: list[str]
    gold: list[str]

    def negatives(self) -> list[tuple[int, str]]:
        """(pool rank from 0, unit id) of every pool unit that is not gold, best first."""
        gold = set(self.gold)
        return [(rank, uid) for rank, uid in enumerate(self.pool) if uid not in gold]


@dataclass
class RerankData:
    """Examples and the rerank document of every unit they name, per conversation."""

    examples: list[RerankExample]
    documents: dict[str, dict[str, str]]
    """conversation id → unit id → rerank document."""
    source: dict[str, Any] = field(default_factory=dict)
    """What the data was built from: input digest, store, embedder, retrieval settings."""

    @property
    def conversations(self) -> list[str]:
        """Conversation ids of the examples, in order of first appearance."""
        return list(dict.fromkeys(e.conversation_id for e in self.examples))

    def document(self, example: RerankExample, unit_id: str) -> str:
        """The rerank document of ``unit_id`` in the example's conversation."""
        return self.documents[example.conversation_id][unit_id]

    def subset(self, conversations: Sequence[str]) -> RerankData:
        """The examples (and documents) of ``conversations`` only."""
        keep = set(conversations)
        return RerankData(
            [e for e in self.examples if e.conversation_id in keep],
            {cid: docs for cid, docs in self.documents.items() if cid in keep},
            dict(self.source),
        )

    def split(self, validation: Sequence[str]) -> tuple[RerankData, RerankData]:
        """(train, validation) by conversation: ``validation`` names the held-out conversations, each must have examples."""
        unknown = [cid for cid in validation if cid not in self.documents]
        if unknown:
            raise InputError("data.val_conversations", f"{unknown[0]!r} has no questions in the data (known: {', '.join(self.conversations)})")
        held_out = set(validation)
        train = [cid for cid in self.conversations if cid not in held_out]
        if not train:
            raise InputError("data.val_conversations", "every conversation is held out; none is left to train on")
        return self.subset(train), self.subset(list(validation))

    def save(self, path: Path) -> None:
        """Write as one JSON file, atomically."""
        write_json_atomic(path, {"version": DATA_VERSION, "source": self.source, "examples": [asdict(e) for e in self.examples],
                                 "documents": self.documents})

    @classmethod
    def load(cls, path: Path) -> RerankData:
        """Read a file written by :meth:`save`; a malformed one is an :class:`InputError` naming it."""
        try:
            raw = json.loads(read_text(path, kind="reranker data file"))
            if raw.get("version") != DATA_VERSION:
                raise InputError(str(path), f"reranker data version {raw.get('version')!r}, expected {DATA_VERSION}")
            return cls([RerankExample(**e) for e in raw["examples"]], raw["documents"], raw.get("source", {}))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(str(path), f"not a reranker data file ({type(exc).__name__}: {exc})") from None


def data_source(input_path: Path, store: Path, embedder: str, retrieval: RetrievalConfig, document_layout: str) -> dict[str, Any]:
    """What a data file depends on; a cached file whose source differs is rebuilt."""
    digest = hashlib.sha256(Path(input_path).read_bytes()).hexdigest()[:16]
    return {"input": str(input_path), "input_sha256": digest, "store": shown_store(store), "embedder": embedder, "retrieval": asdict(retrieval),
            "document_layout": document_layout}


def build_rerank_data(input_path: Path, store: Path, cfg: PipelineConfig, conversations: Sequence[str] | None = None,
                      document_layout: str = UNRECORDED_LAYOUT) -> RerankData:
    """Fused pools and gold units of every LoCoMo question of the stored conversations (rule-based intents, no reranker), documents in ``document_layout``."""
    from qgmem_train.benchmarks.question_batches import locomo_question_batches
    from qgmem_train.llm.factory import build_embedder
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.retrieval.activation import activate

    embedder = build_embedder(cfg)
    examples: list[RerankExample] = []
    documents: dict[str, dict[str, str]] = {}
    with MemoryStore.open(store) as memory_store:
        for batch in locomo_question_batches(Path(input_path), memory_store, embedder, cfg.retrieval, conversations):
            cid, memory, index = batch.conversation_id, batch.memory, batch.index
            units = {u.id: u for u in memory.units}
            docs = documents.setdefault(cid, {})
            for q, intent, vectors in batch.items():
                evidence = set(q.evidence)
                gold = [u.id for u in memory.units if evidence.intersection(u.source_turn_ids)]
                if not gold:
                    continue
                wm = activate(q.question, batch.question_time, memory, cfg=cfg.retrieval, llm=None, embedder=embedder, reranker=None,
                              index=index, intent=intent, query_vectors=vectors)
                examples.append(RerankExample(cid, q.index, q.category, q.question, wm.fused, gold))
                for uid in (*wm.fused, *gold):
                    if uid not in docs:
                        docs[uid] = index.document(units[uid], document_layout)
    if not examples:
        raise InputError(str(input_path), "no questions of categories 1-4 with gold evidence in the stored units")
    return RerankData(examples, documents, data_source(Path(input_path), Path(store), embedder.model_id, cfg.retrieval, document_layout))


def load_or_build(input_path: Path, store: Path, cache: Path | None, cfg: PipelineConfig, document_layout: str = UNRECORDED_LAYOUT) -> RerankData:
    """The data of ``cache`` when it was built from the same input, store, settings and document layout; else built (and cached).

    The turns-mode store is built first when it lacks conversations of the input.
    """
    if not Path(input_path).exists():
        raise InputError(str(input_path), "LoCoMo file not found (pass data.input, e.g. a copy of locomo10.json)")
    source = data_source(Path(input_path), Path(store), cfg.models.embedder, cfg.retrieval, document_layout)
    if cache is not None and Path(cache).exists():
        try:
            data = RerankData.load(Path(cache))
        except InputError:
            data = None
        if data is not None and data.source == source:
            return data
    ensure_turns_store(Path(input_path), Path(store), embedder=cfg.models.embedder)
    data = build_rerank_data(Path(input_path), Path(store), cfg, document_layout=document_layout)
    data.source = source
    if cache is not None:
        data.save(Path(cache))
    return data


def sample_negatives(example: RerankExample, count: int, rng: np.random.Generator, *, top: int = HARD_TOP) -> list[str]:
    """``count`` distinct non-gold pool units: half from the pool's first ``top`` ranks, half from below.

    When one half runs short the other fills in; a pool with fewer negatives gives them all.
    """
    negatives = example.negatives()
    head = [uid for rank, uid in negatives if rank < top]
    tail = [uid for rank, uid in negatives if rank >= top]
    want_tail = min(len(tail), count // 2)
    want_head = min(len(head), count - want_tail)
    want_tail = min(len(tail), count - want_head)
    pick = lambda items, k: [items[i] for i in sorted(rng.choice(len(items), size=k, replace=False))] if k else []  # noqa: E731
    return pick(head, want_head) + pick(tail, want_tail)


@dataclass
class RerankGroup:
    """One training item: a question, its positive document first, then its negative documents."""

    question: str
    documents: list[str]


def mined_pools(data: RerankData, reranker: Reranker) -> RerankData:
    """The examples with each pool in ``reranker``'s order, best first: a second round of hard negatives.

    :func:`sample_negatives` draws its hard half from a pool's first ranks, so after this it draws what a
    trained model ranks highest among the units that are not gold, rather than what the fusion did.
    """
    examples = []
    for example in tqdm(data.examples, desc="mining hard negatives", unit="question"):
        scores = np.asarray(reranker.score(example.question, [data.document(example, uid) for uid in example.pool]))
        examples.append(replace(example, pool=[example.pool[i] for i in np.argsort(-scores, kind="stable")]))
    return RerankData(examples, data.documents, {**data.source, "mined_with": reranker.model_id})


def rerank_groups(data: RerankData, negatives: int, seed: int, epoch: int = 0) -> list[RerankGroup]:
    """One group per (question, gold unit), negatives drawn afresh for each (seed, epoch) and reproducibly so."""
    rng = np.random.default_rng([seed, epoch])
    groups = []
    for example in data.examples:
        for positive in example.gold:
            drawn = sample_negatives(example, negatives, rng)
            groups.append(RerankGroup(example.question, [data.document(example, uid) for uid in (positive, *drawn)]))
    return groups
