"""A user's memory behind the predictor: add sessions as they happen, ask questions with cited evidence.

:class:`PredictorMemory` is a handle on one namespace of a persistent
:class:`~qgmem_train.memory.store.MemoryStore`: ``add_session`` extends it incrementally, ``search``
activates the working memory and serializes it, ``ask`` also answers (:mod:`qgmem_train.answer`). Local backbones
answer through graph tokens; API backbones through the text path, with the local graph written as facts.
:func:`ask_batch` answers several questions with one batched generation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from qgmem_train.errors import InputError
from qgmem_train.memory.types import Conversation, Session, Turn, session_fingerprint
from qgmem_train.pipeline.answer import answer_text_path
from qgmem_train.pipeline.results import AskResult, SearchResult
from qgmem_train.pipeline.search import NamespaceIndex, Retrieval, search

if TYPE_CHECKING:
    from qgmem_train.llm.schemas import AnswerOutput
    from qgmem_train.memory.construct import BuildReport
    import numpy as np

    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.pipeline.search import UnitFilter
    from qgmem_train.predictor.base import Predictor
    from qgmem_train.retrieval.intent import QueryIntent


class PredictorMemory:
    """One user's (or conversation's) memory: add sessions as they happen, ask questions at any time."""

    def __init__(self, predictor: Predictor, namespace: str, store: MemoryStore) -> None:
        self.predictor = predictor
        self.namespace = namespace
        self.store = store
        self.index = NamespaceIndex(store, namespace, predictor.models)
        """The namespace's search index, kept while the namespace is unchanged."""

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def __enter__(self) -> PredictorMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_session(
        self, turns: Sequence[Turn | Mapping[str, Any]], time: str | None = None, session_id: str | None = None, *, whole: bool = False
    ) -> BuildReport:
        """Add one session and build its units (and update traces); rerunning a killed call resumes it.

        ``turns`` are :class:`Turn` objects or dicts ``{id?, speaker, text}``; a missing id becomes
        ``<session_id>:<n>``. ``session_id`` defaults to :func:`~qgmem_train.memory.types.session_fingerprint`
        of the turns and time, so a retried call stores the session once; ``time`` is the session's date
        (ISO or a recognised date format). ``whole`` commits all the session's units in one transaction, so a killed
        call leaves none of them visible (``serve`` adds this way); by default they commit a window batch at a time.
        A search index already held grows by the new units here, so the next search does not wait for it.
        """
        from qgmem_train.memory.construct import build_conversation
        from qgmem_train.memory.loaders import session_time

        if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence):
            raise InputError(f"namespace {self.namespace}: turns", f"expected a list of turns, got {type(turns).__name__}")
        if time is not None:
            checked_text(time, f"namespace {self.namespace}: time")
        session_id = checked_text(session_id, f"namespace {self.namespace}: session_id") if session_id is not None else session_fingerprint(turns, time)
        where = f"namespace {self.namespace}, session {session_id}"
        if not turns:
            raise InputError(where, "no turns")
        session = Session(session_id, session_time(time, f"{where}: time"), [_turn(t, session_id, n, where) for n, t in enumerate(turns, start=1)])
        predictor = self.predictor
        cfg = predictor.pipeline
        llm = predictor.models.construction_llm
        with predictor.frozen_pipeline():
            report = build_conversation(
                self.store, Conversation(self.namespace, [session]), cfg, predictor.embedder, namespace=self.namespace, llm=llm, whole=whole
            )
        self.index.refresh()
        return report

    def append_turns(self, session_id: str, turns: Sequence[Turn | Mapping[str, Any]]) -> BuildReport:
        """Append ``turns`` to the stored session ``session_id`` and build the units of its windows that hold them, all in
        one transaction (a killed call leaves the session as it was). The turns take the session's date; a missing id
        becomes ``<session_id>:<n>`` counting on from the stored turns, so give ids to make a retried call append once (a turn
        stored already with the same content is skipped, with other content refused)."""
        from qgmem_train.memory.construct import build_conversation

        session_id = checked_text(session_id, f"namespace {self.namespace}: session_id")
        where = f"namespace {self.namespace}, session {session_id}"
        if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence) or not turns:
            raise InputError(where, "expected a non-empty list of turns")
        stored = self.store.session_turns(self.namespace, session_id)
        if not stored:
            raise InputError(where, "not stored (add it as a session first)")
        kept = [Turn(t["id"], t["speaker"], t["text"]) for t in stored]
        known = {t.id: t for t in kept}
        added = []
        for n, value in enumerate(turns, start=len(stored) + 1):
            turn = _turn(value, session_id, n, where)
            if turn.id in known and known[turn.id] != turn:
                raise InputError(f"{where}, turn {turn.id}", "already stored with other content")
            if turn.id not in known:  # a retried append's turns are stored already
                added.append(turn)
        session = Session(session_id, stored[0]["time"], kept + added)
        predictor = self.predictor
        with predictor.frozen_pipeline():
            return build_conversation(
                self.store, Conversation(self.namespace, [session]), predictor.pipeline, predictor.embedder, namespace=self.namespace,
                llm=predictor.models.construction_llm, whole=True, grow=True,
            )  # fmt: skip

    def delete_session(self, session_id: str) -> bool:
        """Delete one session (its turns, and the units and traces built from it) in one transaction, then consolidate the
        namespace's traces again; return whether it was stored."""
        from qgmem_train.memory.store import UnitsChanged
        from qgmem_train.memory.traces import consolidate_traces

        if not self.store.delete_session(self.namespace, session_id):
            return False
        cfg = self.predictor.pipeline
        if cfg.construction.traces and self.store.traces_stale(self.namespace):
            try:
                with self.predictor.frozen_pipeline():
                    consolidate_traces(self.store, self.namespace, cfg, self.predictor.models.construction_llm)
            except UnitsChanged:
                pass  # the write that changed the units consolidates them
        return True

    def search(
        self,
        question: str,
        question_time: str | None = None,
        *,
        top_k: int | None = None,
        keep: UnitFilter | None = None,
        intent: QueryIntent | None = None,
        query_vectors: np.ndarray | None = None,
    ) -> SearchResult:
        """The working memory for ``question`` and its MEMORY_CONTEXT, without answering (for callers with their own LLM).

        ``top_k`` replaces ``retrieval.k``; ``keep`` drops units of the fused pool before the k best are taken;
        ``intent`` and ``query_vectors`` are a parse and an embedding made beforehand (batched with other questions).
        """
        found = self._retrieve(question, question_time, top_k=top_k, keep=keep, intent=intent, query_vectors=query_vectors)
        seconds = {**found.seconds, "total": time.perf_counter() - found.started}
        return SearchResult(question, question_time, found.evidence.context.text, found.evidence_units(), {"context": found.evidence.context.n_tokens}, seconds)

    def ask(self, question: str, question_time: str | None = None) -> AskResult:
        """Activate the working memory for ``question`` and answer it with the model, citing units and turns."""
        return ask_batch([(self, question, question_time)])[0]

    def _retrieve(
        self,
        question: str,
        question_time: str | None,
        *,
        top_k: int | None = None,
        keep: UnitFilter | None = None,
        intent: QueryIntent | None = None,
        query_vectors: np.ndarray | None = None,
    ) -> Retrieval:
        """Check the question, activate its working memory and serialize it as the answerer reads it (see :meth:`search`)."""
        checked_text(question, "question")
        if len(question) > self.predictor.max_question_chars:
            raise InputError("question", f"{len(question)} characters, more than the {self.predictor.max_question_chars} a question may have (max_question_chars)")
        if question_time is not None:
            checked_text(question_time, "question_time")
        started = time.perf_counter()
        memory, index = self.index.current()
        with self.predictor.frozen_pipeline():
            return search(
                question, question_time, memory, index, self.predictor.models, top_k=top_k, keep=keep, intent=intent,
                query_vectors=query_vectors, seconds={"memory": time.perf_counter() - started},
            )  # fmt: skip

    def _answer(self, found: Retrieval, generated: str, parsed: AnswerOutput | None, prompt_tokens: int, generated_tokens: int) -> AskResult:
        """The result of one retrieval answered with ``generated`` (parsed), its cited units marked."""
        from qgmem_train.answer.citations import cited_units

        cited = set(cited_units(parsed.reasoning_path, found.evidence)) if parsed else set()
        units = found.evidence_units(cited)
        seconds = {**found.seconds, "total": time.perf_counter() - found.started}
        return AskResult(
            question=found.question, question_time=found.question_time, answer=parsed.answer if parsed else None,
            reasoning_path=parsed.reasoning_path if parsed else None, generated=generated, path=self.predictor.path, units=units,
            tokens={"context": found.evidence.context.n_tokens, "prompt": prompt_tokens, "generated": generated_tokens}, seconds=seconds,
        )  # fmt: skip


