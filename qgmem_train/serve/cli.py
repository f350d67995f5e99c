"""``python -m qgmem_train serve``: the memory API over one store, with an exported model or the configured models.

Loads one predictor (``--model``: an export folder or Hub repo id; else the configured models on the text path,
as ``ask`` does), opens the store, and serves the API (:mod:`qgmem_train.serve.app`) with uvicorn until stopped.
Tenants come from ``--tenants`` or the environment (:mod:`qgmem_train.serve.tenants`); see docs/serve.md.
Searches run on ``--workers`` threads of ``--torch-threads`` each (:mod:`qgmem_train.serve.service`). The defaults are
the cheap ones: rule intents, and on a CPU no LLM reranker unless asked for (an LLM stage asked for on a CPU is
warned about in one line with its measured cost, :mod:`qgmem_train.serve.costs`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import uvicorn

from qgmem_train.errors import InputError
from qgmem_train.memory.store_uri import store_location
from qgmem_train.serve.connections import ConnectionLimits, guarded_protocol
from qgmem_train.serve.limits import Limits
from qgmem_train.serve.operations import operators_pages

SERVE_RERANK_TOP = 20
"""Units a reranker scores a search when the configuration sets no ``retrieval.rerank_top``: a short pool keeps a search cheap."""


def build_parser() -> argparse.ArgumentParser:
    """Options of ``serve``."""
    defaults, guards = Limits(), ConnectionLimits()
    parser = argparse.ArgumentParser(prog="python -m qgmem_train serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, type=store_location, help="memory store folder (created when missing) or postgresql:// URI (docs/store.md)")
    parser.add_argument("--model", help="exported QGMem model (folder or Hub repo id); its config replaces --config/--reranker")
    parser.add_argument("--config", type=Path, help="YAML with a pipeline: section (models, retrieval settings)")
    parser.add_argument("--reranker", choices=["llm", "cross", "none"], help="reranker (default: models.reranker; on a CPU none in place of llm)")
    parser.add_argument("--rerank-top", type=int, help=f"units of the fused pool the reranker scores (default: retrieval.rerank_top, else {SERVE_RERANK_TOP})")
    parser.add_argument("--intent", choices=["llm", "rules"], default="rules", help="query-intent parser: rules without an LLM, or the paper's prompt")
    parser.add_argument("--workers", type=int, help="search threads (default: the cores over --torch-threads)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads of each worker")
    parser.add_argument("--background-nice", type=int, default=5, help="how much nicer (lower priority) the ask and write threads run than searches (Linux; 0: the same)")
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
    parser.add_argument("--turns-per-request", type=int, default=defaults.turns_per_request, help="an added session costs one request per this many turns")
    return parser


def server_config(app: Any, host: str, port: int, guards: ConnectionLimits) -> uvicorn.Config:
    """uvicorn's settings: the guarded HTTP/1.1 protocol (request deadlines, connection cap), no server header."""
    return uvicorn.Config(app, host=host, port=port, log_level="info", server_header=False, http=guarded_protocol(guards))


def default_reranker(config: Path | None, asked: str | None) -> str | None:
    """The reranker kind to build: the one asked for, else the configured one, except an LLM reranker on a CPU (none)."""
    if asked is not None:
        return asked
    from qgmem_train.config import load_pipeline_config
    from qgmem_train.llm.resolver import pick_device

    models = load_pipeline_config(config).models
    if models.reranker == "llm" and models.backend == "transformers" and pick_device(models.device) == "cpu":
        return "none"
    return None


def main(argv: list[str]) -> int:
    """Check the options and tenants, load the model, serve until interrupted."""
    from qgmem_train.predictor import QGMemPredictor
    from qgmem_train.serve.app import create_app
    from qgmem_train.serve.costs import cpu_llm_warning
    from qgmem_train.serve.service import MemoryService
    from qgmem_train.serve.tenants import Tenants

    args = build_parser().parse_args(argv)
    try:
        limits = Limits(args.max_body_bytes, args.max_question_chars, args.max_turns, args.rate_per_minute, args.burst, args.max_batch,
                        args.turns_per_request)  # fmt: skip
        guards = ConnectionLimits(args.header_timeout, args.body_timeout, args.max_connections)
    except ValueError as exc:
        raise InputError("limits", str(exc)) from None
    for option, value in (("--workers", args.workers), ("--torch-threads", args.torch_threads), ("--rerank-top", args.rerank_top)):
        if value is not None and value < 1:
            raise InputError(option, f"must be at least 1, got {value}")
    if not 0 <= args.background_nice <= 19:
        raise InputError("--background-nice", f"must be 0 to 19, got {args.background_nice}")
    if not 0 < args.port < 65536:
        raise InputError("--port", f"{args.port} is not a port number")
    tenants = Tenants.load(args.tenants)
    if args.model is not None:
        predictor = QGMemPredictor.from_pretrained(args.model, intent=args.intent)
    else:
        predictor = QGMemPredictor.from_config(args.config, reranker=default_reranker(args.config, args.reranker), intent=args.intent)
    retrieval = predictor.pipeline.retrieval
    retrieval.rerank_top = args.rerank_top or retrieval.rerank_top or SERVE_RERANK_TOP
    warning = cpu_llm_warning(predictor)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    service = MemoryService(predictor, args.store, max_batch=limits.max_batch, workers=args.workers, torch_threads=args.torch_threads,
                            background_nice=args.background_nice)  # fmt: skip
    try:
        app = operators_pages(create_app(service, tenants, limits), public_metrics=args.public_metrics, public_docs=args.public_docs)
        uvicorn.Server(server_config(app, args.host, args.port, guards)).run()
    finally:
        service.close()
    return 0
