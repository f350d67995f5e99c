"""``python -m qgmem_train eval TASK``: evaluation over a built memory store.

Tasks are sub-subcommands, each writing ``metrics.json`` (flat keys, plus the models and settings
used), a per-question JSONL and figures into ``--out``, every file atomically:

- ``retrieval``: evidence retrieval of the working-memory activation (Recall/Precision/Sufficiency/
  nDCG@k per question of LoCoMo categories 1-4 with gold evidence; every channel alone, the RRF pool
  and the reranked working memory; a Recall@k plot for k = 1..20).
- ``answers``: answer quality on LoCoMo, BEAM, LongMemEval-S or FactConsolidation: activate, answer
  (configured LLM on the text path, or an exported model), judge R times with the benchmark's judge
  prompts → judge_accuracy ± judge_std, per-type scores, per-question tokens and seconds, report.md and figures;
  beside the judge, token F1, BLEU-1 and exact match (``f1``, ``bleu1``, ``exact_match``, and per type as
  ``f1/<type>`` ...) per question and overall, a missing answer counting 0.
- ``conversations``: a benchmark's dialogue histories as plain JSONL, for ``build --dataset jsonl``
  (LongMemEval-S and FactConsolidation have no build loader of their own).
- ``ablations``: the same questions under pipeline variants (no reranker, no attribute channel, no
  traces, no graph token, turn units vs LLM units), one table side by side.
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

from tqdm import tqdm

from qgmem_train.errors import InputError
from qgmem_train.eval.benchmarks import group_by_conversation, last_session_time, load_locomo_questions
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
    questions = spread_subset(load_locomo_questions(args.input, args.conversation), args.limit)
    if not questions:
        raise InputError(str(args.input), "no questions of categories 1-4 with gold evidence")
    question_time = {cid: last_session_time(c) for cid, c in conversations.items()}

    by_conversation = group_by_conversation(questions)

    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    curves: dict[str, list[list[float]]] = {}
    stats = ParseStats()
    with MemoryStore.open(args.store) as store:
        store.require_namespaces(by_conversation)
        needs_llm = args.intent == "llm" or (reranker_kind == "llm" and not cfg.models.reranker_model)
        llm = build_llm(cfg) if needs_llm else None
        embedder = build_embedder(cfg)
        reranker = build_reranker(cfg, reranker_kind, llm=llm if reranker_kind == "llm" and not cfg.models.reranker_model else None)
        progress = tqdm(total=len(questions), desc="eval retrieval", unit="q")
        for cid, items in by_conversation.items():
            memory = store.load_namespace(cid, embedder_id=embedder.model_id)
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


def _add_answer_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``eval answers`` and ``eval ablations``."""
    from qgmem_train.eval.benchmarks import BENCHMARKS

    parser.add_argument("--benchmark", required=True, choices=BENCHMARKS, help="benchmark format of --input")
    parser.add_argument("--input", required=True, type=Path, help="benchmark file (BEAM: a chat folder or a folder of chats)")
    parser.add_argument("--store", required=True, type=Path, help="memory store built from the same conversations")
    parser.add_argument("--out", required=True, type=Path, help="report folder")
    parser.add_argument("--config", type=Path, help="YAML with a pipeline: section (models, retrieval, generation)")
    parser.add_argument("--judge-config", type=Path, help="YAML whose pipeline.models pick the judge LLM (default: the pipeline LLM)")
    parser.add_argument("--repeats", type=int, default=1, help="judge each answer R times (paper: 10); reports mean ± std over repeats")
    parser.add_argument("--limit", type=int, help="evaluate this many questions, evenly spaced over all")
    parser.add_argument("--intent", choices=["llm", "rules"], default="llm", help="query-intent parser: the paper's prompt, or rules without an LLM")


def add_answers_parser(tasks: argparse._SubParsersAction) -> None:
    """Options of ``eval answers``."""
    parser = tasks.add_parser("answers", help="LLM-judged answer quality with the paper's judge prompts")
    _add_answer_options(parser)
    parser.add_argument("--reranker", choices=["llm", "cross", "none"], help="reranker (default: models.reranker)")
    parser.add_argument("--model", type=Path, help="exported model folder: answer on its graph-token path (default: configured LLM, text path)")
    parser.set_defaults(run=run_answers)


def add_ablations_parser(tasks: argparse._SubParsersAction) -> None:
    """Options of ``eval ablations``."""
    parser = tasks.add_parser("ablations", help="answer quality of pipeline variants over the same questions, side by side")
    _add_answer_options(parser)
    parser.add_argument("--reranker", choices=["llm", "cross"], help="reranker of the full pipeline (default: models.reranker)")
    parser.add_argument("--model", type=Path, help="exported model: the full pipeline answers with it, 'no graph token' with the text path")
    parser.add_argument("--turns-store", type=Path, help="store of the same input built with --units turns (for 'turn units')")
    parser.set_defaults(run=run_ablations)


def _answer_setup(args: argparse.Namespace) -> tuple[Any, Any, list[Any]]:
    """Config, benchmark and the selected questions of an answers/ablations run; checks the options first."""
    from qgmem_train.config import load_pipeline_config
    from qgmem_train.eval.benchmarks import load_benchmark

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
    from qgmem_train.eval.answers import answer_model_path, answer_text_path, judge_answers, score_summary
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
        "benchmark": args.benchmark, "input": str(args.input), "store": str(args.store),
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
    from qgmem_train.eval.answers import AnswerVariant, question_record
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


def add_conversations_parser(tasks: argparse._SubParsersAction) -> None:
    """Options of ``eval conversations``."""
    from qgmem_train.eval.benchmarks import BENCHMARKS

    parser = tasks.add_parser("conversations", help="write a benchmark's dialogue histories as plain JSONL (build --dataset jsonl)")
    parser.add_argument("--benchmark", required=True, choices=BENCHMARKS, help="benchmark format of --input")
    parser.add_argument("--input", required=True, type=Path, help="benchmark file (BEAM: a chat folder or a folder of chats)")
    parser.add_argument("--out", required=True, type=Path, help="JSONL file to write (one conversation per line)")
    parser.set_defaults(run=run_conversations)


def run_conversations(args: argparse.Namespace) -> int:
    """Write every conversation of the benchmark, one per line, atomically."""
    from qgmem_train.eval.benchmarks import load_benchmark, plain_conversation

    benchmark = load_benchmark(args.benchmark, args.input)
    with atomic_output(args.out) as handle:
        for conversation in benchmark.conversations:
            handle.write(json.dumps(plain_conversation(conversation), ensure_ascii=False) + "\n")
    print(f"wrote {len(benchmark.conversations)} conversation(s) and {len(benchmark.questions)} question(s) of {args.benchmark} to {args.out}")
    return 0


def ablation_variants(args: argparse.Namespace, cfg: Any) -> list[tuple[Any, str, str | None]]:
    """(variant, description, what is missing or None) for the full pipeline and each ablation."""
    from qgmem_train.eval.answers import AnswerVariant

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
    if args.turns_store is not None and not args.turns_store.exists():
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
    add_answers_parser(tasks)
    add_ablations_parser(tasks)
    add_conversations_parser(tasks)
    args = parser.parse_args(argv)
    return args.run(args)
