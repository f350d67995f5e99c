"""The HTTP API of ``serve``: endpoints, bearer-token tenants, bounds, one-line JSON errors and Prometheus metrics.

Every ``/v1`` endpoint needs a tenant's bearer token, checked (with the tenant's rate and the body's JSON media type)
before the body is read, so a caller without a token learns nothing of the schema. A namespace the tenant may not touch answers exactly as
one that does not exist (404, the same message), so no tenant learns another's namespaces. Errors are one
JSON object ``{"error": "<where>: <what>"}``, like the CLI's one line. (No ``from __future__ import annotations``:
FastAPI reads the endpoints' annotations, which name the tenant dependency local to :func:`create_app`.)
"""

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.memory.loaders import session_time
from qgmem_train.memory.types import session_fingerprint
from qgmem_train.serve import schemas
from qgmem_train.pipeline.results import ask_record
from qgmem_train.serve.adds import AddStatuses
from qgmem_train.serve.filters import UnitFilter
from qgmem_train.serve.limits import Limits, RateLimiter
from qgmem_train.serve.service import MemoryService, NamespaceNotFound, SessionNotFound
from qgmem_train.serve.tenants import Tenant, Tenants

log = logging.getLogger(__name__)

Namespace = Annotated[str, Path(pattern=schemas.NAMESPACE_PATTERN, description="the namespace (a user or conversation)")]
SessionId = Annotated[str, Path(min_length=1, max_length=256, description="the session's id")]
Offset = Annotated[int, Query(ge=0, description="items of the listing skipped")]
Limit = Annotated[int, Query(ge=1, le=1000, description="most items in the page")]
Wait = Annotated[bool, Query(description="false: answer 202 at once with the add's status URL, the add queued")]
ERRORS = {status: {"model": schemas.ErrorOut} for status in (400, 401, 404, 413, 415, 422, 429, 503)}
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Request seconds observed: an ask on a CPU takes minutes, so the buckets go well past 10 s."""
BODY_METHODS = ("POST", "PUT", "PATCH")


class ApiError(Exception):
    """An HTTP error with its one-line message (and headers, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def not_found(namespace: str) -> ApiError:
    """The one answer for a namespace that is absent or not the caller's."""
    return ApiError(404, f"namespace {namespace}: not found")


def api_error(exc: Exception) -> ApiError:
    """The status and one line a request failing with ``exc`` is answered with (500, naming nothing, for the unexpected)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InputError):
        return ApiError(400, str(exc))
    if isinstance(exc, ModelUnavailableError):
        return ApiError(503, f"model unavailable: {exc}")
    if isinstance(exc, SessionNotFound):
        return ApiError(404, f"session {exc}: not found")
    if isinstance(exc, NamespaceNotFound):
        return not_found(str(exc))
    return ApiError(500, "internal error (see the server's log)")


class BodyLimit:
    """Refuse (413) a request body over ``max_bytes`` before any of it is parsed, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse({"error": f"request body: more than the {self.max_bytes} bytes a request may have"}, status_code=413)
        await response(scope, receive, send)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (labels name routes and statuses, never namespaces or tenants)."""

    def __init__(self, service: MemoryService) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("qgmem_requests", "HTTP requests answered", ["route", "status"], registry=self.registry)
        self.seconds = Histogram("qgmem_request_seconds", "Seconds to answer a request", ["route"], buckets=SECONDS_BUCKETS, registry=self.registry)
        sizes = (1, 2, 4, 8, 16, 32, 64)
        self.batch = Histogram("qgmem_ask_batch_size", "Asks answered per generate call", buckets=sizes, registry=self.registry)
        self.search_batch = Histogram("qgmem_search_batch_size", "Searches whose queries are embedded together", buckets=sizes, registry=self.registry)
        Gauge("qgmem_asks_pending", "Asks waiting for the model", registry=self.registry).set_function(lambda: service.pending_asks)
        Gauge("qgmem_searches_pending", "Searches waiting for a worker", registry=self.registry).set_function(lambda: service.pending_searches)
        service.on_batch = self.batch.observe
        service.on_search_batch = self.search_batch.observe


def create_app(service: MemoryService, tenants: Tenants, limits: Limits = Limits()) -> FastAPI:
    """The API over ``service`` for ``tenants`` within ``limits``."""
    app = FastAPI(
        title="qgmem memory service",
        version="1",
        description="Add sessions to a namespace's memory, search it, ask questions with cited evidence, list and delete it.",
    )
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    metrics = Metrics(service)
    rates = RateLimiter(limits.rate_per_minute, limits.burst)
    adds = AddStatuses()
    running: set[asyncio.Task] = set()
    """Asynchronous adds under way (held so that none is collected before it ends)."""

    bearer = HTTPBearer(auto_error=False, description="a tenant's token (see docs/serve.md)")

    def charge(found: Tenant, cost: float) -> None:
        wait = rates.take(found.name, cost)
        if wait:
            raise ApiError(429, f"tenant {found.name}: more than {limits.rate_per_minute:g} requests a minute", {"Retry-After": str(max(1, math.ceil(wait)))})

    @app.middleware("http")
    async def gate(request: Request, call_next: Any) -> Response:
        """A /v1 request's token, its tenant's rate and its body's media type, checked before the body is read."""
        if not request.url.path.startswith("/v1/"):
            return await call_next(request)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        found = tenants.authenticate(token.strip() if scheme.lower() == "bearer" else None)
        try:
            if found is None:
                raise ApiError(401, "authorization: missing or unknown bearer token", {"WWW-Authenticate": "Bearer"})
            charge(found, 1.0)
            media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            if request.method in BODY_METHODS and media != "application/json":
                raise ApiError(415, f"content-type: {media or 'none'}, expected application/json")
        except ApiError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)
        request.state.tenant = found
        return await call_next(request)

    async def tenant(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Tenant:
        return request.state.tenant

    Caller = Annotated[Tenant, Depends(tenant)]

    def check_time(value: str | None, where: str) -> str | None:
        return session_time(value, where) if value is not None else None

    def allowed(caller: Tenant, namespace: str) -> None:
        if not caller.may(namespace):
            raise not_found(namespace)

    def check_question(question: str) -> None:
        if not question.strip():
            raise ApiError(400, "question: empty")
        if len(question) > limits.max_question_chars:
            raise ApiError(400, f"question: {len(question)} characters, more than the {limits.max_question_chars} a question may have")

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        name = getattr(route, "path", "unmatched")
        metrics.requests.labels(name, str(response.status_code)).inc()
        metrics.seconds.labels(name).observe(time.perf_counter() - started)
        return response

    @app.exception_handler(ApiError)
    @app.exception_handler(InputError)
    @app.exception_handler(ModelUnavailableError)
    @app.exception_handler(SessionNotFound)
    @app.exception_handler(NamespaceNotFound)
    async def known_error(request: Request, exc: Exception) -> JSONResponse:
        error = api_error(exc)
        return JSONResponse({"error": error.message}, status_code=error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return JSONResponse({"error": f"{where}: {first['msg']}"}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": f"{request.url.path}: {exc.detail}"}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def failure(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"error": "internal error (see the server's log)"}, status_code=500)

    @app.get("/health", response_model=schemas.HealthOut, tags=["operations"])
    async def health() -> dict[str, Any]:
        """The server is up and its model loaded."""
        return {"status": "ok", "path": service.predictor.path}

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics: requests and seconds per route and status, ask batch sizes, asks waiting."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/namespaces", response_model=schemas.NamespacesOut, responses=ERRORS, tags=["memory"])
    async def namespaces(
        caller: Caller,
        limit: Limit = 100,
        after: Annotated[str | None, Query(max_length=128, description="the last namespace of the page before")] = None,
    ) -> dict[str, Any]:
        """A page of the caller's namespaces that hold memory, in name order; ``next`` is the ``after`` of the next page."""
        names = await service.namespaces(caller.namespaces, caller.prefixes, after, limit)
        return {"namespaces": names, "next": names[-1] if len(names) == limit else None}

    def accepted(namespace: str, session_id: str | None, add: Callable[[Callable[[], None]], Awaitable[dict[str, Any]]]) -> JSONResponse:
        """Run ``add`` (given its on-start callback) after the answer: 202 with the add's status URL."""
        add_id = adds.queued(namespace, session_id)

        async def run() -> None:
            try:
                result = await add(lambda: adds.update(namespace, add_id, state="running"))
            except Exception as exc:
                error = api_error(exc)
                if error.status == 500:
                    log.error("asynchronous add to a namespace failed", exc_info=exc)
                adds.update(namespace, add_id, state="failed", status=error.status, error=error.message)
            else:
                adds.update(namespace, add_id, state="done", result=result)

        task = asyncio.ensure_future(run())
        running.add(task)
        task.add_done_callback(running.discard)
        url = f"/v1/namespaces/{namespace}/adds/{add_id}"
        return JSONResponse({"add_id": add_id, "status_url": url}, status_code=202, headers={"Location": url})

    def check_turns(caller: Tenant, turns: list[schemas.TurnIn]) -> list[dict[str, Any]]:
        if len(turns) > limits.max_turns:
            raise ApiError(400, f"turns: {len(turns)}, more than the {limits.max_turns} a session may have")
        charge(caller, limits.add_cost(len(turns)) - 1.0)
        return [turn.model_dump(exclude_none=True) for turn in turns]

    @app.post("/v1/namespaces/{namespace}/sessions", response_model=schemas.SessionOut, responses={**ERRORS, 202: {"model": schemas.AddAccepted}}, tags=["memory"])
    async def add_session(namespace: Namespace, body: schemas.SessionIn, caller: Caller, wait: Wait = True) -> Any:
        """Add one session to the namespace (created on its first session); a retry with the same session id stores it once.
        With ``wait=false`` the add is queued and answered at once (202) with the URL of its status."""
        allowed(caller, namespace)
        turns = check_turns(caller, body.turns)
        if not wait:
            session_id = body.session_id or session_fingerprint(turns, body.time)
            return accepted(namespace, session_id, lambda on_start: service.add_session(namespace, turns, body.time, session_id, on_start))
        return await service.add_session(namespace, turns, body.time, body.session_id)

    @app.post("/v1/namespaces/{namespace}/sessions/{session_id}/turns", response_model=schemas.SessionOut,
              responses={**ERRORS, 202: {"model": schemas.AddAccepted}}, tags=["memory"])  # fmt: skip
    async def append_turns(namespace: Namespace, session_id: SessionId, body: schemas.TurnsIn, caller: Caller, wait: Wait = True) -> Any:
        """Append turns to a stored session and build the units of its windows that hold them, in one transaction; turns
        without an id are numbered on from the session's, so give ids for a retry to append once. ``wait`` as for an add."""
        allowed(caller, namespace)
        turns = check_turns(caller, body.turns)
        if not wait:
            return accepted(namespace, session_id, lambda on_start: service.append_turns(namespace, session_id, turns, limits.max_turns, on_start))
        return await service.append_turns(namespace, session_id, turns, limits.max_turns)

    @app.get("/v1/namespaces/{namespace}/adds/{add_id}", response_model=schemas.AddStatus, responses=ERRORS, tags=["memory"])
    async def add_status(namespace: Namespace, add_id: Annotated[str, Path(max_length=64)], caller: Caller) -> dict[str, Any]:
        """The state of an asynchronous add: queued, running, done (with the add's answer) or failed (with its status and error)."""
        allowed(caller, namespace)
        found = adds.get(namespace, add_id)
        if found is None:
            raise ApiError(404, f"add {add_id}: not found")
        return found

    @app.post("/v1/namespaces/{namespace}/search", response_model=schemas.SearchOut, responses=ERRORS, tags=["memory"])
    async def search(namespace: Namespace, body: schemas.SearchIn, caller: Caller) -> dict[str, Any]:
        """The working memory for the question (its ``top_k`` best units, of ``speaker``, ``session_id`` and sessions dated
        ``since`` to ``until`` when given) and its MEMORY_CONTEXT, for an LLM of the caller's."""
        allowed(caller, namespace)
        check_question(body.question)
        keep = UnitFilter(body.speaker, body.session_id, check_time(body.since, "since"), check_time(body.until, "until"))
        if keep.since and keep.until and keep.since[:10] > keep.until[:10]:
            raise ApiError(400, f"since: {keep.since[:10]} is after until {keep.until[:10]}")
        found = await service.search(namespace, body.question, check_time(body.time, "time"), body.top_k, keep)
        return found.to_dict()

    @app.post("/v1/namespaces/{namespace}/ask", response_model=schemas.AskOut, responses=ERRORS, tags=["memory"])
    async def ask(namespace: Namespace, body: schemas.QuestionIn, caller: Caller) -> dict[str, Any]:
        """The answer with its reasoning path and cited units: the object ``ask --json`` prints."""
        allowed(caller, namespace)
        check_question(body.question)
        return ask_record(await service.ask(namespace, body.question, check_time(body.time, "time")))

    @app.get("/v1/namespaces/{namespace}/memory", response_model=schemas.MemoryOut, responses=ERRORS, tags=["memory"])
    async def memory(namespace: Namespace, caller: Caller, offset: Offset = 0, limit: Limit = 100) -> dict[str, Any]:
        """A page of the namespace's units with their source turn ids, and its unit and session counts."""
        allowed(caller, namespace)
        return await service.listing(namespace, offset, limit)

    @app.get("/v1/namespaces/{namespace}/sessions", response_model=schemas.SessionsOut, responses=ERRORS, tags=["memory"])
    async def sessions(namespace: Namespace, caller: Caller, offset: Offset = 0, limit: Limit = 100) -> dict[str, Any]:
        """A page of the namespace's sessions (id, turns, date), in id order."""
        allowed(caller, namespace)
        return await service.sessions(namespace, offset, limit)

    @app.get("/v1/namespaces/{namespace}/sessions/{session_id}", response_model=schemas.SessionTurnsOut, responses=ERRORS, tags=["memory"])
    async def session(namespace: Namespace, session_id: SessionId, caller: Caller, offset: Offset = 0, limit: Limit = 100) -> dict[str, Any]:
        """One session: its turn count, date and a page of its turns, in order."""
        allowed(caller, namespace)
        return await service.session(namespace, session_id, offset, limit)

    @app.delete("/v1/namespaces/{namespace}/sessions/{session_id}", status_code=204, responses=ERRORS, tags=["memory"])
    async def delete_session(namespace: Namespace, session_id: SessionId, caller: Caller) -> Response:
        """Delete one session: its turns, the units built from it and the traces holding them (the namespace stays)."""
        allowed(caller, namespace)
        await service.delete_session(namespace, session_id)
        return Response(status_code=204)

    @app.delete("/v1/namespaces/{namespace}", status_code=204, responses=ERRORS, tags=["memory"])
    async def delete(namespace: Namespace, caller: Caller) -> Response:
        """Delete the namespace and everything stored of it."""
        allowed(caller, namespace)
        await service.delete(namespace)
        return Response(status_code=204)

    return app
