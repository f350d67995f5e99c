"""``python -m qgmem_train eval TASK``: evaluation over a built memory store.

Tasks are sub-subcommands, each writing ``metrics.json`` (flat keys, plus the models and settings
used), a per-question JSONL and figures into ``--out``, every file atomically:

- ``retrieval``: evidence retrieval of the working-memory activation (Recall/Precision/Sufficiency/
  nDCG@k per question of LoCoMo categories 1-4 with gold evidence; every channel alone, the RRF pool
  and the reranked working memory; a Recall@k plot for k = 1..20).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from qgmem_train.errors import InputError
from qgmem_train.eval.benchmarks import EvalQuestion, last_session_time, load_locomo_questions
from qgmem_train.fileio import atomic_output

RECALL_CURVE_KS = tuple(range(1, 21))


def spread_subset(items: Sequence[Any], limit: int | None) -> list[Any]:
    """``limit`` items evenly spaced over ``items`` (all of them when ``limit`` is None or larger)."""
    if limit is None or limit >= len(items):
        return list(items)
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


def git_commit() -> str | None:
    """The project's current commit, when run from a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _parse_channels(text: str) -> list[str]:
    from qgmem_train.retrieval.activation import check_channels

    return check_channels([c.strip() for c in text.split(",") if c.strip()])


def add_retrieval_parser(tasks: argparse._SubParsersAction) -> None:
    """Options of ``eval retrieval``."""
    parser = tasks.add_parser("retrieval", help="evidence retrieval metrics of working-memory activation")
    parser.add_argument("--dataset", required=True, choices=["locomo"], help="benchmark whose questions and gold evidence to use")
    parser.add_argument("--input", required=True, type=Path, help="the benchmark file (e.g. locomo10.json)")
    parser.add_argument("--store", required=True, type=Path, help="memory store built from the same conversations")
    parser.add_argument("--out", required=True, type=Path, help="folder for metrics.json, questions.jsonl and recall_at_k.png")
    parser.add_argument("--config", type=Path, help="YAML with a pipeline: section (models, retrieval settings)")
    parser.add_argument("--channels", type=_parse_channels, help="comma-separated subset of bm25,dense,attr (default: retrieval.channels)")
    parser.add_argument("--reranker", choices=["llm", "cross", "none"], help="reranker (default: models.reranker)")
    parser.add_argument("--intent", choices=["llm", "rules"], default="llm", help="query-intent parser: the paper's prompt, or rules without an LLM")
    parser.add_argument("--limit", type=int, help="evaluate this many questions, evenly spaced over the eligible ones")
    parser.add_argument("--conversation", nargs="+", help="only these conversation ids")
    parser.add_argument("-k", type=int, help="working-memory budget for the metrics (default: retrieval.k)")
    parser.set_defaults(run=run_retrieval)