def ask_batch(asks: Sequence[tuple[PredictorMemory, str, str | None]]) -> list[AskResult]:
    """Answer (memory, question, question time) triples of one predictor, generating every answer in one batched call.

    Retrieval runs question by question; the answers are decoded together (one ``generate`` of the LLM on the
    text path, of the module on the graph path), so concurrent questions share the model's batch.
    """
    if not asks:
        return []
    predictor = asks[0][0].predictor
    if any(memory.predictor is not predictor for memory, _, _ in asks):
        raise ValueError("ask_batch: every memory must belong to the same predictor")
    found = [memory._retrieve(question, question_time) for memory, question, question_time in asks]
    generate = _generate_graph if predictor.model is not None else _generate_text
    outputs = generate(predictor, found)
    return [memory._answer(item, *output) for (memory, _, _), item, output in zip(asks, found, outputs)]


def _generate_graph(predictor: Predictor, found: Sequence[Retrieval]) -> list[tuple[str, AnswerOutput | None, int, int]]:
    """Graph-token path: embed each local graph, generate the batch with the module, parse strictly (a capped string ends at a word)."""
    from torch_geometric.data import Batch

    from qgmem_train.answer.parsing import parse_answer
    from qgmem_train.graph.local_graph import graph_to_data
    from qgmem_train.trajectory import TrajectoryExample

    model, embedder = predictor.model, predictor.embedder
    start = time.perf_counter()
    examples, graphs = [], []
    for item in found:
        examples.append(TrajectoryExample(
            case_id=item.memory.namespace, question_id="", source_dataset="", namespace=item.memory.namespace, question=item.question,
            question_time=item.question_time or "", context=item.evidence.context.text, answer="", reasoning_path="", graph=item.evidence.graph,
        ))  # fmt: skip
        graphs.append(graph_to_data(item.evidence.graph, embedder.encode, embedder.dim, question=embedder.encode([item.question])[0]))
    batch = Batch.from_data_list(graphs)
    graph_seconds = time.perf_counter() - start
    start = time.perf_counter()
    generated = model.generate(examples, batch)
    generate_seconds = time.perf_counter() - start
    outputs = []
    for item, example, text in zip(found, examples, generated):
        item.seconds.update(graph=graph_seconds, generate=generate_seconds)
        graph_tokens = model.readout_args.tokens
        if model.readout_args.kind == "edges":
            graph_tokens = min(graph_tokens, item.evidence.graph.num_edges)
        prompt_tokens = len(model.prompt_ids(example).ids) + graph_tokens
        outputs.append((text, parse_answer(text, model.generation_args.max_new_tokens), prompt_tokens, predictor.llm.count_tokens(text)))
    return outputs


