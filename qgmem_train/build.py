"""``python -m qgmem_train build``: build or extend a memory store from conversations.

Rerunning the same command resumes a build that was stopped and, when the input has gained sessions,
extracts only the new windows and updates only the traces they touch; a session already stored (whole
or in part) is never stored again. Several builds may write one store at once. A namespace keeps the
units mode, window and overlap it was built with: a build asking others is refused before anything is
written.
"""

from __future__ import annotations

import argparse
import time

from tqdm.auto import tqdm

from qgmem_train.config import load_pipeline_config
from qgmem_train.errors import InputError
from qgmem_train.memory.construct import conversation_windows, refuse_long_turns
from qgmem_train.memory.loaders import DATASETS, load_conversations
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.store_file import BUSY_TIMEOUT_S
from qgmem_train.memory.store_uri import store_location
from qgmem_train.pipeline.construction import build_conversations, refuse_unbuildable
from qgmem_train.pipeline.models import PipelineModels


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    p = argparse.ArgumentParser(prog="python -m qgmem_train build", description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument("--dataset", required=True, choices=DATASETS, help="input format (jsonl: the plain format of docs/conversations.md)")
    p.add_argument("--input", required=True, help="file or folder to read")
    p.add_argument("--conversation", nargs="+", action="extend", metavar="ID", help="only these conversation ids (default: all)")
    p.add_argument("--store", required=True, type=store_location, help="store directory (created when missing) or postgresql:// URI (docs/store.md)")
    p.add_argument("--namespace", help="namespace to build into (default: one per conversation, named by its id)")
    p.add_argument("--units", choices=("llm", "turns"), help="llm: the paper's two-stage extraction; turns: every turn a unit, no LLM (default: from config)")
    p.add_argument("--config", help="YAML with a pipeline: section (default: bundled CPU models, paper hyperparameters)")
    p.add_argument("--limit-sessions", type=int, metavar="K", help="only the first K sessions of each conversation")
    p.add_argument(
        "--busy-timeout", type=float, default=BUSY_TIMEOUT_S, metavar="SECONDS",
        help=f"how long a write waits for other writers of the store before giving up (default: {BUSY_TIMEOUT_S:g})",
    )  # fmt: skip
    return p


def main(argv: list[str]) -> int:
    """Run the build; returns the exit code."""
    args = parser().parse_args(argv)
    if args.limit_sessions is not None and args.limit_sessions < 1:
        raise InputError("--limit-sessions", "must be at least 1")
    if args.busy_timeout < 0:
        raise InputError("--busy-timeout", "must be at least 0")
    cfg = load_pipeline_config(args.config)
    if args.units:
        cfg.construction.units = args.units
    conversations = load_conversations(args.dataset, args.input, args.conversation)
    if not conversations:
        raise InputError(args.input, "no conversations found")
    for conversation in conversations:
        refuse_long_turns(conversation, cfg.construction.max_turn_chars)  # before the store is made
    started = time.perf_counter()
    with MemoryStore.open(args.store, create=True, busy_timeout=args.busy_timeout) as store:
        refuse_unbuildable(store, conversations, cfg, args.namespace)  # before the progress bar shows
        windows = {c.id: conversation_windows(c, cfg, args.limit_sessions) for c in conversations}
        total = sum(map(len, windows.values()))
        initial = sum(
            len({(w.session.id, w.index) for w in windows[c.id]} & store.done_windows(args.namespace or c.id)) for c in conversations
        )
        traces = 0
        with tqdm(total=total, initial=initial, unit="window", desc="build", dynamic_ncols=True) as bar:
            reports = build_conversations(store, conversations, PipelineModels(cfg), namespace=args.namespace, limit_sessions=args.limit_sessions,
                                          progress=bar)  # fmt: skip
        units = sum(report.units for report in reports)
        dropped = sum(report.dropped for report in reports)
        namespaces = list(dict.fromkeys(report.namespace for report in reports))
        for namespace in namespaces:
            traces += store.count_traces(namespace)
        stored = sum(store.count_units(n) for n in namespaces)
    print(
        f"built {len(conversations)} conversation(s) into {store.path} [{', '.join(namespaces)}]: "
        f"units {stored} ({units} new), traces {traces}, outputs dropped {dropped}, {time.perf_counter() - started:.1f} s"
    )
    return 0
