"""The model and the store behind ``serve``: every blocking call off the event loop, each kind of work on its own queue.

One predictor per process, and four queues, so that no request waits behind work of another kind:

- searches run on a pool of ``workers`` threads, each with ``torch_threads`` intra-op threads (on CPU one each, a
  worker a core); a worker takes every search waiting (up to ``max_search_batch``) and embeds their queries in one
  batch (:func:`~qgmem_train.retrieval.activation.encode_queries`), then activates each question's working memory;
- asks run on a thread of their own: those waiting are answered together, up to ``max_batch`` in one generate call
  (:func:`~qgmem_train.predictor.ask_batch`), so a slow generation delays no search; it and the writer threads run
  ``background_nice`` steps nicer than the search workers (Linux), so on busy cores a search takes the CPU first;
- adds, appends and deletions run on ``writers`` threads, one at a time per namespace (another namespace's write
  goes on meanwhile);
- store reads (listings) run on a small pool of their own.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any, TypeVar

import torch

from qgmem_train.errors import InputError
from qgmem_train.memory.construct import BuildReport
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.types import session_fingerprint
from qgmem_train.pipeline.search import question_intents
from qgmem_train.predictor import AskResult, PredictorMemory, SearchResult, ask_batch
from qgmem_train.predictor.base import Predictor
from qgmem_train.predictor.memory import checked_text
from qgmem_train.retrieval.activation import encode_queries
from qgmem_train.retrieval.intent import QueryIntent
from qgmem_train.serve.filters import UnitFilter

T = TypeVar("T")
OPEN_MEMORIES = 256
"""Namespace handles (each caching its loaded index) kept open, least recently used dropped first."""


class NamespaceNotFound(Exception):
    """The namespace is not in the store (or the caller may not know it is)."""


class SessionNotFound(Exception):
    """The session is not in the namespace."""


def _added(namespace: str, session_id: str, report: BuildReport, summary: dict[str, Any] | None) -> dict[str, Any]:
    """The answer to an add or an append: the session, its turns now, and the build's counts."""
    return {"namespace": namespace, "session_id": session_id, "turns_total": summary["turns"] if summary else 0, "units": report.units,
            "windows_built": report.windows_built, "dropped": report.dropped, "seconds": report.seconds}  # fmt: skip


def _thread_setup(torch_threads: int, nicer_by: int) -> None:
    """A pool thread's start: ``torch_threads`` intra-op threads, and its scheduling priority lowered by ``nicer_by``
    (Linux keeps one per thread; elsewhere, or where it is refused, the thread keeps its priority)."""
    torch.set_num_threads(torch_threads)
    if nicer_by and hasattr(os, "setpriority"):
        thread = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + nicer_by)
        except OSError:
            pass


