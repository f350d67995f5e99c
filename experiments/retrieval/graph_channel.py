"""The graph channel (``graph`` in ``retrieval.channels``) against today's fused order, on LoCoMo conversations in turns mode.

Every question (categories 1-4 with gold evidence) of ``--conversation`` is activated without a reranker over the
turns-mode store (rule-based intents, the pipeline's retrieval defaults): ``fused`` is today's order (three channels),
each other row the same with the graph channel in one setting, side by side in one run. Reported: recall@10 and
nDCG@10 overall and per category, each row's difference from the fused order per question with a paired bootstrap 95%
interval, and the time the channel adds to a question (mean and p95 of the walk and the second fusion). ``--grid``
measures every combination of the walk's settings (to choose them, on the selection conversations only); without it,
one setting: the defaults of ``RetrievalConfig`` with ``--weight`` etc. overriding them.

    python -m experiments.retrieval.graph_channel --conversation conv-26 conv-41 --grid --report graph_channel_selection
    python -m experiments.retrieval.graph_channel --conversation conv-30 conv-47 --weight 1 --seeds 5 --report graph_channel_reported
"""

from __future__ import annotations

import os

for _offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_offline, "1")  # the bundled embedder only: before transformers is imported

import argparse
import itertools
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.machine import machine_info
from experiments.reranker.compare import BOOTSTRAP_RESAMPLES, gain_cell, recall_gains
from qgmem_train.benchmarks.loaders import LOCOMO_CATEGORY_NAMES
from qgmem_train.benchmarks.question_batches import locomo_question_batches
from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig, RetrievalConfig
from qgmem_train.fileio import write_report_atomic
from qgmem_train.llm.factory import build_embedder
from qgmem_train.memory.store import MemoryStore
from qgmem_train.metrics.retrieval import ranking_metrics
from qgmem_train.reranker.data import ensure_turns_store
from qgmem_train.retrieval.activation import ActivationIndex, activate, fuse_channels

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_INPUT = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
K = 10
KEYS = (f"recall@{K}", f"ndcg@{K}")
CHECK_EVERY = 10
"""Every this many questions, the first setting's order is checked against a full :func:`activate`."""
GRID = {"graph_weight": (0.25, 0.5, 1.0), "graph_seeds": (3, 10), "graph_links": (("attribute",), ("attribute", "turn")), "graph_iterations": (2, 4)}
"""The settings ``--grid`` crosses (the restart stays at HippoRAG's 0.5)."""


def setting_name(setting: dict) -> str:
    """A row's name: ``graph w1.0 seeds 5 attribute+turn it4``."""
    return (f"graph w{setting['graph_weight']} seeds {setting['graph_seeds']} {'+'.join(setting['graph_links'])} "
            f"it{setting['graph_iterations']} restart {setting['graph_restart']}")


def evaluate(input_path: Path, stores: list[Path], conversations: list[str], settings: dict[str, dict]) -> tuple[list[dict], dict[str, list[float]]]:
    """Per-question recall@10 and nDCG@10 of the fused order and of each graph setting, and the seconds the channel took
    on each question in each setting; each conversation is read from the first of ``stores`` that holds it."""
    cfg = PipelineConfig()
    embedder = build_embedder(cfg)
    base = cfg.retrieval
    variants = {name: replace(base, channels=[*base.channels, "graph"], **{**s, "graph_links": list(s["graph_links"])}) for name, s in settings.items()}
    records, seconds = [], {name: [] for name in settings}
    for store in stores:
        with MemoryStore.open(store) as memory_store:
            here = [c for c in conversations if c in memory_store.namespaces()]
            conversations = [c for c in conversations if c not in here]
            batches = list(locomo_question_batches(input_path, memory_store, embedder, base, here)) if here else []
        for batch in batches:
            indexes = {links: ActivationIndex(batch.memory, replace(base, channels=[*base.channels, "graph"], graph_links=list(links)), embedder)
                       for links in {tuple(s.graph_links) for s in variants.values()}}
            sources = {u.id: u.source_turn_ids for u in batch.memory.units}
            ids = np.array([u.id for u in batch.memory.units])
            row_of = {unit_id: row for row, unit_id in enumerate(ids.tolist())}
            for q, intent, vectors in batch.items():
                run = lambda retrieval, index: activate(q.question, batch.question_time, batch.memory, cfg=retrieval, llm=None,  # noqa: E731
                                                        embedder=embedder, reranker=None, index=index, intent=intent, query_vectors=vectors)
                fused = run(base, batch.index)
                orders = {"fused": fused.reranked}
                items = [vectors[1 : 1 + len(intent.entities)], vectors[1 + len(intent.entities) :]]  # as activate splits them
                ranked = {name: np.array([row_of[u] for u in rows], np.int64) for name, rows in fused.channels.items()}
                for name, retrieval in variants.items():
                    index, timings = indexes[tuple(retrieval.graph_links)], {}
                    pool, _ = fuse_channels(index, retrieval, dict(ranked), items, timings)
                    orders[name] = ids[pool[index.without_superseded(pool)] if retrieval.drop_superseded else pool].tolist()
                    seconds[name].append(timings["graph"])
                if len(records) % CHECK_EVERY == 0:  # the shortcut (the channels searched once a question) gives what activate gives
                    first = next(iter(variants))
                    assert orders[first] == run(variants[first], indexes[tuple(variants[first].graph_links)]).reranked, first
                records.append({"conversation": batch.conversation_id, "qa_index": q.index, "category": q.category,
                                **ranking_metrics(orders, sources, set(q.evidence), K)})
    return records, seconds


