"""Retrieval quality on LoCoMo in turns mode: every channel alone, the fusion, fusion + reranker, and a baseline.

The baseline is a plain RRF of BM25 (lowercased words, no stopwords or stemming) and the dense
channel over raw turns. The no-LLM rows use the rule-based intent parser for the attribute channel;
two ablation rows drop the attribute channel and the preceding turn in BM25 documents. The LLM
reranker (yes/no scoring with the configured LLM, SmolLM2 by default) is slow on CPU, so it runs on
an evenly spaced subset of questions (``--rerank-limit``), reported with its own baseline, once per
``retrieval.rerank_mode`` (the reranker's order, and its RRF with the fused order).

    python -m experiments.retrieval --store /tmp/locomo_turns   # builds the store when missing
    python -m experiments.retrieval --report-only experiments/retrieval/results/locomo_retrieval.json   # remake its markdown
Default input: ../shared/data/locomo/locomo_dev.json when present; pass --input for another copy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import numpy as np

from qgmem_train.reports import add_report_options, machine_info, remake_reports, write_report
from qgmem_train.__main__ import main as cli
from qgmem_train.benchmarks.loaders import load_locomo_questions, spread_subset
from qgmem_train.memory.store import MemoryStore
from qgmem_train.metrics.retrieval import question_metrics, relevance
from qgmem_train.reranker.data import ensure_turns_store
from qgmem_train.retrieval.fusion import reciprocal_rank_fusion
from qgmem_train.retrieval.lexical import BM25Index
from qgmem_train.retrieval.ranking import top_n, top_positive

DEFAULT_INPUT = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo" / "locomo_dev.json"
KEYS = ("recall@10", "precision@10", "sufficiency@10", "ndcg@10")
_WORD = re.compile(r"[a-z0-9]+")


def baseline(input_path: Path, store_path: Path, limit: int | None) -> dict[str, float]:
    """Plain RRF of plain-token BM25 and MiniLM over the turns, on the same questions."""
    from qgmem_train.config import PipelineConfig
    from qgmem_train.llm.factory import build_embedder

    embedder = build_embedder(PipelineConfig())
    questions = spread_subset(load_locomo_questions(input_path), limit)
    totals: dict[str, list[float]] = {k: [] for k in KEYS}
    with MemoryStore.open(store_path) as store:
        for cid in sorted({q.conversation_id for q in questions}):
            memory = store.load_namespace(cid)
            bm25 = BM25Index.from_tokens([_WORD.findall(u.fact_text.lower()) for u in memory.units])
            items = [q for q in questions if q.conversation_id == cid]
            vectors = embedder.encode([q.question for q in items])
            sources = [u.source_turn_ids for u in memory.units]
            for q, vector in zip(items, vectors):
                lists = {"bm25": top_positive(bm25.scores(_WORD.findall(q.question.lower())), 100)[0],
                         "dense": top_n(memory.fact_embeddings @ vector, 100)[0]}
                rows = reciprocal_rank_fusion(lists, kappa=60, n=100)[0]
                gold = set(q.evidence)
                n_relevant = sum(relevance(sources, gold))
                for key, value in question_metrics([sources[r] for r in rows], gold, 10, n_relevant).items():
                    totals[key].append(value)
    return {key: round(float(np.mean(values)), 4) for key, values in totals.items()} | {"n_questions": len(questions)}


def run_eval(input_path: Path, store: Path, out: Path, reranker: str, limit: int | None, retrieval: dict | None = None) -> dict:
    """``eval retrieval`` with rule-based intents and optional ``retrieval`` settings; returns its metrics.json."""
    args = ["eval", "retrieval", "--dataset", "locomo", "--input", str(input_path), "--store", str(store), "--out", str(out),
            "--reranker", reranker, "--intent", "rules"]
    if limit:
        args += ["--limit", str(limit)]
    if retrieval:
        out.mkdir(parents=True, exist_ok=True)
        config = out / "retrieval.yaml"
        config.write_text(json.dumps({"pipeline": {"retrieval": retrieval}}))
        args += ["--config", str(config)]
    if cli(args) != 0:
        raise SystemExit(f"eval retrieval failed for reranker {reranker}")
    return json.loads((out / "metrics.json").read_text())


def rows_of(metrics: dict) -> dict[str, dict[str, float]]:
    """One row per ranking of a metrics.json."""
    return {name: {key: round(metrics[f"{name}/{key}"], 4) for key in KEYS} for name in metrics["rankings"]}


def table(title: str, rows: dict[str, dict[str, float]]) -> list[str]:
    """A Markdown table of metric rows."""
    lines = [f"### {title}", "", "| ranking | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{row[k]:.3f}" for k in KEYS) + " |" for name, row in rows.items()]
    return lines + [""]


def markdown(report: dict) -> str:
    """The report's tables: every ranking on all questions, and on the LLM reranker's subset when it ran."""
    machine = report.get("machine", {})
    lines = [f"# LoCoMo retrieval, turns mode ({Path(report['input']).name}; embedder {report['models']['embedder']})", "",
             f"Machine: {machine.get('cpu', 'not recorded')}, {machine.get('cores', '?')} cores. Rule-based intent parser for the attribute channel. `fused` = RRF "
             "of the channels (the working memory without a reranker); `reranked` = fused pool reordered by the LLM reranker "
             "(`rerank_mode rrf`: RRF of that order with the fused order). Baseline: plain RRF of plain-token BM25 and MiniLM "
             "over raw turns, same questions.", ""]
    part = report["all_questions"]
    lines += table(f"All {part['n_questions']} questions (categories 1-4 with evidence)", {"baseline bm25+dense RRF": part["baseline_bm25_dense_rrf"], **part["rankings"]})
    if "rerank_subset" in report:
        part = report["rerank_subset"]
        lines += table(f"Subset of {part['n_questions']} evenly spaced questions, with the LLM reranker ({part['reranker_model']}, "
                       f"{part['seconds']} s)", {"baseline bm25+dense RRF": part["baseline_bm25_dense_rrf"], **part["rankings"]})
    return "\n".join(lines)


def locomo_parser(prog: str, description: str, work: str) -> argparse.ArgumentParser:
    """The options of both retrieval studies: the LoCoMo file and its turns-mode store, a work folder, the results folder
    and ``--report-only``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="LoCoMo file (default: ../shared/data/locomo/locomo_dev.json)")
    parser.add_argument("--store", type=Path, help="turns-mode store of the same conversations (built when missing; required to run)")
    parser.add_argument("--work", type=Path, default=Path(work), help="folder for the evaluations' own reports")
    add_report_options(parser, Path(__file__).parent / "results")
    return parser


