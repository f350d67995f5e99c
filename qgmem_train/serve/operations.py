"""The operators' pages of ``serve`` (``/metrics``, ``/docs``, ``/redoc``, ``/openapi.json``): they answer without a
token, so by default only a client on this machine sees them; ``--public-metrics`` and ``--public-docs`` open them to all."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from qgmem_train.llm.http import is_loopback_host

METRICS_PATHS = frozenset({"/metrics"})
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


class LoopbackOnly:
    """Answer ``paths`` only to clients on a loopback address; anyone else gets the 404 of a path that does not exist."""

    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app, self.paths = app, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths and not is_loopback_host((scope.get("client") or ("",))[0] or ""):
            await JSONResponse({"detail": "Not Found"}, status_code=404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def operators_pages(app: ASGIApp, *, public_metrics: bool, public_docs: bool) -> ASGIApp:
    """``app`` with the operators' pages not opened by a switch answered to loopback clients only."""
    private = (METRICS_PATHS if not public_metrics else frozenset()) | (DOCS_PATHS if not public_docs else frozenset())
    return LoopbackOnly(app, private) if private else app