def summarise(records: list[dict], names: list[str], seconds: dict[str, list[float]]) -> dict:
    """Means and paired differences from the fused order (overall and per category), and the channel's time per question."""
    def part(subset: list[dict]) -> dict:
        means = {name: {key: round(float(np.mean([r[f"{name}/{key}"] for r in subset])), 4) for key in KEYS} for name in ["fused", *names]}
        gains = {key: recall_gains(subset, names, "fused", key) for key in KEYS}
        return {"n_questions": len(subset), "means": means, "gains": {name: {key: gains[key][name] for key in KEYS} for name in names}}

    categories = sorted({r["category"] for r in records})
    return {"all": part(records),
            "per_category": {f"cat{c} {LOCOMO_CATEGORY_NAMES[c]}": part([r for r in records if r["category"] == c]) for c in categories},
            "graph_ms_per_question": {name: {"mean": round(1000 * float(np.mean(s)), 3), "p95": round(1000 * float(np.percentile(s, 95)), 3)}
                                      for name, s in seconds.items()}}  # fmt: skip


def best_setting(summary: dict, names: list[str]) -> str:
    """The setting with the highest recall@10 (then nDCG@10) over all questions."""
    means = summary["all"]["means"]
    return max(names, key=lambda name: (means[name][f"recall@{K}"], means[name][f"ndcg@{K}"]))


def markdown(report: dict) -> str:
    """Overall table (every setting), per category (the fused order and the best setting), and the channel's time."""
    s, m = report["summary"], report["machine"]
    names = list(report["settings"])
    best = report["best"]
    lines = [f"# Graph channel against the fused order on LoCoMo ({', '.join(report['conversations'])})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, load average at start {m.get('load_average_1m')}. Turns-mode store embedded with "
             f"`{report['embedder']}`, rule-based intents, no reranker, retrieval defaults; every row side by side in one run "
             f"({report['seconds']} s). Differences: per question, from the fused order, with a paired bootstrap 95% interval over questions "
             f"({report['resamples']} resamples).", "",
             f"## All {s['all']['n_questions']} questions", "",
             "| ranking | recall@10 | nDCG@10 | recall@10 difference [95%] | nDCG@10 difference [95%] | channel ms a question (mean / p95) |",
             "|---|---|---|---|---|---|"]
    for name in ["fused", *names]:
        row, gain, ms = s["all"]["means"][name], s["all"]["gains"].get(name), s["graph_ms_per_question"].get(name)
        cells = f"{gain_cell(gain[f'recall@{K}'])} | {gain_cell(gain[f'ndcg@{K}'])}" if gain else " | "
        time_cell = f"{ms['mean']} / {ms['p95']}" if ms else ""
        lines.append(f"| {'**' + name + '**' if name == best else name} | {row[f'recall@{K}']:.3f} | {row[f'ndcg@{K}']:.3f} | {cells} | {time_cell} |")
    lines += ["", f"## Per category: the fused order and {best}", "",
              "| category | n | fused recall@10 | graph recall@10 | recall@10 difference [95%] | fused nDCG@10 | graph nDCG@10 | nDCG@10 difference [95%] |",
              "|---|---|---|---|---|---|---|---|"]
    for category, part in s["per_category"].items():
        fused, graph, gain = part["means"]["fused"], part["means"][best], part["gains"][best]
        lines.append(f"| {category} | {part['n_questions']} | {fused[f'recall@{K}']:.3f} | {graph[f'recall@{K}']:.3f} | {gain_cell(gain[f'recall@{K}'])} | "
                     f"{fused[f'ndcg@{K}']:.3f} | {graph[f'ndcg@{K}']:.3f} | {gain_cell(gain[f'ndcg@{K}'])} |")
    return "\n".join(lines) + "\n"


