"""The trained cross-encoder against the fused order, on LoCoMo conversations it never trained on, and its latency.

Every question (categories 1-4 with gold evidence) of the held-out conversations (those the model's
``training.json`` lists as validation, unless ``--conversation`` names others) is activated over the
same turns-mode store three ways: ``fused`` (the RRF order, no reranker), ``reranked, replace`` (the
cross-encoder's order of the fused pool) and ``reranked, rrf`` (RRF of both orders). The reranker
scores each pool once and both modes reuse the scores. Reported: recall/precision/sufficiency/nDCG@10
overall and per category, the fused pool's recall@100 (the ceiling of any reordering), and the
latency of scoring each question's pool of 100 candidates (p50/p95, on the threads torch uses).

    python bench/bench_reranker.py                        # checkpoints/reranker-cpu/model (make reranker)
    python bench/bench_reranker.py --model DIR --conversation conv-30 conv-47
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from machine import machine_info

from qgmem_train.config import PipelineConfig
from qgmem_train.eval.benchmarks import LOCOMO_CATEGORY_NAMES
from qgmem_train.eval.question_batches import locomo_question_batches
from qgmem_train.eval.retrieval_metrics import aggregate, question_metrics, recall_at_k
from qgmem_train.fileio import write_report_atomic
from qgmem_train.llm.factory import build_embedder
from qgmem_train.memory.store import MemoryStore
from qgmem_train.reranker.cli import TRAINING_RECORD
from qgmem_train.reranker.data import ensure_turns_store
from qgmem_train.retrieval.activation import activate
from qgmem_train.retrieval.rerank import CrossEncoderReranker

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
K = 10
KEYS = (f"recall@{K}", f"precision@{K}", f"sufficiency@{K}", f"ndcg@{K}")
RANKINGS = ("fused", "reranked, replace", "reranked, rrf")
TARGETS = {"ndcg@10": 0.60, "recall@10 gain over fused": 0.07, "latency p50 ms (100 candidates)": 300}


class ScoreOnce:
    """Wraps a reranker: scores each (question, documents) once, timing every real call; repeats are served from memory."""

    name = "cross"

    def __init__(self, reranker: CrossEncoderReranker):
        self.reranker = reranker
        self.model_id = reranker.model_id
        self.calls: list[tuple[int, float]] = []
        self._scores: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """The wrapped reranker's scores, computed on the first request only."""
        key = (query, tuple(documents))
        if key not in self._scores:
            start = time.perf_counter()
            self._scores[key] = self.reranker.score(query, documents)
            self.calls.append((len(documents), time.perf_counter() - start))
        return self._scores[key]


def evaluate(input_path: Path, store: Path, model: Path, conversations: list[str], batch_size: int) -> tuple[list[dict], ScoreOnce]:
    """Per-question metrics of the three rankings (and the pool's recall@100) over ``conversations``."""
    cfg = PipelineConfig()
    cfg.models.device = "cpu"
    replace, rrf = PipelineConfig().retrieval, PipelineConfig().retrieval
    rrf.rerank_mode = "rrf"
    embedder = build_embedder(cfg)
    reranker = ScoreOnce(CrossEncoderReranker(str(model), batch_size=batch_size, device="cpu"))
    records = []
    with MemoryStore.open(store) as memory_store:
        for batch in locomo_question_batches(input_path, memory_store, embedder, cfg.retrieval, conversations):
            sources = {u.id: u.source_turn_ids for u in batch.memory.units}
            for q, intent, vectors in batch.items():
                run = lambda settings, ranker: activate(q.question, batch.question_time, batch.memory, cfg=settings, llm=None,  # noqa: E731
                                                        embedder=embedder, reranker=ranker, index=batch.index, intent=intent,
                                                        query_vectors=vectors)
                orders = {"fused": run(replace, None).reranked, "reranked, replace": run(replace, reranker).reranked,
                          "reranked, rrf": run(rrf, reranker).reranked}
                gold = set(q.evidence)
                n_relevant = sum(1 for s in sources.values() if gold.intersection(s))
                record = {"conversation": batch.conversation_id, "qa_index": q.index, "category": q.category,
                          "pool_recall@100": recall_at_k([sources[u] for u in orders["fused"]], gold, 100)}
                for name, order in orders.items():
                    for key, value in question_metrics([sources[u] for u in order], gold, K, n_relevant).items():
                        record[f"{name}/{key}"] = value
                records.append(record)
    return records, reranker