def run_retrieval(args: argparse.Namespace) -> int:
    """Activate every eligible question, score the rankings, write the report."""
    from qgmem_train.config import load_pipeline_config
    from qgmem_train.eval.plots import close, recall_curves_figure
    from qgmem_train.eval.retrieval_metrics import aggregate, question_metrics, recall_curve
    from qgmem_train.llm.factory import build_embedder, build_llm
    from qgmem_train.llm.prompts import PROMPTS_VERSION
    from qgmem_train.llm.structured import ParseStats
    from qgmem_train.memory.loaders import load_conversations
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.retrieval.activation import ActivationIndex, activate, query_texts
    from qgmem_train.retrieval.intent import parse_intent_rules, parse_intents
    from qgmem_train.retrieval.rerank import build_reranker

    cfg = load_pipeline_config(args.config)
    if args.channels:
        cfg.retrieval.channels = args.channels
    if args.k:
        cfg.retrieval.k = args.k
    if args.limit is not None and args.limit < 1:
        raise InputError("--limit", "must be at least 1")
    reranker_kind = args.reranker or cfg.models.reranker
    k = cfg.retrieval.k

    conversations = {c.id: c for c in load_conversations(args.dataset, args.input, args.conversation)}
    questions = spread_subset(load_locomo_questions(args.input, args.conversation), args.limit)
    if not questions:
        raise InputError(str(args.input), "no questions of categories 1-4 with gold evidence")
    question_time = {cid: last_session_time(c) for cid, c in conversations.items()}

    by_conversation: dict[str, list[EvalQuestion]] = {}
    for q in questions:
        by_conversation.setdefault(q.conversation_id, []).append(q)

    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    curves: dict[str, list[list[float]]] = {}
    stats = ParseStats()
    with MemoryStore.open(args.store) as store:
        missing = sorted(set(by_conversation) - set(store.namespaces()))
        if missing:
            raise InputError(f"{args.store}: namespace {missing[0]}", "not in the store (build it from the same input first)")
        needs_llm = args.intent == "llm" or (reranker_kind == "llm" and not cfg.models.reranker_model)
        llm = build_llm(cfg) if needs_llm else None
        embedder = build_embedder(cfg)
        reranker = build_reranker(cfg, reranker_kind, llm=llm if reranker_kind == "llm" and not cfg.models.reranker_model else None)
        progress = tqdm(total=len(questions), desc="eval retrieval", unit="q")
        for cid, items in by_conversation.items():
            memory = store.load_namespace(cid)
            if memory.embedder_id != embedder.model_id:
                raise InputError(f"{args.store}: namespace {cid}", f"built with embedder {memory.embedder_id!r}, configured {embedder.model_id!r}")
            index = ActivationIndex(memory, cfg.retrieval, embedder)
            sources = {u.id: u.source_turn_ids for u in memory.units}
            pairs = [(q.question, question_time.get(cid)) for q in items]
            intents = (
                _batched(lambda chunk: parse_intents(chunk, llm, stats=stats), pairs, cfg.generation.batch_size)
                if args.intent == "llm"
                else [parse_intent_rules(*p) for p in pairs]
            )
            texts = [query_texts(q.question, intent) for q, intent in zip(items, intents)]
            vectors = embedder.encode([t for group in texts for t in group])
            offsets = np.cumsum([0] + [len(group) for group in texts])
            for i, (q, intent) in enumerate(zip(items, intents)):
                wm = activate(q.question, question_time.get(cid), memory, cfg=cfg.retrieval, llm=llm, embedder=embedder,
                              reranker=reranker, index=index, intent=intent, query_vectors=vectors[offsets[i] : offsets[i + 1]])
                gold = set(q.evidence)
                n_relevant = sum(1 for s in sources.values() if gold.intersection(s))
                rankings = {**wm.channels, "fused": wm.fused}
                if reranker is not None:
                    rankings["reranked"] = wm.reranked
                record: dict[str, Any] = {
                    "conversation": cid, "qa_index": q.index, "category": q.category, "question": q.question,
                    "evidence": q.evidence, "intent": intent.as_dict(),
                    "working_memory": [u.id for u in wm.units],
                    "working_memory_sources": [u.source_turn_ids for u in wm.units],
                    "scores": wm.scores, "timings": wm.timings,
                }
                record.update(question_metrics([sources[u] for u in record["working_memory"]], gold, k, n_relevant))
                for name, ranking in rankings.items():
                    ranked_sources = [sources[u] for u in ranking]
                    for key, value in question_metrics(ranked_sources, gold, k, n_relevant).items():
                        record[f"{name}/{key}"] = value
                    curves.setdefault(name, []).append(recall_curve(ranked_sources, gold, RECALL_CURVE_KS))
                records.append(record)
                progress.update()
        progress.close()

    keys = [f"recall@{k}", f"precision@{k}", f"sufficiency@{k}", f"ndcg@{k}"]
    ranking_names = list(curves)
    metrics = aggregate(records, keys + [f"{name}/{key}" for name in ranking_names for key in keys])
    metrics.update({
        "task": "retrieval",
        "dataset": args.dataset,
        "input": str(args.input),
        "store": str(args.store),
        "k": k,
        "rankings": ranking_names,
        "final_ranking": "reranked" if reranker is not None else "fused",
        "models": {
            "embedder": embedder.model_id,
            "llm": llm.model_id if llm is not None else None,
            "reranker": reranker_kind,
            "reranker_model": reranker.model_id if reranker is not None else None,
        },
        "settings": {"retrieval": asdict(cfg.retrieval), "intent_parser": args.intent, "limit": args.limit,
                     "conversations": sorted(conversations)},
        "parse_stats": stats.as_dict(),
        "prompts_version": PROMPTS_VERSION,
        "commit": git_commit(),
        "seconds": round(time.perf_counter() - started, 2),
    })
    mean_curves = {name: [sum(c[i] for c in values) / len(values) for i in range(len(RECALL_CURVE_KS))] for name, values in curves.items()}
    metrics["recall_curves"] = {name: [round(v, 4) for v in values] for name, values in mean_curves.items()}

    out: Path = args.out
    figure = recall_curves_figure(mean_curves, RECALL_CURVE_KS, title=f"Recall@k on {args.input.name} ({len(records)} questions)")
    with atomic_output(out / "recall_at_k.png", "wb") as handle:
        figure.savefig(handle, format="png")
    close(figure)
    with atomic_output(out / "questions.jsonl") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    with atomic_output(out / "metrics.json") as handle:
        json.dump(metrics, handle, indent=2)
    print(json.dumps({key: metrics[key] for key in ["n_questions", *keys]}, indent=2))
    print(f"wrote {out / 'metrics.json'}, {out / 'questions.jsonl'}, {out / 'recall_at_k.png'}")
    return 0


def _batched(fn: Callable[[list[Any]], list[Any]], items: list[Any], size: int) -> list[Any]:
    out: list[Any] = []
    for start in range(0, len(items), max(1, size)):
        out += fn(items[start : start + size])
    return out


def main(argv: list[str]) -> int:
    """Entry of ``python -m qgmem_train eval``."""
    parser = argparse.ArgumentParser(prog="python -m qgmem_train eval", description=__doc__.split("\n\n")[0])
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    add_retrieval_parser(tasks)
    args = parser.parse_args(argv)
    return args.run(args)