def settings_from(args: argparse.Namespace) -> dict[str, dict]:
    """The measured settings by name: the grid, or the one setting of the defaults with the command line's overrides."""
    defaults = RetrievalConfig()
    restart = args.restart if args.restart is not None else defaults.graph_restart
    if args.grid:
        combos = [dict(zip(GRID, values), graph_restart=restart) for values in itertools.product(*GRID.values())]
    else:
        combos = [{"graph_weight": args.weight if args.weight is not None else defaults.graph_weight,
                   "graph_seeds": args.seeds if args.seeds is not None else defaults.graph_seeds,
                   "graph_links": tuple(args.links or defaults.graph_links),
                   "graph_iterations": args.iterations if args.iterations is not None else defaults.graph_iterations,
                   "graph_restart": restart}]  # fmt: skip
    return {setting_name(s): s for s in combos}


def held(store: Path, conversation: str) -> bool:
    """Whether the store in folder ``store`` exists and holds the conversation's namespace."""
    if not store.exists():
        return False
    with MemoryStore.open(store) as memory_store:
        return conversation in memory_store.namespaces()


def main() -> None:
    """Evaluate, print and write experiments/retrieval/results/<report>.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversation", nargs="+", required=True, help="LoCoMo conversations to evaluate")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="LoCoMo file (default: ../shared/data/locomo/locomo_dev.json)")
    parser.add_argument("--store", type=Path, nargs="+", default=[ROOT / "out" / "reranker" / "locomo_turns"],
                        help="turns-mode stores of the bundled embedder, each conversation read from the first that holds it; "
                             "the first store gains those none holds")
    parser.add_argument("--grid", action="store_true", help="measure every combination of the walk's settings (GRID)")
    parser.add_argument("--weight", type=float, help="retrieval.graph_weight (one setting)")
    parser.add_argument("--seeds", type=int, help="retrieval.graph_seeds (one setting)")
    parser.add_argument("--links", nargs="+", choices=("attribute", "trace", "turn"), help="retrieval.graph_links (one setting)")
    parser.add_argument("--iterations", type=int, help="retrieval.graph_iterations (one setting)")
    parser.add_argument("--restart", type=float, help="retrieval.graph_restart")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="results folder")
    parser.add_argument("--report", default="graph_channel", help="report name: writes <out>/<report>.json and .md")
    args = parser.parse_args()
    settings = settings_from(args)
    info = machine_info()
    missing = [c for c in args.conversation if not any(held(store, c) for store in args.store)]
    if missing:
        ensure_turns_store(args.input, args.store[0], conversations=missing)
    started = time.perf_counter()
    records, seconds = evaluate(args.input, args.store, args.conversation, settings)
    names = list(settings)
    summary = summarise(records, names, seconds)
    report = {"machine": info, "input": str(args.input), "store": [str(store) for store in args.store], "embedder": BUNDLED_EMBEDDER,
              "conversations": args.conversation, "settings": {name: {**s, "graph_links": list(s["graph_links"])} for name, s in settings.items()},
              "best": best_setting(summary, names), "resamples": BOOTSTRAP_RESAMPLES, "summary": summary,
              "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    text = markdown(report)
    write_report_atomic(args.out / f"{args.report}.json", report, text)
    print(text)


if __name__ == "__main__":
    main()
