"""Shape of the local graphs with and without ``graph.attribute_edges``: nodes, edges, connected components per graph.

    python -m experiments.graph_token.structure                          # the graph-token experiment's data, 60 questions a conversation
    python -m experiments.graph_token.structure --data DIR --max-questions 0   # any ConvoMem-format folder, every question

Every conversation of ``--data`` (grouped as the graph-token study does) is built in turns mode into a
store under ``--work`` (no traces, no sentence vectors, as the experiment's data prep; reused when there), a seeded
sample of its questions is activated with rule intents and no reranker (k = 10), and each working memory's local graph
is built twice: one edge per unit (the paper's), and with attribute edges. Components are weakly connected ones (edge
direction ignored); a graph is one piece when it has one component. A meeting node is one that two or more edges
point to: where two units (or two attributes) meet, beyond their shared subject. Writes ``graph_structure.{json,md}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from qgmem_train.reports import git_state, machine_info, portable  # noqa: E402
from experiments.graph_token.data import DEFAULT_DATA, find_conversations  # noqa: E402

from qgmem_train.errors import InputError  # noqa: E402
from qgmem_train.fileio import write_report_atomic  # noqa: E402
from qgmem_train.graph.local_graph import LocalGraph, local_graph_from_units  # noqa: E402

SHAPE_KEYS = ("nodes", "edges", "components", "largest_component_nodes", "meeting_nodes")
PIPELINE = {
    "models": {"reranker": "none", "device": "cpu"},
    "construction": {"units": "turns", "traces": False, "sentence_vectors": False},
    "retrieval": {"k": 10},
}
"""The experiment's data-prep settings that shape a working memory."""