def check_locomo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, in one line, a run without a store or with no LoCoMo file."""
    if args.store is None:
        parser.error("--store is required to run the evaluations")
    if not args.input.exists():
        raise SystemExit(f"{args.input} not found: pass --input with a copy of LoCoMo (locomo10.json schema)")


def main(argv: list[str] | None = None) -> int:
    """Build the turns-mode store if needed, run the evaluations, write experiments/retrieval/results/locomo_retrieval.{json,md}
    (or remake saved reports: --report-only)."""
    parser = locomo_parser("python -m experiments.retrieval", __doc__.split("\n\n")[0], "/tmp/locomo_retrieval")
    parser.add_argument("--rerank-limit", type=int, default=20, help="questions for the LLM-reranker rows (0 skips them)")
    args = parser.parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown, args.check)
    check_locomo(parser, args)
    ensure_turns_store(args.input, args.store)

    full = run_eval(args.input, args.store, args.work / "none", "none", None)
    ablations = {
        "fused without attr": run_eval(args.input, args.store, args.work / "no_attr", "none", None, {"channels": ["bm25", "dense"]}),
        "fused without preceding turn in BM25": run_eval(args.input, args.store, args.work / "no_context", "none", None, {"lexical_context_turns": 0}),
    }
    report = {
        "machine": machine_info(), "input": str(args.input), "store": str(args.store), "units": "turns", "intent_parser": "rules",
        "models": full["models"], "retrieval": full["settings"]["retrieval"], "commit": full["commit"],
        "all_questions": {"n_questions": full["n_questions"], "baseline_bm25_dense_rrf": baseline(args.input, args.store, None),
                          "rankings": rows_of(full) | {name: rows_of(m)["fused"] for name, m in ablations.items()}},
    }
    if args.rerank_limit:
        replaced = run_eval(args.input, args.store, args.work / "llm", "llm", args.rerank_limit)
        fused = run_eval(args.input, args.store, args.work / "llm_rrf", "llm", args.rerank_limit, {"rerank_mode": "rrf"})
        report["rerank_subset"] = {"n_questions": replaced["n_questions"], "reranker_model": replaced["models"]["reranker_model"],
                                   "baseline_bm25_dense_rrf": baseline(args.input, args.store, args.rerank_limit),
                                   "rankings": rows_of(replaced) | {"reranked, rerank_mode rrf": rows_of(fused)["reranked"]},
                                   "seconds": round(replaced["seconds"] + fused["seconds"], 1)}
    write_report(args.out / "locomo_retrieval.json", report, markdown)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
