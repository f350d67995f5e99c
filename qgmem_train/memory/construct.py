"""Memory construction for one conversation: windows → units → embeddings → store → traces.

Windows already committed are skipped, so a rerun resumes a killed build and a conversation with new
sessions only extracts the new windows; the store refuses a build whose windows are cut otherwise than
the namespace's (units mode, window, overlap), whose window indices would name other turns. Windows go
through the LLM ``window_batch_size`` at a time (the turns mode embeds ``embed_windows`` at a time) and each
``window_batch_size`` windows commit in one transaction with their progress rows. Several builds may write one
namespace at once: a consolidation overtaken by another build's units is left to that build, which consolidates last.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.structured import ParseStats
from qgmem_train.memory.extraction import extract_windows
from qgmem_train.memory.sentences import fact_sentences
from qgmem_train.memory.store import EmbeddedUnit, MemoryStore, SessionCut, UnitsChanged, WindowResult
from qgmem_train.memory.traces import consolidate_traces
from qgmem_train.memory.turn_units import window_turn_units
from qgmem_train.memory.types import Conversation, MemoryUnit
from qgmem_train.memory.windows import Window, session_windows


class TextEmbedder(Protocol):
    """What construction needs from an embedder (see :class:`qgmem_train.llm.embedder.Embedder`)."""

    model_id: str
    dim: int

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray: ...


class Progress(Protocol):
    """A tqdm-like bar: ``update`` by windows done, ``set_postfix`` with running counts."""

    def update(self, n: int = 1) -> Any: ...

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> Any: ...


@dataclass
class BuildReport:
    """Counts of one conversation's build: windows, units, traces, dropped outputs, parse statistics.

    ``traces_updated``: this build brought the namespace's traces up to date; ``traces_deferred``: another
    writer added units while it consolidated, so the consolidation was left to that writer.
    """

    namespace: str
    windows_total: int = 0
    windows_built: int = 0
    units: int = 0
    traces: int = 0
    dropped: int = 0
    parse: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    traces_updated: bool = False
    traces_deferred: bool = False


def conversation_windows(conversation: Conversation, cfg: PipelineConfig, limit_sessions: int | None = None) -> list[Window]:
    """Every window of the conversation's (first ``limit_sessions``) sessions, in dialogue order."""
    sessions = conversation.sessions[:limit_sessions] if limit_sessions else conversation.sessions
    cc = cfg.construction
    return [w for s in sessions for w in session_windows(s, cc.window, cc.overlap)]


def embed_units(units: Sequence[MemoryUnit], embedder: TextEmbedder, batch_size: int, *, sentences: bool = True) -> list[EmbeddedUnit]:
    """Fact, relation, subject and attribute embeddings of ``units`` (and, with ``sentences``, of each
    sentence of a multi-sentence fact), each distinct text encoded once."""
    pieces = {u.id: fact_sentences(u.fact_text) if sentences else [] for u in units}
    texts: list[str] = []
    for u in units:
        texts += [u.fact_text, u.relation_text, u.subject, *u.entities, *u.locations, *pieces[u.id]]
    distinct = list(dict.fromkeys(texts))
    vectors = embedder.encode(distinct, batch_size=batch_size)
    row = {text: i for i, text in enumerate(distinct)}
    out = []
    for u in units:
        attrs = [row[t] for t in [*u.entities, *u.locations]]
        out.append(EmbeddedUnit(
            u, vectors[row[u.fact_text]], vectors[row[u.relation_text]], vectors[attrs].reshape(len(attrs), embedder.dim),
            vectors[[row[t] for t in pieces[u.id]]].reshape(len(pieces[u.id]), embedder.dim), vectors[row[u.subject]],
        ))
    return out


def refuse_long_turns(conversation: Conversation, max_chars: int | None) -> None:
    """Refuse a conversation with a turn longer than ``max_chars`` characters (``construction.max_turn_chars``; None: no cap)."""
    if max_chars is None:
        return
    for session in conversation.sessions:
        for turn in session.turns:
            if len(turn.text) > max_chars:
                raise InputError(
                    f"conversation {conversation.id}, session {session.id}, turn {turn.id}",
                    f"{len(turn.text)} characters, more than the {max_chars} a turn may have (pipeline.construction.max_turn_chars)",
                )