def _generate_text(predictor: Predictor, found: Sequence[Retrieval]) -> list[tuple[str, AnswerOutput | None, int, int]]:
    """Text path (API backbones): the frozen LLM answers the batch's final-answer chats, schema-checked (:mod:`qgmem_train.pipeline.answer`)."""
    answers = answer_text_path(predictor.llm, found, max_new_tokens=predictor.pipeline.generation.max_new_tokens)
    return [(a.generated, a.parsed, a.prompt_tokens, a.generated_tokens) for a in answers]


def _turn(value: Turn | Mapping[str, Any], session_id: str, number: int, where: str) -> Turn:
    """A :class:`Turn` from a Turn or a ``{id?, speaker, text}`` dict; a missing or mistyped field is an error."""
    twhere = f"{where}, turn {number}"
    if isinstance(value, Turn):
        fields = {"id": value.id, "speaker": value.speaker, "text": value.text}
    elif isinstance(value, Mapping):
        fields = {"id": str(value["id"]) if value.get("id") else f"{session_id}:{number}", "speaker": value.get("speaker"), "text": value.get("text")}
    else:
        raise InputError(twhere, f"expected a Turn or a dict with speaker and text, got {type(value).__name__}")
    return Turn(*(checked_text(fields[key], f"{twhere}.{key}") for key in ("id", "speaker", "text")))


def checked_text(value: object, where: str) -> str:
    """``value`` when it is a non-blank string UTF-8 can store (no lone surrogates, no NUL); anything else is an :class:`InputError` naming ``where``."""
    if not isinstance(value, str):
        raise InputError(where, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise InputError(where, "empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(where, f"not valid text: {exc.reason} at character {exc.start}") from None
    if "\x00" in value:
        raise InputError(where, f"not valid text: NUL at character {value.index(chr(0))}")
    return value
