"""``python -m qgmem_train ask``: answer one question over a memory store and show the evidence it cites.

Activation (intent, three channels, RRF, reranker) selects the working memory; the configured LLM answers
from its serialization and its local graph's facts (the text path, :mod:`qgmem_train.answer`), or an
exported model with its graph token (``--model``). The answer is printed first, then the units its
reasoning path cites (MU#/F# labels; the whole working memory when it cites none), each with its source
turns. ``--json`` prints one JSON object instead, for scripts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qgmem_train.errors import InputError
from qgmem_train.memory.store_uri import store_location
from qgmem_train.pipeline.results import ask_record
from qgmem_train.predictor import QGMemPredictor
from qgmem_train.terminal import json_line

HUB_FORM = "hf://"
"""How ``--model`` names a Hub repo: ``hf://owner/name``."""


def build_parser() -> argparse.ArgumentParser:
    """Options of ``ask``."""
    parser = argparse.ArgumentParser(prog="python -m qgmem_train ask", description=__doc__.split("\n\n")[0])
    parser.add_argument("question", help="the question to answer")
    parser.add_argument("--store", required=True, type=store_location, help="memory store folder or postgresql:// URI (docs/store.md)")
    parser.add_argument("--namespace", help="namespace (user or conversation) to search; needed when the store has several")
    parser.add_argument("--config", type=Path, help="YAML with a pipeline: section (models, retrieval settings)")
    parser.add_argument("--time", help="when the question is asked (ISO date); resolves relative expressions only")
    parser.add_argument("--reranker", choices=["llm", "cross", "none"], help="reranker (default: models.reranker)")
    parser.add_argument("--intent", choices=["llm", "rules"], default="llm", help="query-intent parser: the paper's prompt, or rules without an LLM")
    parser.add_argument(
        "--model", help=f"exported QGMem model (a folder, or {HUB_FORM}owner/name for a Hub repo): answer with it; its config replaces --config/--reranker"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (answer, reasoning path, cited units with source turns, tokens, seconds)")
    return parser


def pick_namespace(available: list[str], wanted: str | None, store: Path | str) -> str:
    """The namespace to search: ``wanted`` if present, else the only one; a missing ``wanted`` names no other."""
    if wanted is not None:
        if wanted not in available:
            raise InputError(f"{store}: --namespace {wanted}", "not in this store")  # other namespaces are other users' ids
        return wanted
    if len(available) != 1:
        raise InputError(f"{store}", f"holds {len(available)} namespaces; pick one with --namespace")  # the others are other users' ids
    return available[0]


def export_reference(value: str) -> str | Path:
    """``--model`` as :meth:`QGMemPredictor.from_pretrained` takes it: a Hub repo id only when written ``hf://owner/name``,
    else a folder that must exist (a typo of a folder never reaches the Hub, nor a cache holding a repo of that name)."""
    if value.startswith(HUB_FORM):
        return value[len(HUB_FORM):]
    if not Path(value).expanduser().exists():
        from qgmem_train.llm.resolver import looks_like_hub_repo_id

        hint = f"for the Hub repo, write {HUB_FORM}{value}" if looks_like_hub_repo_id(value) else f"an export on the Hub is named {HUB_FORM}owner/name"
        raise InputError(value, f"no such folder ({hint})")
    return Path(value)


def main(argv: list[str]) -> int:
    """Answer the question; print the answer and the cited units with their source turns, or one JSON object."""
    from qgmem_train.memory.store import MemoryStore

    args = build_parser().parse_args(argv)
    if not args.question.strip():
        raise InputError("question", "empty question")
    if args.time is not None:
        from qgmem_train.memory.timeparse import utterance_date

        if utterance_date(args.time) is None:
            raise InputError("--time", f"not an ISO date: {args.time!r}")
    with MemoryStore.open(args.store) as store:
        namespace = pick_namespace(store.namespaces(), args.namespace, store.path)
    if args.model is not None:
        predictor = QGMemPredictor.from_pretrained(export_reference(args.model), intent=args.intent)
    else:
        predictor = QGMemPredictor.from_config(args.config, reranker=args.reranker, intent=args.intent)
    with predictor.memory(namespace, args.store) as memory:
        result = memory.ask(args.question, args.time)
    print(json_line(ask_record(result)) if args.json else result.render())
    return 0
