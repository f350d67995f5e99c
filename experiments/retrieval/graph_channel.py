"""The graph channel (``graph`` in ``retrieval.channels``) against today's fused order, on LoCoMo conversations in turns mode.

Every question (categories 1-4 with gold evidence) of ``--conversation`` is activated without a reranker over the
turns-mode store (rule-based intents, the pipeline's retrieval defaults): ``fused`` is today's order (three channels),
each other row the same with the graph channel in one setting, side by side in one run. Reported: recall@10 and
nDCG@10 overall and per category, each row's difference from the fused order per question with a paired bootstrap 95%
interval, and the time the channel adds to a question (mean and p95 of the walk and the second fusion). ``--grid``
measures every combination of the walk's settings (to choose them, on the selection conversations only); without it,
one setting: the defaults of ``RetrievalConfig`` with ``--weight`` etc. overriding them. ``--reranker FOLDER`` adds each row
reranked by that cross-encoder as configs/demo-cpu.yaml reranks (its runtime, precision, rerank mode, prior and top), the
pool of every row its own: a graph setting reranked is compared with the fused order reranked.

    python -m experiments.retrieval.graph_channel --conversation conv-26 conv-41 --grid --report graph_channel_selection
    python -m experiments.retrieval.graph_channel --conversation conv-30 conv-47 --weight 1 --seeds 5 --report graph_channel_reported
    python -m experiments.retrieval.graph_channel --conversation conv-30 conv-47 --weight 1 --seeds 3 \
        --reranker checkpoints/reranker-cpu-small/model --report graph_channel_reported_reranker
"""

from __future__ import annotations

import os

for _offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_offline, "1")  # the bundled embedder only: before transformers is imported

import argparse
import itertools
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from qgmem_train.reports import machine_info, portable
from experiments.reranker.compare import BOOTSTRAP_RESAMPLES, gain_cell, model_name, read_training, recall_gains
from qgmem_train.benchmarks.loaders import LOCOMO_CATEGORY_NAMES
from qgmem_train.benchmarks.question_batches import locomo_question_batches
from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig, RetrievalConfig, load_pipeline_config
from qgmem_train.fileio import write_report_atomic
from qgmem_train.llm.factory import build_embedder
from qgmem_train.memory.store import MemoryStore
from qgmem_train.metrics.retrieval import ranking_metrics
from qgmem_train.retrieval.cross_encoder import TRAINING_RECORD
from qgmem_train.reranker.data import ensure_turns_store
from qgmem_train.retrieval.activation import ActivationIndex, activate, fuse_channels
from qgmem_train.retrieval.rerank import Reranker, build_reranker

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_INPUT = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
K = 10
KEYS = (f"recall@{K}", f"ndcg@{K}")
CHECK_EVERY = 10
"""Every this many questions, the first setting's order is checked against a full :func:`activate`."""
GRID = {"graph_weight": (0.25, 0.5, 1.0), "graph_seeds": (3, 10), "graph_links": (("attribute",), ("attribute", "turn")), "graph_iterations": (2, 4)}
"""The settings ``--grid`` crosses (the restart stays at HippoRAG's 0.5)."""
DEMO_CONFIG = ROOT / "configs" / "demo-cpu.yaml"
"""The config whose reranker settings ``--reranker`` applies."""
RERANK_SETTINGS = ("rerank_mode", "rerank_prior", "rerank_top")
"""The retrieval settings of the demo config that say how a pool is reranked."""
RERANKED = " + reranker"
"""Suffix of a row's name reranked."""


def setting_name(setting: dict) -> str:
    """A row's name: ``graph w1.0 seeds 5 attribute+turn it4``."""
    return (f"graph w{setting['graph_weight']} seeds {setting['graph_seeds']} {'+'.join(setting['graph_links'])} "
            f"it{setting['graph_iterations']} restart {setting['graph_restart']}")


def demo_reranker(folder: Path) -> tuple[Reranker, PipelineConfig]:
    """The cross-encoder in ``folder`` as configs/demo-cpu.yaml runs it (runtime, precision, batch), and that config."""
    cfg = load_pipeline_config(DEMO_CONFIG)
    cfg.models.reranker_model = str(folder)
    return build_reranker(cfg), cfg


def compared_with(names: list[str], reranked: bool) -> dict[str, str]:
    """Each row after the fused order and the row its differences are taken from: a graph setting from the fused order; with the
    reranker, the fused order reranked from the fused order and a graph setting reranked from the fused order reranked."""
    if not reranked:
        return dict.fromkeys(names, "fused")
    rows = {"fused" + RERANKED: "fused"}
    for name in names:
        rows.update({name: "fused", name + RERANKED: "fused" + RERANKED})
    return rows


