"""``python -m qgmem_train serve``: the memory API over one store, with an exported model or the configured models.

Loads one predictor (``--model``: an export folder or Hub repo id; else the configured models on the text path,
as ``ask`` does), opens the store, and serves the API (:mod:`qgmem_train.serve.app`) with uvicorn until stopped.
Tenants come from ``--tenants`` or the environment (:mod:`qgmem_train.serve.tenants`); see docs/serve.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import uvicorn

from qgmem_train.errors import InputError
from qgmem_train.memory.store_uri import store_location
from qgmem_train.serve.connections import ConnectionLimits, guarded_protocol
from qgmem_train.serve.limits import Limits
from qgmem_train.serve.operations import operators_pages


def build_parser() -> argparse.ArgumentParser:
    """Options of ``serve``."""
    defaults, guards = Limits(), ConnectionLimits()
    parser = argparse.ArgumentParser(prog="python -m qgmem_train serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, type=store_location, help="memory store folder (created when missing) or postgresql:// URI (docs/store.md)")
    parser.add_argument("--model", help="exported QGMem model (folder or Hub repo id); its config replaces --config/--reranker")
    parser.add_argument("--config", type=Path, help="YAML with a pipeline: section (models, retrieval settings)")
    parser.add_argument("--reranker", choices=["llm", "cross", "none"], help="reranker (default: models.reranker)")
    parser.add_argument("--intent", choices=["llm", "rules"], default="llm", help="query-intent parser: the paper's prompt, or rules without an LLM")
    parser.add_argument("--tenants", type=Path, help="tenants file (YAML or JSON); default: the QGMEM_SERVE_TENANTS variable")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes, help="largest request body")
    parser.add_argument("--max-question-chars", type=int, default=defaults.max_question_chars, help="longest question")
    parser.add_argument("--max-turns", type=int, default=defaults.max_turns, help="most turns in one added session")
    parser.add_argument("--rate-per-minute", type=float, default=defaults.rate_per_minute, help="requests a tenant may make per minute")
    parser.add_argument("--burst", type=int, default=defaults.burst, help="requests a tenant may make at once")
    parser.add_argument("--max-batch", type=int, default=defaults.max_batch, help="most concurrent asks answered in one generate call")
    parser.add_argument("--header-timeout", type=float, default=guards.header_timeout_s, help="seconds a client has to send a request's head")
    parser.add_argument("--body-timeout", type=float, default=guards.body_timeout_s, help="seconds a client has to send a request's body")
    parser.add_argument("--max-connections", type=int, help="most open connections (default: the open-file limit less 256, at most 4096)")
    parser.add_argument("--public-metrics", action="store_true", help="answer /metrics to every client (default: this machine's only)")
    parser.add_argument("--public-docs", action="store_true", help="answer /docs, /redoc and /openapi.json to every client (default: this machine's only)")
    return parser


def server_config(app: Any, host: str, port: int, guards: ConnectionLimits) -> uvicorn.Config:
    """uvicorn's settings: the guarded HTTP/1.1 protocol (request deadlines, connection cap), no server header."""
    return uvicorn.Config(app, host=host, port=port, log_level="info", server_header=False, http=guarded_protocol(guards))


def main(argv: list[str]) -> int:
    """Check the options and tenants, load the model, serve until interrupted."""
    from qgmem_train.predictor import QGMemPredictor
    from qgmem_train.serve.app import create_app
    from qgmem_train.serve.service import MemoryService
    from qgmem_train.serve.tenants import Tenants

    args = build_parser().parse_args(argv)
    try:
        limits = Limits(args.max_body_bytes, args.max_question_chars, args.max_turns, args.rate_per_minute, args.burst, args.max_batch)
        guards = ConnectionLimits(args.header_timeout, args.body_timeout, args.max_connections)
    except ValueError as exc:
        raise InputError("limits", str(exc)) from None
    if not 0 < args.port < 65536:
        raise InputError("--port", f"{args.port} is not a port number")
    tenants = Tenants.load(args.tenants)
    if args.model is not None:
        predictor = QGMemPredictor.from_pretrained(args.model, intent=args.intent)
    else:
        predictor = QGMemPredictor.from_config(args.config, reranker=args.reranker, intent=args.intent)
    service = MemoryService(predictor, args.store, max_batch=limits.max_batch)
    try:
        app = operators_pages(create_app(service, tenants, limits), public_metrics=args.public_metrics, public_docs=args.public_docs)
        uvicorn.Server(server_config(app, args.host, args.port, guards)).run()
    finally:
        service.close()
    return 0
