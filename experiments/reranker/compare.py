"""Trained cross-encoders against the fused order, on LoCoMo conversations they never trained on, and their latency.

Every question (categories 1-4 with gold evidence) of the held-out conversations (those the first
model's ``training.json`` lists as validation, unless ``--conversation`` names others; no model may
have trained on them) is activated over the same turns-mode store: ``fused`` (the RRF order, no
reranker), then for each model ``<name>, replace`` (the cross-encoder's order of the fused pool),
``<name>, rrf`` (RRF of both orders) and ``<name>, blend`` (its standardized scores with the fused rank
as a prior, ``retrieval.rerank_prior``), side by side in one run. Each model scores each pool once and
every mode reuses the scores. Reported: recall/precision/sufficiency/nDCG@10 overall and per category,
each ranking's recall@10 gain over the fused order with a paired bootstrap 95% interval over questions,
the fused pool's recall@100 (the ceiling of any reordering), and each model's latency of scoring a
pool of 100 candidates (p50/p95, on the threads torch uses). ``--rerank-top`` scores only the pool's
first m units (``retrieval.rerank_top``; the rest keep the fused order) and ``--max-length`` cuts each
pair at inference (``models.reranker_max_length``): every combination is its own row, timed on the
questions whose fused pool holds 100 units.

    python -m experiments.reranker                        # checkpoints/reranker-cpu/model (make reranker)
    python -m experiments.reranker --model DIR [DIR ...] --conversation conv-30 conv-47
    python -m experiments.reranker --embedder checkpoints/embedder-cpu/model --store out/reranker/locomo_turns_tuned
    python -m experiments.reranker --quantization none int8 --runtime torch onnxruntime   # each model in both runtimes, fp32 and int8
    python -m experiments.reranker --runtime onnxruntime --quantization none int8 --rerank-top 30 50 all --max-length model 128
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qgmem_train.reports import add_report_options, machine_info, paired_bootstrap, remake_reports, write_report

from qgmem_train.benchmarks.loaders import LOCOMO_CATEGORY_NAMES
from qgmem_train.benchmarks.question_batches import locomo_question_batches
from qgmem_train.config import BUNDLED_EMBEDDER, ModelsConfig, PipelineConfig
from qgmem_train.llm.factory import build_embedder
from qgmem_train.memory.store import MemoryStore
from qgmem_train.metrics.retrieval import aggregate, ranking_metrics, recall_at_k
from qgmem_train.retrieval.cross_encoder import TRAINING_RECORD
from qgmem_train.reranker.data import ensure_turns_store
from qgmem_train.retrieval.activation import activate
from qgmem_train.retrieval.rerank import Reranker, build_reranker

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_INPUT = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
K = 10
KEYS = (f"recall@{K}", f"precision@{K}", f"sufficiency@{K}", f"ndcg@{K}")
MODES = ("replace", "rrf", "blend")
BOOTSTRAP_RESAMPLES = 10_000
TARGETS = {"ndcg@10": 0.60, "recall@10 gain over fused": 0.07, "latency p50 ms (100 candidates)": 300}


class ScoreOnce:
    """Wraps a reranker: scores each (question, documents) once, timing every real call; repeats are served from memory."""

    name = "cross"

    def __init__(self, reranker: Reranker):
        self.reranker = reranker
        self.model_id = reranker.model_id
        self.document_layout = reranker.document_layout
        self.pool_size = 0
        """Units in the fused pool of the question being scored (set by the caller): calls are timed per pool of that size."""
        self.calls: list[tuple[int, float]] = []
        self._scores: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """The wrapped reranker's scores, computed on the first request only."""
        key = (query, tuple(documents))
        if key not in self._scores:
            start = time.perf_counter()
            self._scores[key] = self.reranker.score(query, documents)
            self.calls.append((self.pool_size, time.perf_counter() - start))
        return self._scores[key]