def summarise(records: list[dict], reranker: ScoreOnce) -> dict:
    """Means overall and per category, and the latency of scoring full pools."""
    keys = [f"{name}/{key}" for name in RANKINGS for key in KEYS] + ["pool_recall@100"]
    means = aggregate(records, keys)
    full = [seconds * 1000 for size, seconds in reranker.calls if size == 100]
    latency = {"pools_of_100": len(full), "p50_ms": round(float(np.percentile(full, 50)), 1) if full else None,
               "p95_ms": round(float(np.percentile(full, 95)), 1) if full else None}
    categories = sorted({r["category"] for r in records})
    table = {name: {key: round(means[f"{name}/{key}"], 4) for key in KEYS} for name in RANKINGS}
    per_category = {f"cat{c} {LOCOMO_CATEGORY_NAMES.get(c, '')}".strip(): {
        "n_questions": means[f"n_questions/cat{c}"],
        **{name: {key: round(means[f"{name}/{key}/cat{c}"], 4) for key in KEYS} for name in RANKINGS}} for c in categories}
    return {"n_questions": len(records), "pool_recall@100": round(means["pool_recall@100"], 4), "rankings": table,
            "per_category": per_category, "latency": latency}


def markdown(report: dict) -> str:
    """The side-by-side table, per category, latency and training figures."""
    s, training, m = report["summary"], report["training"], report["machine"]
    lines = [f"# Trained cross-encoder reranker on held-out LoCoMo conversations ({', '.join(report['conversations'])})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m.get('torch_threads')}, load average at start "
             f"{m.get('load_average_1m')}. Turns-mode store, rule-based intents, fused pool of 100 (RRF of BM25, dense, "
             f"attributes). Model `{report['model']}`: trained on {', '.join(training.get('train_conversations', []))} "
             f"({training.get('train_questions')} questions), {training.get('steps')} steps in {training.get('seconds')} s.", "",
             f"## All {s['n_questions']} questions (pool recall@100: {s['pool_recall@100']:.3f})", "",
             "| ranking | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{row[k]:.3f}" for k in KEYS) + " |" for name, row in s["rankings"].items()]
    lines += ["", "## Per category", "", "| category | n | ranking | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 3) + "|"]
    for category, part in s["per_category"].items():
        for name in RANKINGS:
            lines.append(f"| {category} | {part['n_questions']} | {name} | " + " | ".join(f"{part[name][k]:.3f}" for k in KEYS) + " |")
    lat = s["latency"]
    lines += ["", f"Latency of scoring a pool of 100 candidates ({lat['pools_of_100']} pools): p50 {lat['p50_ms']} ms, "
              f"p95 {lat['p95_ms']} ms.", "", "Targets: " + "; ".join(f"{k} {v}" for k, v in report["targets"].items()) + ". Met: "
              + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in report["met"].items()) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Evaluate, print and write bench/results/reranker.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "reranker-cpu" / "model", help="trained CrossEncoder folder")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="LoCoMo file (default: ../shared/data/locomo/locomo_dev.json)")
    parser.add_argument("--store", type=Path, default=ROOT / "out" / "reranker" / "locomo_turns", help="turns-mode store (built when missing)")
    parser.add_argument("--conversation", nargs="+", help="conversations to evaluate (default: the model's validation conversations)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per forward pass of the cross-encoder")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="results folder")
    args = parser.parse_args()
    record_path = args.model / TRAINING_RECORD
    if not record_path.exists():
        raise SystemExit(f"{record_path} not found: train the reranker first (make reranker)")
    training = json.loads(record_path.read_text())
    conversations = args.conversation or training["val_conversations"]
    leaked = sorted(set(conversations) & set(training["train_conversations"]))
    if leaked:
        raise SystemExit(f"{', '.join(leaked)}: the model trained on these; evaluate on conversations it never saw")
    info = machine_info()
    ensure_turns_store(args.input, args.store)
    started = time.perf_counter()
    records, reranker = evaluate(args.input, args.store, args.model, conversations, args.batch_size)
    summary = summarise(records, reranker)
    fused, replaced, fused_rrf = (summary["rankings"][name] for name in RANKINGS)
    best = max((replaced, fused_rrf), key=lambda row: row["ndcg@10"])
    report = {
        "machine": info, "model": str(args.model), "input": str(args.input), "store": str(args.store), "conversations": conversations,
        "training": {k: training.get(k) for k in ("train_conversations", "val_conversations", "train_questions", "steps", "seconds",
                                                   "validation_before", "validation_after", "hyperparameters")},
        "batch_size": args.batch_size, "summary": summary, "targets": TARGETS,
        "met": {"ndcg@10": best["ndcg@10"] >= TARGETS["ndcg@10"],
                "recall@10 gain over fused": best["recall@10"] - fused["recall@10"] >= TARGETS["recall@10 gain over fused"],
                "latency p50 ms (100 candidates)": (summary["latency"]["p50_ms"] or float("inf")) < TARGETS["latency p50 ms (100 candidates)"]},
        "seconds": round(time.perf_counter() - started, 1),
    }
    text = markdown(report)
    write_report_atomic(args.out / "reranker.json", report, text)
    print(text)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    main()