def evaluate(input_path: Path, stores: list[Path], conversations: list[str], settings: dict[str, dict],
             reranking: tuple[Reranker, RetrievalConfig] | None = None) -> tuple[list[dict], dict[str, list[float]]]:
    """Per-question recall@10 and nDCG@10 of the fused order and of each graph setting, and the seconds the channel took
    on each question in each setting; each conversation is read from the first of ``stores`` that holds it.

    ``reranking`` (a reranker and the retrieval settings it reranks with): each row also activated with it, over that row's
    own pool (checked), as ``<row> + reranker``."""
    cfg = PipelineConfig()
    embedder = build_embedder(cfg)
    base = cfg.retrieval
    variants = {name: replace(base, channels=[*base.channels, "graph"], **{**s, "graph_links": list(s["graph_links"])}) for name, s in settings.items()}
    records, seconds = [], {name: [] for name in settings}
    reranked: dict[str, RetrievalConfig] = {}
    if reranking is not None:
        reranker, rerank_settings = reranking
        rerank_with = {key: getattr(rerank_settings, key) for key in RERANK_SETTINGS}
        reranked = {name: replace(retrieval, **rerank_with) for name, retrieval in {"fused": base, **variants}.items()}
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
                run = lambda retrieval, index, reranker=None: activate(q.question, batch.question_time, batch.memory, cfg=retrieval,  # noqa: E731
                                                                       llm=None, embedder=embedder, reranker=reranker, index=index,
                                                                       intent=intent, query_vectors=vectors)
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
                for name, retrieval in reranked.items():
                    index = indexes[tuple(retrieval.graph_links)] if name in variants else batch.index
                    memory = run(retrieval, index, reranker)
                    assert memory.fused == orders[name], name  # the row's own pool, reranked
                    orders[name + RERANKED] = memory.reranked
                records.append({"conversation": batch.conversation_id, "qa_index": q.index, "category": q.category,
                                **ranking_metrics(orders, sources, set(q.evidence), K)})
    return records, seconds


def summarise(records: list[dict], against: dict[str, str], seconds: dict[str, list[float]]) -> dict:
    """Means and paired differences of each row from the row ``against`` names (overall and per category), and the channel's
    time per question."""
    def part(subset: list[dict]) -> dict:
        means = {name: {key: round(float(np.mean([r[f"{name}/{key}"] for r in subset])), 4) for key in KEYS} for name in ["fused", *against]}
        gains = {name: {key: recall_gains(subset, [name], reference, key)[name] for key in KEYS} for name, reference in against.items()}
        return {"n_questions": len(subset), "means": means, "gains": gains}

    categories = sorted({r["category"] for r in records})
    return {"all": part(records), "against": against,
            "per_category": {f"cat{c} {LOCOMO_CATEGORY_NAMES[c]}": part([r for r in records if r["category"] == c]) for c in categories},
            "graph_ms_per_question": {name: {"mean": round(1000 * float(np.mean(s)), 3), "p95": round(1000 * float(np.percentile(s, 95)), 3)}
                                      for name, s in seconds.items()}}  # fmt: skip


def best_setting(summary: dict, names: list[str]) -> str:
    """The setting with the highest recall@10 (then nDCG@10) over all questions."""
    means = summary["all"]["means"]
    return max(names, key=lambda name: (means[name][f"recall@{K}"], means[name][f"ndcg@{K}"]))


def setup_text(report: dict) -> str:
    """What every row read and how each difference is taken: without a reranker, or with the one ``--reranker`` named."""
    rr = report.get("reranker")
    if rr is None:
        return (f"`{report['embedder']}`, rule-based intents, no reranker, retrieval defaults; every row side by side in one run "
                f"({report['seconds']} s). Differences: per question, from the fused order")
    top = f"the first {rr['rerank_top']} units" if rr["rerank_top"] else "every unit"
    trained = (f" The reranker trained on {', '.join(rr['trained_on_evaluated'])}: its rows there are not held-out."
               if rr["trained_on_evaluated"] else f" The reranker never trained on these conversations (it trained on {', '.join(rr['train_conversations'])}).")
    return (f"`{report['embedder']}`, rule-based intents, retrieval defaults; each row also reranked (`+ reranker`) by `{rr['folder']}` as "
            f"configs/demo-cpu.yaml reranks ({rr['runtime']} {rr['quantization']}, {rr['document_layout']} documents, {rr['rerank_mode']} mode, "
            f"prior {rr['rerank_prior']}, {top} of the row's own pool); every row side by side in one run ({report['seconds']} s).{trained} "
            "Differences: per question, a row without the reranker from the fused order, the fused order reranked from the fused order, "
            "a graph setting reranked from the fused order reranked")