def model_name(folder: Path) -> str:
    """A model's name in the tables: its folder's name, or the parent's for a folder called ``model``."""
    return folder.parent.name if folder.name == "model" else folder.name


def variant_name(name: str, runtime: str, quantization: str, max_length: int | None = None, top: int | None = None) -> str:
    """A model's name in the tables with how it runs: ``reranker-cpu``, ``reranker-cpu int8``, ``reranker-cpu onnxruntime int8 max 128 top 40``."""
    return " ".join([name] + ([runtime] if runtime != "torch" else []) + ([quantization] if quantization != "none" else [])
                    + ([f"max {max_length}"] if max_length else []) + ([f"top {top}"] if top else []))


def top_or_all(text: str) -> int | None:
    """``--rerank-top`` / ``--max-length`` value: a positive integer, or ``all`` / ``model`` (no limit)."""
    if text in ("all", "model"):
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, all or model, got {text!r}")
    return int(text)


def rankings(names: Sequence[str]) -> list[str]:
    """The compared orders: the fused one, then each model in each rerank mode."""
    return ["fused"] + [f"{name}, {mode}" for name in names for mode in MODES]


def evaluate(input_path: Path, store: Path, embedder_ref: str, models: dict[str, tuple[Path, str, str, int | None, int | None]],
             conversations: list[str], batch_size: int) -> tuple[list[dict], dict[str, ScoreOnce]]:
    """Per-question metrics of every ranking (and the pool's recall@100) over ``conversations`` of a store built with ``embedder_ref``.

    ``models`` maps a name to (CrossEncoder folder, quantization, runtime, max length, top m); variants that
    differ only in top m share one loaded reranker, each timed on its own calls.
    """
    cfg = PipelineConfig(models=ModelsConfig(embedder=embedder_ref, device="cpu"))
    settings = {(mode, top): PipelineConfig().retrieval for mode in MODES for *_, top in models.values()}
    for (mode, top), retrieval in settings.items():
        retrieval.rerank_mode, retrieval.rerank_top = mode, top
    embedder = build_embedder(cfg)
    loaded = {spec[:4]: cross_encoder(*spec[:3], batch_size, spec[3]) for spec in dict.fromkeys(spec[:4] for spec in models.values())}
    rerankers = {name: ScoreOnce(loaded[spec[:4]]) for name, spec in models.items()}
    records = []
    with MemoryStore.open(store) as memory_store:
        for batch in locomo_question_batches(input_path, memory_store, embedder, cfg.retrieval, conversations):
            sources = {u.id: u.source_turn_ids for u in batch.memory.units}
            for q, intent, vectors in batch.items():
                run = lambda settings, ranker: activate(q.question, batch.question_time, batch.memory, cfg=settings, llm=None,  # noqa: E731
                                                        embedder=embedder, reranker=ranker, index=batch.index, intent=intent,
                                                        query_vectors=vectors)
                orders = {"fused": run(settings[next(iter(settings))], None).reranked}
                for name, reranker in rerankers.items():
                    reranker.pool_size = len(orders["fused"])
                    orders.update({f"{name}, {mode}": run(settings[(mode, models[name][4])], reranker).reranked for mode in MODES})
                gold = set(q.evidence)
                records.append({"conversation": batch.conversation_id, "qa_index": q.index, "category": q.category,
                                "pool_recall@100": recall_at_k([sources[u] for u in orders["fused"]], gold, 100),
                                **ranking_metrics(orders, sources, gold, K)})
    return records, rerankers


def cross_encoder(folder: Path, quantization: str, runtime: str, batch_size: int, max_length: int | None = None) -> Reranker:
    """The pipeline's ``cross`` reranker of ``folder`` on the CPU, as ``models.reranker_quantization``, ``reranker_runtime`` and
    ``reranker_max_length`` say."""
    cfg = PipelineConfig(models=ModelsConfig(reranker="cross", reranker_model=str(folder), reranker_quantization=quantization,
                                             reranker_runtime=runtime, reranker_max_length=max_length, device="cpu"))
    cfg.retrieval.rerank_batch_size = batch_size
    return build_reranker(cfg)


