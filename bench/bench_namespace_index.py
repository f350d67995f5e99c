"""The next search after a change: after another namespace's delete, and after an add to the namespace searched.

Run ``python -m bench.bench_namespace_index --help``. Results go to bench/results/namespace_index.{json,md}.

A turns-mode store of LoCoMo conversations (``--input``, built once under ``--work``) is copied for every run; a
text-path predictor (rule intents, no reranker, MiniLM, SmolLM2's tokenizer counting context tokens) searches the
first conversation's namespace. Each round makes a small scratch namespace and times a search (its index warm), deletes
the scratch namespace and times the next search, then adds a two-turn session to the namespace searched and times the
next search. Each run is a fresh process on one torch thread; with ``--baseline DIR`` (a checkout of other code, e.g.
``git archive`` of an earlier commit) runs alternate between that code's ``qgmem_train`` and this one's, and the table
gives each code's p50 and p95 over every round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT / "samples" / "locomo_sample.json"
QUESTION = "When did Caroline go to the LGBTQ support group?"
MOMENTS = ("warm", "after_delete", "add", "after_add")
"""What each round times: a search with the index warm, the next after another namespace's delete, the add of a
session (which, where the code grows the index held, includes that), the next search after it."""


READING = (
    "After another namespace's delete both codes search the index they hold (its key is the namespace's own incarnation "
    "and write count). After an add this code grows the index it holds inside the add (the add's time includes it: the new "
    "segment read, the BM25 scores made again over the grown corpus, the new units' rows appended), so the next search "
    "finds it ready; a6d58fe loads the namespace and builds its index whole at the next search."
)


def child(store: Path, namespace: str, rounds: int) -> dict[str, Any]:
    """Seconds of each moment's search over ``rounds`` rounds, with the ``qgmem_train`` this process imports."""
    import torch

    from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM, PipelineConfig
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.llm.local import TransformersLLM
    from qgmem_train.predictor import QGMemPredictor

    torch.set_num_threads(1)
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.device = "none", "cpu"
    cfg.construction.units, cfg.construction.traces = "turns", False
    predictor = QGMemPredictor(None, cfg, llm=TransformersLLM(BUNDLED_LLM), embedder=Embedder(BUNDLED_EMBEDDER, device="cpu"), reranker=None,
                               intent="rules")  # fmt: skip
    seconds: dict[str, list[float]] = {moment: [] for moment in MOMENTS}

    def timed_search(memory: Any) -> float:
        started = time.perf_counter()
        memory.search(QUESTION)
        return time.perf_counter() - started

    with predictor.memory(namespace, store) as memory:
        cold = timed_search(memory)
        for number in range(rounds):
            with predictor.memory(f"scratch-{number}", store) as scratch:
                scratch.add_session([{"speaker": "Sam", "text": f"Scratch note {number}."}], session_id=f"S{number}")
                seconds["warm"].append(timed_search(memory))
                scratch.store.delete_namespace(scratch.namespace)
            seconds["after_delete"].append(timed_search(memory))
            turns = [{"speaker": "Caroline", "text": f"I went to the support group again, visit {number}."},
                     {"speaker": "Melanie", "text": "That sounds good for you."}]  # fmt: skip
            started = time.perf_counter()
            memory.add_session(turns, time="2023-09-01", session_id=f"bench-{number}")
            seconds["add"].append(time.perf_counter() - started)
            seconds["after_add"].append(timed_search(memory))
    return {"cold": cold, **seconds}