def default_workers(torch_threads: int) -> int:
    """Search workers for ``torch_threads`` intra-op threads each: one a core's worth of threads, at least one."""
    return max(1, (os.cpu_count() or 1) // torch_threads)


def _take_waiting(jobs: queue.Queue[tuple[Any, ...]], most: int) -> list[tuple[Any, ...]]:
    """Up to ``most`` waiting jobs whose caller still waits (a cancelled one is dropped)."""
    taken: list[tuple[Any, ...]] = []
    while len(taken) < most:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            break
        if job[-1].set_running_or_notify_cancel():
            taken.append(job)
    return taken


def _settle(future: Future, fn: Callable[[], T]) -> None:
    """Give ``future`` the result of ``fn`` or its exception."""
    try:
        future.set_result(fn())
    except Exception as exc:
        future.set_exception(exc)


class NamespaceLocks:
    """One lock per namespace, made when first held and dropped when no thread holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, namespace: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(namespace, (threading.Lock(), 0))
            self._locks[namespace] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[namespace]
                if users == 1:
                    del self._locks[namespace]
                else:
                    self._locks[namespace] = (lock, users - 1)


class MemoryService:
    """Add sessions to, search, ask, list and delete the namespaces of one store with one predictor."""

    def __init__(
        self,
        predictor: Predictor,
        store_path: str | Path,
        *,
        max_batch: int = 8,
        workers: int | None = None,
        torch_threads: int = 1,
        max_search_batch: int = 16,
        writers: int = 2,
        readers: int = 4,
        background_nice: int = 5,
    ) -> None:
        """``workers`` search threads (default: the cores over ``torch_threads``) with ``torch_threads`` intra-op threads each;
        the ask and writer threads run ``background_nice`` steps nicer, so that on busy cores a search gets them first."""
        if torch_threads < 1 or (workers is not None and workers < 1) or max_search_batch < 1 or writers < 1:
            raise ValueError(f"workers, torch_threads, max_search_batch and writers must be at least 1, got {workers}, {torch_threads}, {max_search_batch}, {writers}")
        torch.set_num_threads(torch_threads)
        self.predictor = predictor
        self.store = MemoryStore.open(store_path, create=True)
        self.max_batch = max_batch
        self.max_search_batch = max_search_batch
        self.workers = workers or default_workers(torch_threads)
        self.torch_threads = torch_threads
        self.on_batch: Callable[[int], None] = lambda size: None
        """Called (on the ask thread) with the size of every ask batch before it is answered: metrics observe it."""
        self.on_search_batch: Callable[[int], None] = lambda size: None
        """Called (on a search worker) with the number of searches whose queries are embedded together."""
        self._searchers = ThreadPoolExecutor(self.workers, thread_name_prefix="qgmem-search", initializer=_thread_setup, initargs=(torch_threads, 0))
        background = dict(initializer=_thread_setup, initargs=(torch_threads, background_nice))
        self._asker = ThreadPoolExecutor(1, thread_name_prefix="qgmem-ask", **background)  # type: ignore[arg-type]
        self._writers = ThreadPoolExecutor(writers, thread_name_prefix="qgmem-write", **background)  # type: ignore[arg-type]
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="qgmem-read")
        self._asks: queue.Queue[tuple[str, str, str | None, Future]] = queue.Queue()
        self._searches: queue.Queue[tuple[str, str, str | None, int | None, UnitFilter, Future]] = queue.Queue()
        self._memories: OrderedDict[str, PredictorMemory] = OrderedDict()
        self._memories_lock = threading.Lock()
        self._namespace_locks = NamespaceLocks()

    def close(self) -> None:
        """Finish the queued work and close the store."""
        for pool in (self._asker, self._searchers, self._writers, self._readers):
            pool.shutdown(wait=True)
        self.store.close()

    @property
    def pending_asks(self) -> int:
        """Asks waiting for the model."""
        return self._asks.qsize()

    @property
    def pending_searches(self) -> int:
        """Searches waiting for a worker."""
        return self._searches.qsize()

    @staticmethod
    async def _on(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(pool.submit(fn, *args))

    def _memory(self, namespace: str) -> PredictorMemory:
        """The cached handle on ``namespace``."""
        with self._memories_lock:
            memory = self._memories.pop(namespace, None) or PredictorMemory(self.predictor, namespace, self.store)
            self._memories[namespace] = memory
            while len(self._memories) > OPEN_MEMORIES:
                self._memories.popitem(last=False)
            return memory

    def _existing(self, namespace: str) -> PredictorMemory:
        if not self.store.has_namespace(namespace):
            raise NamespaceNotFound(namespace)
        return self._memory(namespace)

    async def namespaces(self, names: frozenset[str], prefixes: Sequence[str], after: str | None, limit: int) -> list[str]:
        """A page of the namespaces named in ``names`` or starting with one of ``prefixes``, in name order after ``after``."""
        return await self._on(self._readers, self.store.namespaces_page, names, prefixes, after, limit)

    async def add_session(
        self, namespace: str, turns: Sequence[dict[str, Any]], time: str | None, session_id: str | None, on_start: Callable[[], None] = lambda: None
    ) -> dict[str, Any]:
        """Store one session (idempotent by session id) and build its units in one transaction; the build's counts.
        ``on_start`` is called when the add leaves its namespace's write queue."""
        session_id = checked_text(session_id, "session_id") if session_id is not None else session_fingerprint(turns, time)

        def add() -> dict[str, Any]:
            with self._namespace_locks.hold(namespace):
                on_start()
                report = self._memory(namespace).add_session(turns, time=time, session_id=session_id, whole=True)
                total = self.store.session_summary(namespace, session_id)
            return _added(namespace, session_id, report, total)

        return await self._on(self._writers, add)

    async def append_turns(
        self, namespace: str, session_id: str, turns: Sequence[dict[str, Any]], max_turns: int, on_start: Callable[[], None] = lambda: None
    ) -> dict[str, Any]:
        """Append ``turns`` to a stored session (at most ``max_turns`` in all) and build its windows holding them, in one
        transaction; the build's counts. ``on_start`` as in :meth:`add_session`."""

        def append() -> dict[str, Any]:
            with self._namespace_locks.hold(namespace):
                on_start()
                if not self.store.has_namespace(namespace):
                    raise NamespaceNotFound(namespace)
                stored = {t["id"] for t in self.store.session_turns(namespace, session_id)}
                if not stored:
                    raise SessionNotFound(session_id)
                fresh = sum(t.get("id") not in stored for t in turns)  # a retried append's turns are stored once
                if len(stored) + fresh > max_turns:
                    raise InputError("turns", f"{len(stored)} stored and {fresh} appended, more than the {max_turns} a session may have")
                report = self._memory(namespace).append_turns(session_id, turns)
                return _added(namespace, session_id, report, self.store.session_summary(namespace, session_id))

        return await self._on(self._writers, append)

    async def delete_session(self, namespace: str, session_id: str) -> None:
        """Delete one session of the namespace, its units and the traces holding them (after the writes queued before)."""

        def delete() -> None:
            with self._namespace_locks.hold(namespace):
                if not self.store.has_namespace(namespace):
                    raise NamespaceNotFound(namespace)
                if not self._memory(namespace).delete_session(session_id):
                    raise SessionNotFound(session_id)

        await self._on(self._writers, delete)

    async def search(self, namespace: str, question: str, time: str | None, top_k: int | None = None, keep: UnitFilter = UnitFilter()) -> SearchResult:
        """The working memory for ``question`` (its ``top_k`` best units that ``keep`` keeps) and its MEMORY_CONTEXT,
        its query embedded in one batch with the searches waiting beside it."""
        future: Future = Future()
        self._searches.put((namespace, question, time, top_k, keep, future))
        self._searchers.submit(self._search_waiting)
        return await asyncio.wrap_future(future)

    def _search_waiting(self) -> None:
        """Answer the searches waiting (search worker): their intents parsed and their queries embedded together."""
        ready = []
        for namespace, question, time, top_k, keep, future in _take_waiting(self._searches, self.max_search_batch):
            try:
                checked_text(question, "question")
                ready.append((self._existing(namespace), question, time, top_k, keep, future))
            except Exception as exc:
                future.set_exception(exc)
        if not ready:
            return
        self.on_search_batch(len(ready))
        predictor = self.predictor
        try:
            asked = [(question, time) for _, question, time, *_ in ready]
            started = perf_counter()
            with predictor.frozen_pipeline():
                intents = question_intents(predictor.models, asked)
            parsed = perf_counter()
            vectors = encode_queries(predictor.embedder, [q for q, _ in asked], intents)
            shared = {"intent": parsed - started, "embed": perf_counter() - parsed}
        except Exception as exc:
            for *_, future in ready:
                future.set_exception(exc)
            return

        def search(memory: PredictorMemory, question: str, time: str | None, top_k: int | None, keep: UnitFilter, intent: QueryIntent, query_vectors: Any) -> SearchResult:
            result = memory.search(question, time, top_k=top_k, keep=keep or None, intent=intent, query_vectors=query_vectors)
            result.seconds.update(shared, total=result.seconds["total"] + sum(shared.values()))  # the batch's parse and embedding, whole
            return result

        for (memory, question, time, top_k, keep, future), intent, query_vectors in zip(ready, intents, vectors):
            _settle(future, lambda: search(memory, question, time, top_k, keep, intent, query_vectors))

    async def ask(self, namespace: str, question: str, time: str | None) -> AskResult:
        """The answer with its cited units, batched with the asks waiting beside it."""
        future: Future = Future()
        self._asks.put((namespace, question, time, future))
        self._asker.submit(self._answer_waiting)
        return await asyncio.wrap_future(future)

    def _answer_waiting(self) -> None:
        """Answer up to ``max_batch`` waiting asks in one batch (ask thread); none left means another call took them."""
        ready = []
        for namespace, question, time, future in _take_waiting(self._asks, self.max_batch):
            try:
                ready.append((self._existing(namespace), question, time, future))
            except NamespaceNotFound as exc:
                future.set_exception(exc)
        if not ready:
            return
        self.on_batch(len(ready))
        try:
            results = ask_batch([(memory, question, time) for memory, question, time, _ in ready])
        except Exception as exc:
            if len(ready) == 1:
                ready[0][3].set_exception(exc)
                return
            results = None
        if results is not None:
            for (*_, future), result in zip(ready, results):
                future.set_result(result)
            return
        for memory, question, time, future in ready:  # one bad question failed the batch: each alone gets its own outcome
            _settle(future, lambda: memory.ask(question, time))

    async def listing(self, namespace: str, offset: int, limit: int) -> dict[str, Any]:
        """A page of the namespace's units (``offset``, at most ``limit``, read by the store alone) with their source turn
        ids, and its unit and session counts."""

        def read() -> dict[str, Any]:
            if not self.store.has_namespace(namespace):
                raise NamespaceNotFound(namespace)
            units = [{"id": u.id, "fact_text": u.fact_text, "source_turn_ids": list(u.source_turn_ids)} for u in self.store.units_page(namespace, offset, limit)]
            return {"namespace": namespace, "units_total": self.store.count_units(namespace), "sessions_total": self.store.count_sessions(namespace),
                    "offset": offset, "units": units}  # fmt: skip

        return await self._on(self._readers, read)

    async def sessions(self, namespace: str, offset: int, limit: int) -> dict[str, Any]:
        """A page of the namespace's sessions (id, turns, date), in session id order."""

        def read() -> dict[str, Any]:
            if not self.store.has_namespace(namespace):
                raise NamespaceNotFound(namespace)
            return {"namespace": namespace, "sessions_total": self.store.count_sessions(namespace), "offset": offset,
                    "sessions": self.store.sessions_page(namespace, offset, limit)}  # fmt: skip

        return await self._on(self._readers, read)

    async def session(self, namespace: str, session_id: str, offset: int, limit: int) -> dict[str, Any]:
        """A page of one session's turns, in order, with its turn count and date."""

        def read() -> dict[str, Any]:
            if not self.store.has_namespace(namespace):
                raise NamespaceNotFound(namespace)
            summary = self.store.session_summary(namespace, session_id)
            if summary is None:
                raise SessionNotFound(session_id)
            turns = [{key: t[key] for key in ("id", "speaker", "text")} for t in self.store.session_turns(namespace, session_id, offset, limit)]
            return {"namespace": namespace, "session_id": session_id, "turns_total": summary["turns"], "time": summary["time"], "offset": offset, "turns": turns}

        return await self._on(self._readers, read)

    async def delete(self, namespace: str) -> None:
        """Delete the namespace and everything of it (after the writes to it queued before)."""

        def delete() -> None:
            with self._namespace_locks.hold(namespace):
                with self._memories_lock:
                    self._memories.pop(namespace, None)
                if not self.store.delete_namespace(namespace):
                    raise NamespaceNotFound(namespace)

        await self._on(self._writers, delete)