def pool_latency(reranker: ScoreOnce) -> dict:
    """p50/p95 milliseconds of the reranker's calls on full pools of 100 candidates (all of them scored, or the first m)."""
    full = [seconds * 1000 for size, seconds in reranker.calls if size == 100]
    return {"pools_of_100": len(full), "p50_ms": round(float(np.percentile(full, 50)), 1) if full else None,
            "p95_ms": round(float(np.percentile(full, 95)), 1) if full else None}


def summarise(records: list[dict], rerankers: dict[str, ScoreOnce]) -> dict:
    """Means overall and per category, and each model's latency of scoring full pools."""
    names = rankings(list(rerankers))
    keys = [f"{name}/{key}" for name in names for key in KEYS] + ["pool_recall@100"]
    means = aggregate(records, keys)
    latency = {name: pool_latency(reranker) for name, reranker in rerankers.items()}
    categories = sorted({r["category"] for r in records})
    table = {name: {key: round(means[f"{name}/{key}"], 4) for key in KEYS} for name in names}
    per_category = {f"cat{c} {LOCOMO_CATEGORY_NAMES.get(c, '')}".strip(): {
        "n_questions": means[f"n_questions/cat{c}"], "pool_recall@100": round(means[f"pool_recall@100/cat{c}"], 4),
        **{name: {key: round(means[f"{name}/{key}/cat{c}"], 4) for key in KEYS} for name in names}} for c in categories}
    return {"n_questions": len(records), "pool_recall@100": round(means["pool_recall@100"], 4), "rankings": table,
            "recall_gain_over_fused": recall_gains(records, names[1:]), "gain_over_first_model": gains_over_first_model(records, list(rerankers)),
            "per_category": per_category, "latency": latency}


def recall_gains(records: list[dict], names: Sequence[str], reference: str = "fused", key: str = f"recall@{K}") -> dict[str, dict]:
    """Each ranking's ``key`` (recall@10) minus ``reference``'s (the fused order), per question, with a paired bootstrap 95% interval over questions."""
    def per_question(name: str) -> dict[str, float]:
        return {f"{r['conversation']}:{r['qa_index']}": r[f"{name}/{key}"] for r in records}

    base = per_question(reference)
    return {name: paired_bootstrap(per_question(name), base, resamples=BOOTSTRAP_RESAMPLES, seed=0) for name in names}


def gains_over_first_model(records: list[dict], models: Sequence[str]) -> dict[str, dict[str, dict]]:
    """Each later model's recall@10 and nDCG@10 minus the first model's in the same rerank mode, per question, with paired intervals.

    Two models scored on the same pools differ by less than either differs from the fused order; only the
    paired difference says whether that is more than the questions drawn.
    """
    first, *others = models
    return {f"{name}, {mode}": {key: recall_gains(records, [f"{name}, {mode}"], f"{first}, {mode}", key)[f"{name}, {mode}"]
                                for key in (f"recall@{K}", f"ndcg@{K}")}
            for name in others for mode in MODES}