def run_child(code: Path, template: Path, namespace: str, rounds: int, work: Path) -> dict[str, Any]:
    """:func:`child` in a fresh process over a fresh copy of the store, with ``qgmem_train`` from ``code``."""
    from qgmem_train.reports import child_json

    store = Path(tempfile.mkdtemp(prefix="run-", dir=work)).resolve() / "store"
    shutil.copytree(template, store)
    found = child_json(__file__, code, ["--child", str(store), "--namespace", namespace, "--rounds", str(rounds)], work)
    shutil.rmtree(store.parent, ignore_errors=True)
    return found


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank), in milliseconds."""
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """p50 and p95 milliseconds of each moment over every round of ``runs``, and the median cold search."""
    out: dict[str, Any] = {"runs": len(runs), "rounds": sum(len(r["warm"]) for r in runs),
                           "cold_ms": round(1000 * statistics.median(r["cold"] for r in runs), 2)}  # fmt: skip
    for moment in MOMENTS:
        values = [v for r in runs for v in r.get(moment, [])]
        if not values:
            continue
        out[f"{moment}_p50_ms"], out[f"{moment}_p95_ms"] = percentile(values, 0.5), percentile(values, 0.95)
    return out


def markdown(report: dict[str, Any]) -> str:
    """The report's table: each code's p50 / p95 of the next search at each moment."""
    from qgmem_train.reports import machine_text

    lines = [
        "# The next search after a change: another namespace's delete, an add",
        "",
        f"{report['units']} units in the namespace searched ({report['namespace']}, turns mode), one torch thread, {report['rounds']} rounds a run, "
        f"runs alternating between the codes. Machine: {machine_text(report['machine'])}; load average at the end {report['load_average_end']}.",
        "",
        "| code | runs | rounds | cold search ms | warm p50 / p95 ms | after another's delete p50 / p95 ms | the add p50 / p95 ms | after an add p50 / p95 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, row in report["codes"].items():
        lines.append(
            f"| {label} | {row['runs']} | {row['rounds']} | {row['cold_ms']} | {row['warm_p50_ms']} / {row['warm_p95_ms']} | "
            f"{row['after_delete_p50_ms']} / {row['after_delete_p95_ms']} | {row.get('add_p50_ms', '-')} / {row.get('add_p95_ms', '-')} | "
            f"{row['after_add_p50_ms']} / {row['after_add_p95_ms']} |"
        )
    lines += ["", report["reading"], ""]
    return "\n".join(lines)


def build_template(input_path: Path, conversations: list[str], work: Path) -> Path:
    """The turns-mode store of ``conversations`` (built once under ``work``, reused by later runs)."""
    from qgmem_train.config import PipelineConfig
    from qgmem_train.memory.loaders import load_conversations
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.pipeline import PipelineModels
    from qgmem_train.pipeline.construction import build_conversations

    template = work / "template"
    cfg = PipelineConfig()
    cfg.models.device, cfg.construction.units, cfg.construction.traces = "cpu", "turns", False
    with MemoryStore.open(template, create=True) as store:
        build_conversations(store, load_conversations("locomo", input_path, conversations), PipelineModels(cfg, intent="rules"))
    return template


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the children (alternating codes), write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench.bench_namespace_index", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="LoCoMo file")
    parser.add_argument("--conversations", nargs="+", default=["conv-26"], help="conversations stored; the first is searched")
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "bench_namespace_index", help="where the store is built and copied")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per code")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per process")
    parser.add_argument("--baseline", type=Path, help="a checkout whose qgmem_train runs the same rounds, alternating with ours")
    parser.add_argument("--baseline-label", help="what the baseline is, for the report (default: baseline)")
    parser.add_argument("--reading", default=READING, help="what the table shows, for the report")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "namespace_index.json")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:  # a child imports only what every code it may run with has
        print(json.dumps(child(args.child, args.namespace, args.rounds)))
        return 0
    from qgmem_train.fileio import write_report_atomic
    from qgmem_train.reports import compared_codes, machine_info

    if not args.input.is_file():
        print(f"{args.input}: LoCoMo file not found (pass --input)", file=sys.stderr)
        return 2
    codes = compared_codes(ROOT, args.baseline, args.baseline_label)
    if codes is None:
        return 2
    info = machine_info()
    args.work.mkdir(parents=True, exist_ok=True)
    template = args.work / "template" if (args.work / "template").exists() else build_template(args.input, args.conversations, args.work)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in codes}
    for number in range(args.runs):
        for label, code in (codes.items() if number % 2 == 0 else reversed(codes.items())):
            runs[label].append(run_child(code, template, args.conversations[0], args.rounds, args.work))
    from qgmem_train.memory.store import MemoryStore

    with MemoryStore.open(template) as store:
        units = store.count_units(args.conversations[0])
    report = {
        "machine": info, "load_average_end": round(os.getloadavg()[0], 2), "namespace": args.conversations[0], "units": units,
        "rounds": args.rounds, "codes": {label: summary(found) for label, found in runs.items()}, "raw": runs,
        "reading": args.reading,
    }  # fmt: skip
    write_report_atomic(args.out, report, markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