def graph_shape(graph: LocalGraph) -> dict[str, int]:
    """Nodes, edges, weakly connected components, the node count of the largest one, and meeting nodes (reached by 2+ edges)."""
    parent = list(range(graph.num_nodes))

    def top(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for s, d in zip(graph.edge_src, graph.edge_dst):
        parent[top(s)] = top(d)
    sizes: dict[int, int] = {}
    for i in range(graph.num_nodes):
        sizes[top(i)] = sizes.get(top(i), 0) + 1
    reached = [graph.edge_dst.count(i) for i in range(graph.num_nodes)]
    return {"nodes": graph.num_nodes, "edges": graph.num_edges, "components": len(sizes), "largest_component_nodes": max(sizes.values(), default=0),
            "meeting_nodes": sum(r >= 2 for r in reached)}  # fmt: skip


def summarize(shapes: list[dict[str, int]]) -> dict[str, Any]:
    """Mean, median, min and max of each shape key, and the share of graphs in one piece."""
    out: dict[str, Any] = {"graphs": len(shapes)}
    for key in SHAPE_KEYS:
        values = [s[key] for s in shapes]
        out[key] = {"mean": round(statistics.fmean(values), 2), "median": statistics.median(values), "min": min(values), "max": max(values)}
    out["one_piece"] = round(sum(s["components"] == 1 for s in shapes) / len(shapes), 3)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build, activate and measure every conversation; per-conversation and overall summaries, before and after."""
    from qgmem_train.config import pipeline_from_dict
    from qgmem_train.llm.factory import build_embedder
    from qgmem_train.memory.construct import build_conversation
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.memory.types import Conversation
    from qgmem_train.retrieval.activation import ActivationIndex, activate

    pipeline = pipeline_from_dict(PIPELINE, "graph_structure")
    embedder = build_embedder(pipeline)
    conversations = find_conversations(args.data)
    args.work.mkdir(parents=True, exist_ok=True)
    shapes: dict[str, dict[str, list[dict[str, int]]]] = {}
    with MemoryStore.open(args.work / "store.sqlite", create=True) as store:
        for conversation in conversations:
            started = time.perf_counter()
            if conversation.name not in store.namespaces():
                build_conversation(store, Conversation(conversation.name, conversation.sessions), pipeline, embedder, namespace=conversation.name)
            memory = store.load_namespace(conversation.name)
            index = ActivationIndex(memory, pipeline.retrieval, embedder)
            order = list(range(len(conversation.questions)))
            random.Random(f"questions:{args.seed}:{conversation.name}").shuffle(order)
            picked = sorted(order[: args.max_questions or None])
            found: dict[str, list[dict[str, int]]] = {"one edge per unit": [], "attribute edges": []}
            for i in picked:
                question = conversation.questions[i][1].question
                wm = activate(question, None, memory, cfg=pipeline.retrieval, llm=None, embedder=embedder, reranker=None, index=index)
                k = pipeline.retrieval.k
                found["one edge per unit"].append(graph_shape(local_graph_from_units(wm.units, max_edges=k)))
                found["attribute edges"].append(graph_shape(local_graph_from_units(wm.units, max_edges=k, attribute_edges=True)))
            shapes[conversation.name] = found
            print(f"{conversation.name}: {len(picked)} questions in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    overall = {mode: [s for found in shapes.values() for s in found[mode]] for mode in ("one edge per unit", "attribute edges")}
    return {
        "per_conversation": {name: {mode: summarize(v) for mode, v in found.items()} for name, found in shapes.items()},
        "overall": {mode: summarize(v) for mode, v in overall.items()},
    }


def markdown(result: dict[str, Any]) -> str:
    """The report: settings, the overall table, one row pair per conversation."""
    lines = [
        "# Local-graph structure with and without `graph.attribute_edges`",
        "",
        f"Command: `{result['command']}`  ",
        f"Commit: `{result['git']}`; machine: {result['machine']['cores']} cores, load average {result['machine'].get('load_average_1m')} at the start; "
        f"{result['wall_s']} s.",
        "",
        f"Data: `{result['data']}`; turns units, no traces, no sentence vectors, rule intents, no reranker, k = 10 "
        f"(the graph-token experiment's data prep); {result['max_questions'] or 'every'} question(s) per conversation (seed {result['seed']}).",
        "Components are weakly connected (edge direction ignored); 'one piece' is the share of graphs with one component; "
        "a meeting node is one that two or more edges point to (units meet there beyond their shared subject).",
        "",
        "## All conversations",
        "",
        "| local graph | graphs | nodes mean (median) | edges mean (median) | components mean (median) | largest component nodes mean | meeting nodes mean (median) | one piece |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def row(label: str, s: dict[str, Any]) -> str:
        cell = lambda k: f"{s[k]['mean']:.2f} ({s[k]['median']})"  # noqa: E731
        return f"| {label} | {s['graphs']} | {cell('nodes')} | {cell('edges')} | {cell('components')} | {s['largest_component_nodes']['mean']:.2f} | {cell('meeting_nodes')} | {s['one_piece']:.3f} |"

    lines += [row(mode, s) for mode, s in result["overall"].items()]
    lines += ["", "## Per conversation", "", "| conversation | local graph | graphs | nodes mean (median) | edges mean (median) | components mean (median) | largest component nodes mean | meeting nodes mean (median) | one piece |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, found in result["per_conversation"].items():
        lines += [row(f"{name} | {mode}", s) for mode, s in found.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure and write the report; bad input is one line on stderr and exit 2."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="ConvoMem-format folder")
    p.add_argument("--work", type=Path, default=Path("out/graph_structure"), help="store of the built conversations (reused)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="folder of graph_structure.{json,md}")
    p.add_argument("--max-questions", type=int, default=60, help="questions per conversation (0: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the question sample")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    started = time.perf_counter()
    machine = machine_info()
    try:
        measured = measure(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = {"command": " ".join(["python", "-m", "experiments.graph_token.structure", *argv]), "git": git_state()["commit"], "machine": machine,
              "data": str(args.data), "max_questions": args.max_questions, "seed": args.seed, **measured,
              "wall_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    result = portable(result, args.out)
    write_report_atomic(args.out / "graph_structure.json", result, markdown(result))
    print(json.dumps(result["overall"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
