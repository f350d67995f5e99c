"""The model and the store behind ``serve``: every blocking call off the event loop, concurrent asks batched.

One predictor per process. Everything that runs the models (adding a session, search, ask, and deleting,
so that no cached index outlives its namespace) runs on one worker thread, in arrival order; asks that wait
while it is busy are answered together, up to ``max_batch`` in one generate call
(:func:`~qgmem_train.predictor.ask_batch`). Store reads (listing) run on a small thread pool.
"""

from __future__ import annotations

import asyncio
import queue
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from qgmem_train.errors import InputError
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.types import session_fingerprint
from qgmem_train.predictor import AskResult, PredictorMemory, SearchResult, ask_batch
from qgmem_train.predictor.base import Predictor
from qgmem_train.predictor.memory import checked_text

T = TypeVar("T")
OPEN_MEMORIES = 256
"""Namespace handles (each caching its loaded index) kept open, least recently used dropped first."""


class NamespaceNotFound(Exception):
    """The namespace is not in the store (or the caller may not know it is)."""


class MemoryService:
    """Add sessions to, search, ask, list and delete the namespaces of one store with one predictor."""

    def __init__(self, predictor: Predictor, store_path: str | Path, *, max_batch: int = 8, readers: int = 4) -> None:
        self.predictor = predictor
        self.store = MemoryStore.open(store_path, create=True)
        self.max_batch = max_batch
        self.on_batch: Callable[[int], None] = lambda size: None
        """Called (on the model thread) with the size of every ask batch before it is answered: metrics observe it."""
        self._model = ThreadPoolExecutor(1, thread_name_prefix="qgmem-model")
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="qgmem-read")
        self._asks: queue.Queue[tuple[str, str, str | None, Future]] = queue.Queue()
        self._memories: OrderedDict[str, PredictorMemory] = OrderedDict()

    def close(self) -> None:
        """Finish the queued work and close the store."""
        self._model.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self.store.close()

    @property
    def pending_asks(self) -> int:
        """Asks waiting for the model."""
        return self._asks.qsize()

    async def _on_model(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._model.submit(fn, *args))

    async def _on_reader(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._readers.submit(fn, *args))

    def _memory(self, namespace: str) -> PredictorMemory:
        """The cached handle on ``namespace`` (model thread only)."""
        memory = self._memories.pop(namespace, None) or PredictorMemory(self.predictor, namespace, self.store)
        self._memories[namespace] = memory
        while len(self._memories) > OPEN_MEMORIES:
            self._memories.popitem(last=False)
        return memory

    def _existing(self, namespace: str) -> PredictorMemory:
        if namespace not in self.store.namespaces():
            raise NamespaceNotFound(namespace)
        return self._memory(namespace)

    async def namespaces(self) -> list[str]:
        """Every namespace in the store."""
        return await self._on_reader(self.store.namespaces)

    async def add_session(self, namespace: str, turns: Sequence[dict[str, Any]], time: str | None, session_id: str | None) -> dict[str, Any]:
        """Store one session (idempotent by session id) and build its units in one transaction; the build's counts."""
        session_id = checked_text(session_id, "session_id") if session_id is not None else session_fingerprint(turns, time)

        def add() -> dict[str, Any]:
            report = self._memory(namespace).add_session(turns, time=time, session_id=session_id, whole=True)
            return {"namespace": namespace, "session_id": session_id, "units": report.units, "windows_built": report.windows_built,
                    "dropped": report.dropped, "seconds": report.seconds}  # fmt: skip

        return await self._on_model(add)

    async def search(self, namespace: str, question: str, time: str | None) -> SearchResult:
        """The working memory for ``question`` and its MEMORY_CONTEXT."""
        return await self._on_model(lambda: self._existing(namespace).search(question, time))

    async def ask(self, namespace: str, question: str, time: str | None) -> AskResult:
        """The answer with its cited units, batched with the asks waiting beside it."""
        future: Future = Future()
        self._asks.put((namespace, question, time, future))
        self._model.submit(self._answer_waiting)
        return await asyncio.wrap_future(future)

    def _answer_waiting(self) -> None:
        """Answer up to ``max_batch`` waiting asks in one batch (model thread); none left means another call took them."""
        taken = []
        while len(taken) < self.max_batch:
            try:
                taken.append(self._asks.get_nowait())
            except queue.Empty:
                break
        ready = []
        for namespace, question, time, future in taken:
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
            try:
                future.set_result(memory.ask(question, time))
            except Exception as exc:
                future.set_exception(exc)

    async def listing(self, namespace: str, offset: int, limit: int) -> dict[str, Any]:
        """The namespace's units (``offset``, at most ``limit``), with their source turn ids, and its sessions."""

        def read() -> dict[str, Any]:
            try:
                memory = self.store.load_namespace(namespace, sentences=False)
            except InputError:
                raise NamespaceNotFound(namespace) from None
            units = [
                {"id": u.id, "fact_text": u.fact_text, "source_turn_ids": list(u.source_turn_ids)}
                for u in memory.units[offset : offset + limit]
            ]
            sessions = sorted({session for session, _ in self.store.done_windows(namespace)})
            return {"namespace": namespace, "units_total": len(memory.units), "offset": offset, "units": units, "sessions": sessions}

        return await self._on_reader(read)

    async def delete(self, namespace: str) -> None:
        """Delete the namespace and everything of it (on the model thread, after the work queued before)."""

        def delete() -> None:
            self._memories.pop(namespace, None)
            if not self.store.delete_namespace(namespace):
                raise NamespaceNotFound(namespace)

        await self._on_model(delete)

