"""``eval answers`` and ``eval ablations``: answer, judge and report a benchmark, once or under pipeline variants.

``answers`` writes metrics.json (judge accuracy ± std over repeats, token F1, BLEU-1, exact match, per type,
tokens and seconds per question), questions.jsonl, report.md and figures; ``ablations`` answers the same
questions without the reranker, the attribute channel, the traces, the graph token, or with turn units,
and writes one table side by side.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from qgmem_train.benchmarks.loaders import spread_subset
from qgmem_train.errors import InputError
from qgmem_train.eval.provenance import git_commit
from qgmem_train.fileio import atomic_output
from qgmem_train.memory.store_uri import is_store_uri, shown_store


def _answer_setup(args: argparse.Namespace) -> tuple[Any, Any, list[Any]]:
    """Config, benchmark and the selected questions of an answers/ablations run; checks the options first."""
    from qgmem_train.benchmarks.loaders import load_benchmark
    from qgmem_train.config import load_pipeline_config

    if args.limit is not None and args.limit < 1:
        raise InputError("--limit", "must be at least 1")
    if args.repeats < 1:
        raise InputError("--repeats", "must be at least 1")
    if args.model is not None and not args.model.is_dir():
        raise InputError(f"--model {args.model}", "no such export folder")
    cfg = load_pipeline_config(args.config)
    benchmark = load_benchmark(args.benchmark, args.input)
    questions = spread_subset(benchmark.questions, args.limit)
    if not questions:
        raise InputError(str(args.input), "no questions")
    return cfg, benchmark, questions


def _evaluate_variant(args: argparse.Namespace, cfg: Any, questions: list[Any], variant: Any, stats: Any) -> tuple[dict[str, Any], list[Any]]:
    """Answer and judge ``questions`` under ``variant``: its summary metrics and answered questions."""
    from qgmem_train.config import load_pipeline_config
    from qgmem_train.eval.answer_quality import answer_model_path, answer_text_path, judge_answers, score_summary
    from qgmem_train.llm.factory import build_llm

    store = variant.store or args.store
    if variant.model is not None:
        answered = answer_model_path(questions, store, variant, intent_mode=args.intent)
    else:
        answered = answer_text_path(questions, store, cfg, variant, intent_mode=args.intent, llm=build_llm(cfg), stats=stats)
    judge_llm = build_llm(load_pipeline_config(args.judge_config) if args.judge_config else cfg)
    judge_answers(args.benchmark, judge_llm, answered, repeats=args.repeats, stats=stats)
    return score_summary(args.benchmark, answered), answered


def _run_metadata(args: argparse.Namespace, cfg: Any, stats: Any, started: float) -> dict[str, Any]:
    from qgmem_train.config import load_pipeline_config
    from qgmem_train.llm.prompts import PROMPTS_VERSION

    judge_models = load_pipeline_config(args.judge_config).models if args.judge_config else cfg.models
    return {
        "benchmark": args.benchmark, "input": str(args.input), "store": shown_store(args.store),
        "models": {"llm": cfg.models.llm, "embedder": cfg.models.embedder, "reranker": args.reranker or cfg.models.reranker,
                   "reranker_model": cfg.models.reranker_model, "judge_llm": judge_models.llm,
                   "answer_model": str(args.model) if args.model else None},
        "settings": {"repeats": args.repeats, "limit": args.limit, "intent_parser": args.intent,
                     "max_new_tokens": cfg.generation.max_new_tokens, "k": cfg.retrieval.k,
                     "channels": ",".join(cfg.retrieval.channels), "retrieval": asdict(cfg.retrieval)},
        "parse_stats": stats.as_dict(), "prompts_version": PROMPTS_VERSION, "commit": git_commit(),
        "seconds": round(time.perf_counter() - started, 2),
    }  # fmt: skip


def run_answers(args: argparse.Namespace) -> int:
    """Answer, judge and report one benchmark: metrics.json, questions.jsonl, report.md and PNG figures."""
    from qgmem_train.eval.answer_quality import AnswerVariant, question_record
    from qgmem_train.eval.report import answers_markdown, write_answer_figures
    from qgmem_train.fileio import write_json_atomic
    from qgmem_train.llm.structured import ParseStats

    started = time.perf_counter()
    cfg, _, questions = _answer_setup(args)
    stats = ParseStats()
    variant = AnswerVariant(reranker=args.reranker, model=args.model)
    summary, answered = _evaluate_variant(args, cfg, questions, variant, stats)
    metrics = {"task": "answers", **summary, **_run_metadata(args, cfg, stats, started)}
    records = [question_record(a) for a in answered]
    out: Path = args.out
    write_answer_figures(out, metrics, records)
    with atomic_output(out / "questions.jsonl") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    with atomic_output(out / "report.md") as handle:
        handle.write(answers_markdown(metrics))
    write_json_atomic(out / "metrics.json", metrics)
    shown = ("n_questions", "judge_accuracy", "judge_std", "f1", "bleu1", "exact_match", "mean_context_tokens", "mean_online_tokens", "mean_seconds")
    print(json.dumps({k: metrics[k] for k in shown}, indent=2))
    print(f"wrote {out / 'metrics.json'}, {out / 'questions.jsonl'}, {out / 'report.md'} and figures")
    return 0


def ablation_variants(args: argparse.Namespace, cfg: Any) -> list[tuple[Any, str, str | None]]:
    """(variant, description, what is missing or None) for the full pipeline and each ablation."""
    from qgmem_train.eval.answer_quality import AnswerVariant

    full_reranker = args.reranker or (cfg.models.reranker if cfg.models.reranker != "none" else "llm")
    attr_off = [c for c in cfg.retrieval.channels if c != "attr"]
    no_model = "needs --model (an exported graph-token model)"
    return [
        (AnswerVariant("full", reranker=full_reranker, model=args.model), "the configured pipeline", None),
        (AnswerVariant("no_reranker", reranker="none", model=None), "RRF pool without reranking (text path)", None),
        (AnswerVariant("no_attribute_channel", reranker=full_reranker, channels=attr_off), "BM25 + dense only (text path)",
         None if attr_off != cfg.retrieval.channels else "the attribute channel is not configured"),
        (AnswerVariant("no_traces", reranker=full_reranker, traces=False), "units serialized as plain facts, no trajectories (text path)", None),
        (AnswerVariant("no_graph_token", reranker=full_reranker), "text path instead of the exported model", None if args.model else no_model),
        (AnswerVariant("turn_units", reranker=full_reranker, store=args.turns_store), "every turn a unit instead of LLM units (text path)",
         None if args.turns_store else "needs --turns-store (the same input built with --units turns)"),
    ]  # fmt: skip


def run_ablations(args: argparse.Namespace) -> int:
    """Every ablation variant over the same questions; ablations.md (side by side), ablations.json and a bar chart."""
    from qgmem_train.eval.plots import accuracy_bars_figure, close
    from qgmem_train.eval.report import ablations_markdown
    from qgmem_train.fileio import write_json_atomic
    from qgmem_train.llm.structured import ParseStats

    started = time.perf_counter()
    cfg, _, questions = _answer_setup(args)
    if args.turns_store is not None and not is_store_uri(args.turns_store) and not args.turns_store.exists():
        raise InputError(str(args.turns_store), "no memory store here (build it with --units turns)")
    stats = ParseStats()
    rows = []
    for variant, description, missing in ablation_variants(args, cfg):
        if missing:
            rows.append({"variant": variant.name, "description": description, "judge_accuracy": None, "skipped": missing})
            continue
        summary, _ = _evaluate_variant(args, cfg, questions, variant, stats)
        rows.append({"variant": variant.name, "description": description, **summary})
    out: Path = args.out
    scored = {r["variant"]: r["judge_accuracy"] for r in rows if r["judge_accuracy"] is not None}
    figure = accuracy_bars_figure(scored, title=f"Ablations on {args.benchmark} ({len(questions)} questions)")
    with atomic_output(out / "ablations.png", "wb") as handle:
        figure.savefig(handle, format="png")
    close(figure)
    with atomic_output(out / "ablations.md") as handle:
        handle.write(ablations_markdown(args.benchmark, rows))
    write_json_atomic(out / "ablations.json", {"task": "ablations", "variants": rows, **_run_metadata(args, cfg, stats, started)})
    print(ablations_markdown(args.benchmark, rows))
    print(f"wrote {out / 'ablations.md'}, {out / 'ablations.json'}, {out / 'ablations.png'}")
    return 0