def build_conversation(
    store: MemoryStore,
    conversation: Conversation,
    cfg: PipelineConfig,
    embedder: TextEmbedder,
    *,
    namespace: str | None = None,
    llm: ChatLLM | None = None,
    limit_sessions: int | None = None,
    progress: Progress | None = None,
    whole: bool = False,
    grow: bool = False,
) -> BuildReport:
    """Build or extend ``namespace`` (default: the conversation id) from ``conversation``.

    Windows commit ``window_batch_size`` at a time, so a rerun of a killed build resumes it; ``whole`` commits the
    namespace, the turns and every pending window in one transaction instead (a server's add: a killed call leaves no
    trace of the session, not its turns, nor the namespace when it was new). ``grow`` (with ``whole``) appends the turns a
    stored session lacks to it: its windows are cut again over all its turns, and those holding a new turn are built
    (the last one of before, cut short then, again: its units are replaced).

    ``cfg.construction.units`` picks the LLM extraction or the rule-based turns mode; ``llm`` is needed
    for the former and writes trajectories in both (the rule trajectory stands in when it is ``None``).
    """
    started = time.perf_counter()
    cc = cfg.construction
    refuse_long_turns(conversation, cc.max_turn_chars)
    namespace = namespace or conversation.id
    if cc.units == "llm" and llm is None:
        raise ValueError("units mode 'llm' needs an LLM")
    sessions = conversation.sessions[:limit_sessions] if limit_sessions else conversation.sessions
    cut = SessionCut(cc.units, embedder.model_id, embedder.dim, cc.window, cc.overlap)
    if grow and not whole:
        raise ValueError("grow needs whole")
    stored = {t["id"] for s in sessions for t in store.session_turns(namespace, s.id)} if grow else set()
    if whole:
        positions = store.plan_session(namespace, cut, Conversation(conversation.id, sessions), grow=grow)
    else:
        store.ensure_namespace(namespace, cc.units, embedder.model_id, embedder.dim, window=cc.window, overlap=cc.overlap)
        positions = store.put_turns(namespace, Conversation(conversation.id, sessions))
    windows = conversation_windows(conversation, cfg, limit_sessions)
    done = store.done_windows(namespace)
    pending = [w for w in windows if (w.session.id, w.index) not in done or (grow and not w.new_ids <= stored)]
    report = BuildReport(namespace, windows_total=len(windows))
    stats = ParseStats() if llm is not None else None
    commit_size = max(1, len(pending) if whole else cc.window_batch_size)
    chunk_size = commit_size if cc.units == "llm" else max(commit_size, cc.embed_windows)
    for lo in range(0, len(pending), chunk_size):
        chunk = pending[lo:lo + chunk_size]
        if cc.units == "llm":
            extracted = extract_windows(llm, chunk, positions, cfg, stats)
        else:
            extracted = [(window_turn_units(w, positions), 0) for w in chunk]
        flat = embed_units([u for units, _ in extracted for u in units], embedder, cc.embed_batch_size, sentences=cc.sentence_vectors)
        results, at = [], 0
        for window, (units, dropped) in zip(chunk, extracted):
            results.append(WindowResult(window.session.id, window.index, flat[at:at + len(units)], dropped, frozenset(window.new_ids)))
            at += len(units)
        for start in range(0, len(results), commit_size):
            batch = results[start:start + commit_size]
            if whole:
                store.commit_session(namespace, cut, Conversation(conversation.id, sessions), batch, positions, grow=grow)
            else:
                store.add_windows(namespace, batch)
            report.windows_built += len(batch)
            report.units += sum(len(r.units) for r in batch)
            report.dropped += sum(r.dropped for r in batch)
            if progress is not None:
                progress.update(len(batch))
                progress.set_postfix(units=report.units, dropped=report.dropped)
    if cc.traces and store.traces_stale(namespace):
        trace_stats = ParseStats() if llm is not None else None
        try:
            consolidate_traces(store, namespace, cfg, llm, trace_stats)
            report.traces_updated = True
        except UnitsChanged:
            report.traces_deferred = True  # the build that added the units consolidates them with ours
        if trace_stats is not None:
            report.dropped += trace_stats.dropped
            stats.merge(trace_stats)
    report.traces = store.count_traces(namespace)
    if stats is not None:
        report.parse = stats.as_dict()
    report.seconds = time.perf_counter() - started
    return report

