"""LoCoMo questions grouped by stored conversation, ready to activate: memory, index, rule intents, query vectors.

The shared loop of the reranker's training data, its benchmark and the dense-scan benchmark: each
conversation's namespace is loaded and indexed once, its questions are asked at the conversation's
last session time with rule-based intents, and their query vectors are encoded in one batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qgmem_train.benchmarks.loaders import EvalQuestion, group_by_conversation, last_session_time, load_locomo_questions
from qgmem_train.memory.loaders import load_conversations

if TYPE_CHECKING:
    from qgmem_train.config import RetrievalConfig
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.memory.store import MemoryStore, NamespaceMemory
    from qgmem_train.retrieval.activation import ActivationIndex
    from qgmem_train.retrieval.intent import QueryIntent


@dataclass
class QuestionBatch:
    """One conversation's memory and index, with its questions, their rule intents and query vectors (aligned)."""

    conversation_id: str
    memory: NamespaceMemory
    index: ActivationIndex
    question_time: str | None
    questions: list[EvalQuestion]
    intents: list[QueryIntent]
    query_vectors: list[Any]

    def items(self) -> Iterator[tuple[EvalQuestion, QueryIntent, Any]]:
        """(question, intent, query vectors) of each question."""
        return zip(self.questions, self.intents, self.query_vectors)


def locomo_question_batches(
    input_path: Path, store: MemoryStore, embedder: Embedder, retrieval: RetrievalConfig, conversations: Sequence[str] | None = None
) -> Iterator[QuestionBatch]:
    """A :class:`QuestionBatch` per conversation of ``input_path`` with questions (categories 1-4 with gold evidence).

    Every such conversation must be in ``store`` (one :class:`InputError` names those missing).
    """
    from qgmem_train.retrieval.activation import ActivationIndex, encode_queries
    from qgmem_train.retrieval.intent import parse_intent_rules

    by_conversation = group_by_conversation(load_locomo_questions(Path(input_path), conversations))
    store.require_namespaces(by_conversation)
    dialogues = {c.id: c for c in load_conversations("locomo", input_path, list(by_conversation))}
    for cid, questions in by_conversation.items():
        memory = store.load_namespace(cid, embedder_id=embedder.model_id, sentences=retrieval.sentence_vectors)
        asked = last_session_time(dialogues[cid])
        intents = [parse_intent_rules(q.question, asked) for q in questions]
        vectors = list(encode_queries(embedder, [q.question for q in questions], intents))
        yield QuestionBatch(cid, memory, ActivationIndex(memory, retrieval, embedder), asked, questions, intents, vectors)