def category_table(s: dict, reference: str, row: str) -> list[str]:
    """Per category: ``reference``'s and ``row``'s recall@10 and nDCG@10 and their paired differences."""
    lines = [f"## Per category: {'the fused order' if reference == 'fused' else reference} and {row}", "",
             "| category | n | fused recall@10 | graph recall@10 | recall@10 difference [95%] | fused nDCG@10 | graph nDCG@10 | nDCG@10 difference [95%] |",
             "|---|---|---|---|---|---|---|---|"]
    for category, part in s["per_category"].items():
        fused, graph, gain = part["means"][reference], part["means"][row], part["gains"][row]
        lines.append(f"| {category} | {part['n_questions']} | {fused[f'recall@{K}']:.3f} | {graph[f'recall@{K}']:.3f} | {gain_cell(gain[f'recall@{K}'])} | "
                     f"{fused[f'ndcg@{K}']:.3f} | {graph[f'ndcg@{K}']:.3f} | {gain_cell(gain[f'ndcg@{K}'])} |")
    return lines


def markdown(report: dict) -> str:
    """Overall table (every row), per category (the fused order and the best setting, and both reranked), and the channel's time."""
    s, m = report["summary"], report["machine"]
    best = report["best"]
    lines = [f"# Graph channel against the fused order on LoCoMo ({', '.join(report['conversations'])})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, load average at start {m.get('load_average_1m')}. Turns-mode store embedded with "
             f"{setup_text(report)}, with a paired bootstrap 95% interval over questions ({report['resamples']} resamples).", "",
             f"## All {s['all']['n_questions']} questions", "",
             "| ranking | recall@10 | nDCG@10 | recall@10 difference [95%] | nDCG@10 difference [95%] | channel ms a question (mean / p95) |",
             "|---|---|---|---|---|---|"]
    for name in ["fused", *s["against"]]:
        row, gain, ms = s["all"]["means"][name], s["all"]["gains"].get(name), s["graph_ms_per_question"].get(name)
        cells = f"{gain_cell(gain[f'recall@{K}'])} | {gain_cell(gain[f'ndcg@{K}'])}" if gain else " | "
        time_cell = f"{ms['mean']} / {ms['p95']}" if ms else ""
        lines.append(f"| {'**' + name + '**' if name == best else name} | {row[f'recall@{K}']:.3f} | {row[f'ndcg@{K}']:.3f} | {cells} | {time_cell} |")
    lines += ["", *category_table(s, "fused", best)]
    if report.get("reranker"):
        lines += ["", *category_table(s, "fused" + RERANKED, best + RERANKED)]
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


def reranker_record(folder: Path, reranker: Reranker, cfg: PipelineConfig, conversations: list[str]) -> dict:
    """How the reranked rows were reranked, and on which of the evaluated conversations the reranker trained."""
    training = read_training(folder)
    return {"folder": str(folder), "name": model_name(folder), "runtime": cfg.models.reranker_runtime, "quantization": cfg.models.reranker_quantization,
            "document_layout": reranker.document_layout, **{key: getattr(cfg.retrieval, key) for key in RERANK_SETTINGS},
            "train_conversations": training["train_conversations"],
            "trained_on_evaluated": [c for c in conversations if c in training["train_conversations"]]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
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
    parser.add_argument("--reranker", type=Path, help="a trained cross-encoder folder: each row also reranked by it as configs/demo-cpu.yaml "
                                                      "reranks (default: none)")
    args = parser.parse_args(argv)
    if args.reranker is not None and not (args.reranker / TRAINING_RECORD).is_file():
        print(f"{args.reranker}: no {TRAINING_RECORD}; --reranker names a folder fit-reranker wrote (make reranker-small)", file=sys.stderr)
        return 2
    settings = settings_from(args)
    info = machine_info()
    missing = [c for c in args.conversation if not any(held(store, c) for store in args.store)]
    if missing:
        ensure_turns_store(args.input, args.store[0], conversations=missing)
    started = time.perf_counter()
    reranking, record = None, None
    if args.reranker is not None:
        cross_encoder, demo = demo_reranker(args.reranker)
        reranking, record = (cross_encoder, demo.retrieval), reranker_record(args.reranker, cross_encoder, demo, args.conversation)
        if record["trained_on_evaluated"]:
            print(f"warning: {args.reranker} trained on {', '.join(record['trained_on_evaluated'])}: its rows there are not held-out", file=sys.stderr)
    records, seconds = evaluate(args.input, args.store, args.conversation, settings, reranking)
    names = list(settings)
    summary = summarise(records, compared_with(names, reranking is not None), seconds)
    report = {"machine": info, "input": str(args.input), "store": [str(store) for store in args.store], "embedder": BUNDLED_EMBEDDER,
              "conversations": args.conversation, "settings": {name: {**s, "graph_links": list(s["graph_links"])} for name, s in settings.items()},
              "best": best_setting(summary, names), "resamples": BOOTSTRAP_RESAMPLES, "summary": summary, "reranker": record,
              "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    report = portable(report, args.out)
    text = markdown(report)
    write_report_atomic(args.out / f"{args.report}.json", report, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