def markdown(report: dict) -> str:
    """The side-by-side table, per category, each model's training and latency figures."""
    s, m = report["summary"], report["machine"]
    names = list(s["rankings"])
    lines = [f"# Trained cross-encoder rerankers on held-out LoCoMo conversations ({', '.join(report['conversations'])})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m.get('torch_threads')}, load average at start "
             f"{m.get('load_average_1m')}. Turns-mode store embedded with `{report['embedder']}`, rule-based intents, fused pool of 100 "
             f"(RRF of BM25, dense, attributes), every ranking side by side in one run.", "", "| model | folder | runtime | quantization | layers | max length | document | scored | negatives | trained on | steps | training s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, model in report["models"].items():
        training = model["training"]
        lines.append(f"| {name} | `{model['folder']}` | {model['runtime']} | {model['quantization']} | {model['layers']} | {model['max_length']} | {model['document_layout']} | "
                     f"{'top ' + str(model['rerank_top']) if model.get('rerank_top') else 'all'} | {training.get('negatives')} | "
                     f"{', '.join(training.get('train_conversations', []))} ({training.get('train_questions')} questions) | "
                     f"{training.get('steps')} | {training.get('seconds')} |")
    lines += ["", f"## All {s['n_questions']} questions (pool recall@100: {s['pool_recall@100']:.3f})", "",
              "| ranking | " + " | ".join(KEYS) + f" | recall@{K} gain over fused [95% interval over questions] |", "|---" * (len(KEYS) + 2) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{row[k]:.3f}" for k in KEYS) + f" | {gain_cell(s['recall_gain_over_fused'].get(name))} |"
              for name, row in s["rankings"].items()]
    first = next(iter(report["models"]))
    if s["gain_over_first_model"]:
        lines += ["", f"## Against {first}, in the same mode (paired over questions)", "",
                  f"| ranking | recall@{K} difference [95%] | ndcg@{K} difference [95%] |", "|---|---|---|"]
        lines += [f"| {name} | {gain_cell(gain[f'recall@{K}'])} | {gain_cell(gain[f'ndcg@{K}'])} |" for name, gain in s["gain_over_first_model"].items()]
    lines += ["", "## Per category", "", "Pool recall@100: the share of the category's gold in the fused pool of 100, all a reranker can reach.", "",
              "| category | n | pool recall@100 | ranking | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 4) + "|"]
    for category, part in s["per_category"].items():
        for name in names:
            lines.append(f"| {category} | {part['n_questions']} | {part['pool_recall@100']:.3f} | {name} | "
                         + " | ".join(f"{part[name][k]:.3f}" for k in KEYS) + " |")
    lines += ["", f"Latency of scoring a pool of 100 candidates ({report['batch_size']} pairs a forward pass):", ""]
    lines += [f"- {name}: p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms ({lat['pools_of_100']} pools)" for name, lat in s["latency"].items()]
    lines += ["", "Targets: " + "; ".join(f"{k} {v}" for k, v in report["targets"].items()) + ".", ""]
    for name, met in report["met"].items():
        lines.append(f"- {name} met: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in met.items()))
    return "\n".join(lines) + "\n"


def gain_cell(gain: dict | None) -> str:
    """``+0.049 [+0.021, +0.078]``: a mean gain and its bootstrap interval; empty for the fused order itself."""
    if gain is None:
        return ""
    low, high = gain["ci95"]
    return f"{gain['mean_difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


def targets_met(summary: dict, name: str) -> dict[str, bool]:
    """Which targets the model ``name`` meets, in its better rerank mode (by nDCG@10)."""
    fused = summary["rankings"]["fused"]
    best = max((summary["rankings"][f"{name}, {mode}"] for mode in MODES), key=lambda row: row["ndcg@10"])
    p50 = summary["latency"][name]["p50_ms"]
    return {"ndcg@10": best["ndcg@10"] >= TARGETS["ndcg@10"],
            "recall@10 gain over fused": best["recall@10"] - fused["recall@10"] >= TARGETS["recall@10 gain over fused"],
            "latency p50 ms (100 candidates)": (p50 or float("inf")) < TARGETS["latency p50 ms (100 candidates)"]}


def read_training(folder: Path) -> dict:
    """The ``training.json`` of a trained model folder; exits with one line when it is missing."""
    path = folder / TRAINING_RECORD
    if not path.exists():
        raise SystemExit(f"{path} not found: train the reranker first (make reranker)")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    """Evaluate, print and write experiments/reranker/results/<report>.{json,md} (or remake saved reports: --report-only)."""
    parser = argparse.ArgumentParser(prog="python -m experiments.reranker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, nargs="+", default=[ROOT / "checkpoints" / "reranker-cpu" / "model"],
                        help="trained CrossEncoder folders, compared side by side")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="LoCoMo file (default: ../shared/data/locomo/locomo_dev.json)")
    parser.add_argument("--embedder", default=BUNDLED_EMBEDDER, help="embedder of the store and the dense channel (default: the bundled MiniLM)")
    parser.add_argument("--store", type=Path, help="turns-mode store built with --embedder; the evaluated conversations are added when missing "
                                                   "(default for the bundled embedder: out/reranker/locomo_turns)")
    parser.add_argument("--conversation", nargs="+", help="conversations to evaluate (default: the first model's validation conversations)")
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per forward pass of the cross-encoder (the pipeline's default)")
    parser.add_argument("--quantization", nargs="+", choices=("none", "int8"), default=["none"],
                        help="precision of each model's linear layers (models.reranker_quantization); several are measured side by side (default: none)")
    parser.add_argument("--runtime", nargs="+", choices=("torch", "onnxruntime"), default=["torch"],
                        help="what runs each model (models.reranker_runtime); several are measured side by side (default: torch)")
    parser.add_argument("--rerank-top", nargs="+", type=top_or_all, default=[None], metavar="M",
                        help="units of the fused pool each model scores (retrieval.rerank_top), the rest in fused order; several are "
                             "measured side by side; all: the whole pool (default)")
    parser.add_argument("--max-length", nargs="+", type=top_or_all, default=[None], metavar="TOKENS",
                        help="tokens a pair is cut to at inference (models.reranker_max_length); model: the saved length (default)")
    add_report_options(parser, Path(__file__).parent / "results", "reranker")
    args = parser.parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown, args.check)
    models = {model_name(folder): folder for folder in args.model}
    if len(models) < len(args.model):
        raise SystemExit("two --model folders have the same name; name the folders apart")
    trainings = {name: read_training(folder) for name, folder in models.items()}
    conversations = args.conversation or next(iter(trainings.values()))["val_conversations"]
    for name, training in trainings.items():
        leaked = sorted(set(conversations) & set(training["train_conversations"]))
        if leaked:
            raise SystemExit(f"{name} trained on {', '.join(leaked)}: evaluate on conversations no model saw")
    if args.store is None:
        if args.embedder != BUNDLED_EMBEDDER:
            raise SystemExit("--embedder needs --store: a store is searched with the embedder it was built with")
        args.store = ROOT / "out" / "reranker" / "locomo_turns"
    info = machine_info()
    ensure_turns_store(args.input, args.store, embedder=args.embedder, conversations=conversations)
    started = time.perf_counter()
    variants = {variant_name(name, runtime, quantization, max_length, top): (folder, quantization, runtime, max_length, top)
                for runtime in args.runtime for quantization in args.quantization for max_length in args.max_length
                for top in args.rerank_top for name, folder in models.items()}
    records, rerankers = evaluate(args.input, args.store, args.embedder, variants, conversations, args.batch_size)
    summary = summarise(records, rerankers)
    report = {
        "machine": info, "input": str(args.input), "store": str(args.store), "embedder": args.embedder, "conversations": conversations,
        "models": {name: {"folder": str(folder), "runtime": runtime, "quantization": quantization, "rerank_top": top,
                          "layers": rerankers[name].reranker.cross_encoder.model.config.num_hidden_layers,
                          "max_length": rerankers[name].reranker.cross_encoder.max_seq_length,
                          "document_layout": rerankers[name].document_layout,
                          "training": {k: trainings[model_name(folder)].get(k) for k in (
                              "train_conversations", "val_conversations", "train_questions", "negatives", "steps", "seconds",
                              "validation_before", "validation_after", "hyperparameters")}}
                   for name, (folder, quantization, runtime, _, top) in variants.items()},
        "batch_size": args.batch_size, "summary": summary, "targets": TARGETS,
        "met": {name: targets_met(summary, name) for name in variants},
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_report(args.out / f"{args.report}.json", report, markdown)
    return 0
