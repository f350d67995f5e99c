"""``eval retrieval``: evidence retrieval of the working-memory activation on LoCoMo.

Recall/Precision/Sufficiency/nDCG@k per question of categories 1-4 with gold evidence, for every
channel alone, the RRF pool and the reranked working memory, plus a Recall@k curve (k = 1..20). The
store may hold only some of the input's conversations: those are evaluated and the others named as
skipped; a conversation asked for with ``--conversation`` must be in the store.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from qgmem_train.benchmarks.loaders import group_by_conversation, last_session_time, load_locomo_questions, spread_subset
from qgmem_train.errors import InputError
from qgmem_train.eval.provenance import git_commit
from qgmem_train.fileio import atomic_output
from qgmem_train.memory.store_uri import shown_store

RECALL_CURVE_KS = tuple(range(1, 21))


def stored_conversations(conversation_ids: Sequence[str], namespaces: Sequence[str], store: str, requested: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(evaluated, skipped) conversations of the input: the ones the store holds and the others.

    A conversation named in ``requested`` (``--conversation``) that the store lacks is an error, as is a
    store holding none of the input's conversations.
    """
    held = set(namespaces)
    missing_requested = [cid for cid in requested or () if cid not in held]
    if missing_requested:
        raise InputError(f"{store}: namespace {missing_requested[0]}", "not in the store (build it from the same input first)")
    evaluated = [cid for cid in conversation_ids if cid in held]
    if not evaluated:
        raise InputError(store, f"holds none of the input's conversations ({', '.join(conversation_ids[:5])}); build it from the same input first")
    return evaluated, [cid for cid in conversation_ids if cid not in held]


def run_retrieval(args: argparse.Namespace) -> int:
    """Activate every eligible question of the stored conversations, score the rankings, write the report."""
    from qgmem_train.config import load_pipeline_config
    from qgmem_train.eval.plots import close, recall_curves_figure
    from qgmem_train.llm.factory import build_embedder, build_llm
    from qgmem_train.llm.prompts import PROMPTS_VERSION
    from qgmem_train.llm.structured import ParseStats
    from qgmem_train.memory.loaders import load_conversations
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.metrics.retrieval import aggregate, question_metrics, recall_curve, relevance
    from qgmem_train.retrieval.activation import ActivationIndex, activate, encode_queries
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
    questions = load_locomo_questions(args.input, args.conversation)
    question_time = {cid: last_session_time(c) for cid, c in conversations.items()}

    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    curves: dict[str, list[list[float]]] = {}
    stats = ParseStats()
    with MemoryStore.open(args.store) as store:
        evaluated, skipped = stored_conversations(list(conversations), store.namespaces(), shown_store(args.store), args.conversation)
        if skipped:
            print(f"evaluating {len(evaluated)} of {len(conversations)} conversations; not in {shown_store(args.store)}, skipped: {', '.join(skipped)}")
        questions = spread_subset([q for q in questions if q.conversation_id in set(evaluated)], args.limit)
        if not questions:
            raise InputError(str(args.input), f"no questions of categories 1-4 with gold evidence in {', '.join(evaluated)}")
        needs_llm = args.intent == "llm" or (reranker_kind == "llm" and not cfg.models.reranker_model)
        llm = build_llm(cfg) if needs_llm else None
        embedder = build_embedder(cfg)
        reranker = build_reranker(cfg, reranker_kind, llm=llm if reranker_kind == "llm" and not cfg.models.reranker_model else None)
        progress = tqdm(total=len(questions), desc="eval retrieval", unit="q")
        for cid, items in group_by_conversation(questions).items():
            memory = store.load_namespace(cid, embedder_id=embedder.model_id, sentences=cfg.retrieval.sentence_vectors)
            index = ActivationIndex(memory, cfg.retrieval, embedder)
            sources = {u.id: u.source_turn_ids for u in memory.units}
            pairs = [(q.question, question_time.get(cid)) for q in items]
            intents = (
                _batched(lambda chunk: parse_intents(chunk, llm, stats=stats), pairs, cfg.generation.batch_size)
                if args.intent == "llm"
                else [parse_intent_rules(*p) for p in pairs]
            )
            vectors = encode_queries(embedder, [q.question for q in items], intents)
            for q, intent, query_vectors in zip(items, intents, vectors):
                wm = activate(q.question, question_time.get(cid), memory, cfg=cfg.retrieval, llm=llm, embedder=embedder,
                              reranker=reranker, index=index, intent=intent, query_vectors=query_vectors)
                gold = set(q.evidence)
                n_relevant = sum(relevance(list(sources.values()), gold))
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
        "store": shown_store(args.store),
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
                     "conversations": sorted(evaluated), "skipped_conversations": skipped},
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
