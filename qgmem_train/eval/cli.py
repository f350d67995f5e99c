"""``python -m qgmem_train eval TASK``: evaluation over a built memory store (the entry of :mod:`qgmem_train.eval`).

Every task writes its report into ``--out`` (``metrics.json`` with flat keys plus the models and settings
used, a per-question JSONL, figures), each file atomically:

- ``retrieval`` (:mod:`~qgmem_train.eval.retrieval_task`): evidence retrieval of the working-memory
  activation on LoCoMo, per channel, RRF pool and reranked working memory.
- ``answers`` (:mod:`~qgmem_train.eval.answer_tasks`): answer quality on LoCoMo, BEAM, LongMemEval-S or
  FactConsolidation, judged R times with the benchmark's judge prompts, plus token F1, BLEU-1, exact match.
- ``ablations`` (:mod:`~qgmem_train.eval.answer_tasks`): the same questions under pipeline variants (no
  reranker, no attribute channel, no traces, no graph token, turn units), one table side by side.
- ``conversations``: a benchmark's dialogue histories as plain JSONL, for ``build --dataset jsonl``
  (LongMemEval-S and FactConsolidation have no build loader of their own).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qgmem_train.benchmarks.loaders import BENCHMARKS, load_benchmark, plain_conversation
from qgmem_train.eval.answer_tasks import run_ablations, run_answers
from qgmem_train.errors import InputError
from qgmem_train.eval.retrieval_task import run_retrieval
from qgmem_train.fileio import atomic_output
from qgmem_train.memory.store_uri import store_location


def _parse_channels(text: str) -> list[str]:
    from qgmem_train.retrieval.activation import check_channels

    return check_channels([c.strip() for c in text.split(",") if c.strip()])


def add_retrieval_parser(tasks: argparse._SubParsersAction) -> None:
    """Options of ``eval retrieval``."""
    parser = tasks.add_parser("retrieval", help="evidence retrieval metrics of working-memory activation")
    parser.add_argument("--dataset", required=True, choices=["locomo"], help="benchmark whose questions and gold evidence to use")
    parser.add_argument("--input", required=True, type=Path, help="the benchmark file (e.g. locomo10.json)")
    parser.add_argument("--store", required=True, type=store_location, help="memory store (folder or postgresql:// URI) built from the same conversations (those it lacks are skipped)")
    parser.add_argument("--out", required=True, type=Path, help="folder for metrics.json, questions.jsonl and recall_at_k.png")
    parser.add_argument("--config", type=Path, help="YAML with a pipeline: section (models, retrieval settings)")
    parser.add_argument("--channels", type=_parse_channels, help="comma-separated subset of bm25,dense,attr (default: retrieval.channels)")
    parser.add_argument("--reranker", choices=["llm", "cross", "none"], help="reranker (default: models.reranker)")
    parser.add_argument("--intent", choices=["llm", "rules"], default="llm", help="query-intent parser: the paper's prompt, or rules without an LLM")
    parser.add_argument("--limit", type=int, help="evaluate this many questions, evenly spaced over the eligible ones")
    parser.add_argument("--conversation", nargs="+", help="only these conversation ids (each must be in the store)")
    parser.add_argument("-k", type=int, help="working-memory budget for the metrics (default: retrieval.k)")
    parser.set_defaults(run=run_retrieval)


def _add_answer_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``eval answers`` and ``eval ablations``."""
    parser.add_argument("--benchmark", required=True, choices=BENCHMARKS, help="benchmark format of --input")
    parser.add_argument("--input", required=True, type=Path, help="benchmark file (BEAM: a chat folder or a folder of chats)")
    parser.add_argument("--store", required=True, type=store_location, help="memory store (folder or postgresql:// URI) built from the same conversations")
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
    parser.add_argument("--turns-store", type=store_location, help="store (folder or postgresql:// URI) of the same input built with --units turns (for 'turn units')")
    parser.set_defaults(run=run_ablations)


def add_conversations_parser(tasks: argparse._SubParsersAction) -> None:
    """Options of ``eval conversations``."""
    parser = tasks.add_parser("conversations", help="write a benchmark's dialogue histories as plain JSONL (build --dataset jsonl)")
    parser.add_argument("--benchmark", required=True, choices=BENCHMARKS, help="benchmark format of --input")
    parser.add_argument("--input", required=True, type=Path, help="benchmark file (BEAM: a chat folder or a folder of chats)")
    parser.add_argument("--out", required=True, type=Path, help="JSONL file to write (one conversation per line)")
    parser.set_defaults(run=run_conversations)


def run_conversations(args: argparse.Namespace) -> int:
    """Write every conversation of the benchmark, one per line, atomically."""
    benchmark = load_benchmark(args.benchmark, args.input)
    with atomic_output(args.out) as handle:
        for conversation in benchmark.conversations:
            handle.write(json.dumps(plain_conversation(conversation), ensure_ascii=False) + "\n")
    print(f"wrote {len(benchmark.conversations)} conversation(s) and {len(benchmark.questions)} question(s) of {args.benchmark} to {args.out}")
    return 0


def main(argv: list[str]) -> int:
    """Entry of ``python -m qgmem_train eval``."""
    parser = argparse.ArgumentParser(prog="python -m qgmem_train eval", description=__doc__.split("\n\n")[0])
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    add_retrieval_parser(tasks)
    add_answers_parser(tasks)
    add_ablations_parser(tasks)
    add_conversations_parser(tasks)
    args = parser.parse_args(argv)
    check_out(args.out, folder=args.task != "conversations")
    return args.run(args)


def check_out(out: Path, *, folder: bool) -> None:
    """Refuse an ``--out`` of the wrong kind before any work: a report folder that is a file, or a JSONL file that is a folder."""
    if folder and out.exists() and not out.is_dir():
        raise InputError(str(out), "exists and is not a folder: --out names the report folder (metrics.json and the rest go inside)")
    if not folder and out.is_dir():
        raise InputError(str(out), "is a folder: --out names the JSONL file to write")
