"""The HTTP API of ``serve``: endpoints, bearer-token tenants, bounds, one-line JSON errors and Prometheus metrics.

Every ``/v1`` endpoint needs a tenant's bearer token. A namespace the tenant may not touch answers exactly as
one that does not exist (404, the same message), so no tenant learns another's namespaces. Errors are one
JSON object ``{"error": "<where>: <what>"}``, like the CLI's one line. (No ``from __future__ import annotations``:
FastAPI reads the endpoints' annotations, which name the tenant dependency local to :func:`create_app`.)
"""

import logging
import time
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.pipeline.results import ask_record
from qgmem_train.serve import schemas
from qgmem_train.serve.limits import Limits, RateLimiter
from qgmem_train.serve.service import MemoryService, NamespaceNotFound
from qgmem_train.serve.tenants import Tenant, Tenants

log = logging.getLogger(__name__)

Namespace = Annotated[str, Path(pattern=schemas.NAMESPACE_PATTERN, description="the namespace (a user or conversation)")]
ERRORS = {status: {"model": schemas.ErrorOut} for status in (400, 401, 404, 413, 422, 429, 503)}


class ApiError(Exception):
    """An HTTP error with its one-line message (and headers, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def not_found(namespace: str) -> ApiError:
    """The one answer for a namespace that is absent or not the caller's."""
    return ApiError(404, f"namespace {namespace}: not found")


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
        self.seconds = Histogram("qgmem_request_seconds", "Seconds to answer a request", ["route"], registry=self.registry)
        self.batch = Histogram("qgmem_ask_batch_size", "Asks answered per generate call", buckets=(1, 2, 4, 8, 16, 32, 64), registry=self.registry)
        pending = Gauge("qgmem_asks_pending", "Asks waiting for the model", registry=self.registry)
        pending.set_function(lambda: service.pending_asks)
        service.on_batch = self.batch.observe


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

    async def tenant(request: Request) -> Tenant:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        found = tenants.authenticate(token.strip() if scheme.lower() == "bearer" else None)
        if found is None:
            raise ApiError(401, "authorization: missing or unknown bearer token", {"WWW-Authenticate": "Bearer"})
        wait = rates.take(found.name)
        if wait:
            raise ApiError(429, f"tenant {found.name}: more than {limits.rate_per_minute:g} requests a minute", {"Retry-After": str(max(1, round(wait)))})
        return found

    Caller = Annotated[Tenant, Depends(tenant)]

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
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(InputError)
    async def input_error(request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.exception_handler(ModelUnavailableError)
    async def unavailable(request: Request, exc: ModelUnavailableError) -> JSONResponse:
        return JSONResponse({"error": f"model unavailable: {exc}"}, status_code=503)

    @app.exception_handler(NamespaceNotFound)
    async def absent(request: Request, exc: NamespaceNotFound) -> JSONResponse:
        error = not_found(str(exc))
        return JSONResponse({"error": error.message}, status_code=error.status)

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
    async def namespaces(caller: Caller) -> dict[str, Any]:
        """The caller's namespaces that hold memory."""
        return {"namespaces": [name for name in await service.namespaces() if caller.may(name)]}

    @app.post("/v1/namespaces/{namespace}/sessions", response_model=schemas.SessionOut, responses=ERRORS, tags=["memory"])
    async def add_session(namespace: Namespace, body: schemas.SessionIn, caller: Caller) -> dict[str, Any]:
        """Add one session to the namespace (created on its first session); a retry with the same session id stores it once."""
        allowed(caller, namespace)
        if len(body.turns) > limits.max_turns:
            raise ApiError(400, f"turns: {len(body.turns)}, more than the {limits.max_turns} a session may have")
        turns = [turn.model_dump(exclude_none=True) for turn in body.turns]
        return await service.add_session(namespace, turns, body.time, body.session_id)

    @app.post("/v1/namespaces/{namespace}/search", response_model=schemas.SearchOut, responses=ERRORS, tags=["memory"])
    async def search(namespace: Namespace, body: schemas.QuestionIn, caller: Caller) -> dict[str, Any]:
        """The working memory for the question and its MEMORY_CONTEXT, for an LLM of the caller's."""
        allowed(caller, namespace)
        check_question(body.question)
        return (await service.search(namespace, body.question, body.time)).to_dict()

    @app.post("/v1/namespaces/{namespace}/ask", response_model=schemas.AskOut, responses=ERRORS, tags=["memory"])
    async def ask(namespace: Namespace, body: schemas.QuestionIn, caller: Caller) -> dict[str, Any]:
        """The answer with its reasoning path and cited units: the object ``ask --json`` prints."""
        allowed(caller, namespace)
        check_question(body.question)
        return ask_record(await service.ask(namespace, body.question, body.time))

    @app.get("/v1/namespaces/{namespace}/memory", response_model=schemas.MemoryOut, responses=ERRORS, tags=["memory"])
    async def memory(
        namespace: Namespace, caller: Caller, offset: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> dict[str, Any]:
        """The namespace's units (a page of them) with their source turn ids, and its sessions."""
        allowed(caller, namespace)
        return await service.listing(namespace, offset, limit)

    @app.delete("/v1/namespaces/{namespace}", status_code=204, responses=ERRORS, tags=["memory"])
    async def delete(namespace: Namespace, caller: Caller) -> Response:
        """Delete the namespace and everything stored of it."""
        allowed(caller, namespace)
        await service.delete(namespace)
        return Response(status_code=204)

    return app
