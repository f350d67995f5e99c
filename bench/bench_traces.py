"""Trace building at scale: the previous all-pairs clustering against the bounded neighbour search, and adding 1%.

Run ``python bench/bench_traces.py --help``. Results go to bench/results/traces.{json,md}.

Units are synthetic and turns-like: unit-norm 384-d fact vectors around topic centres (most topics
small, a few popular ones large) and relation vectors around a few relation groups per topic, each
group with its own spread, so that some groups link (relation cosine at least τ=0.80) and others do
not; 30% of the units state no relation (turns mode's ``says``). Unit order is time order. Clustering
only: neighbour lists, relation links, components, the cut of large components into runs of
``max_trace_size``; no store and no LLM (the trajectory would be the rule one).

Every measurement runs in a fresh process: ``peak RSS`` is its ru_maxrss, including the two input
matrices (2·N·384 float32). ``old`` is the previous algorithm (a 2048-row similarity block against all
units, kept here only as the baseline); ``new`` is :func:`~qgmem_train.memory.trace_graph.build_trace_graph`
(exact up to 20k units, cells beyond); ``faiss`` takes the lists from a faiss IVF-Flat index instead
(``--faiss``); ``add`` reads the graph cached by a build over all but the last ``--added`` share of the
units, adds them as consolidation does (read the cache, extend, link, cut, write the cache) and is
compared with ``new`` over all units. With ``--baseline DIR`` (a checkout of other code, e.g. ``git archive``
of an earlier commit), each add also runs with that code's ``qgmem_train``, alternating with ours, from the
same cached graph, ``--add-repeats`` times each; the table gives each code's median.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from qgmem_train.reports import machine_info

import numpy as np

from qgmem_train.config import ConstructionConfig
from qgmem_train.fileio import write_report_atomic
from qgmem_train.memory.neighbours import EXACT_MAX_UNITS, NeighbourLists, can_extend, nearest_neighbours
from qgmem_train.memory.trace_graph import TraceGraph, extend_trace_graph, linked_components, retest_relations
from qgmem_train.memory.trace_graph_file import fingerprints, read_graph, write_graph
from qgmem_train.memory.traces import time_runs

ROOT = Path(__file__).resolve().parents[1]
DIM = 384
UNITS_PER_TOPIC = 40
POPULAR_SHARE = 0.1
"""Share of units drawn from the popular topics (1% of the topics), which grow components past the size cap."""
GROUPS_PER_TOPIC = 3
LINKABLE_SHARE = 0.7
FACT_NOISE = 0.65
"""Per-dimension noise around a topic centre: fact cosine within a topic about 1 / (1 + 0.65²) = 0.70."""
RELATION_NOISE = (0.3, 0.8)
"""Range of each relation group's noise: within-group relation cosine from about 0.92 down to 0.61."""
RECALL_SAMPLE = 1000
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_CHUNK = 65_536
BASELINE_TAG = "_baseline"


def synthetic_units(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(facts, relations, linkable) of ``n`` synthetic units, generated in chunks into float32 arrays."""
    rng = np.random.default_rng(seed)
    topics = max(1, n // UNITS_PER_TOPIC)
    popular = max(1, topics // 100)
    topic_centres = rng.standard_normal((topics, DIM), dtype=np.float32)
    group_centres = rng.standard_normal((topics * GROUPS_PER_TOPIC, DIM), dtype=np.float32)
    group_noise = rng.uniform(*RELATION_NOISE, topics * GROUPS_PER_TOPIC).astype(np.float32)
    facts = np.empty((n, DIM), np.float32)
    relations = np.empty((n, DIM), np.float32)
    for lo in range(0, n, _CHUNK):
        rows = min(n, lo + _CHUNK) - lo
        topic = np.where(rng.random(rows) < POPULAR_SHARE, rng.integers(0, popular, rows), rng.integers(0, topics, rows))
        group = topic * GROUPS_PER_TOPIC + rng.integers(0, GROUPS_PER_TOPIC, rows)
        fact = topic_centres[topic] + FACT_NOISE * rng.standard_normal((rows, DIM), dtype=np.float32)
        relation = group_centres[group] + group_noise[group, None] * rng.standard_normal((rows, DIM), dtype=np.float32)
        facts[lo:lo + rows] = fact / np.linalg.norm(fact, axis=1, keepdims=True)
        relations[lo:lo + rows] = relation / np.linalg.norm(relation, axis=1, keepdims=True)
    return facts, relations, rng.random(n) < LINKABLE_SHARE


def old_link_clusters(facts: np.ndarray, relations: np.ndarray, neighbours: int, threshold: float, min_size: int, linkable: np.ndarray) -> list[list[int]]:
    """The previous clustering: 2048 rows against all units at a time, union-find over the relation-linked pairs."""
    n = len(facts)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    k = min(neighbours, n - 1)
    for lo in range(0, n, 2048):
        rows = np.arange(lo, min(n, lo + 2048))
        sims = facts[rows] @ facts.T
        sims[np.arange(len(rows)), rows] = -np.inf
        nearest = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        relation = np.einsum("rd,rkd->rk", relations[rows], relations[nearest])
        links = (relation >= threshold) & linkable[rows][:, None] & linkable[nearest]
        for r, j in zip(*np.nonzero(links)):
            a, b = find(int(rows[r])), find(int(nearest[r, j]))
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return [g for g in groups.values() if len(g) >= max(min_size, 2)]


def cut(components: list, cc: ConstructionConfig) -> list[np.ndarray]:
    """Components (rows in time order) cut into runs of at most ``max_trace_size``: the traces."""
    return [np.asarray(c)[run] for c in components for run in time_runs(len(c), cc.max_trace_size, cc.min_cluster_size)]


def peak_mb() -> float:
    """This process's peak resident memory so far, MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """CPU time this process has used (user + system), s."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def recall(facts: np.ndarray, index: np.ndarray, seed: int = 1) -> float:
    """Share of the exact k nearest neighbours found, over a sample of units."""
    rows = np.random.default_rng(seed).choice(len(facts), min(RECALL_SAMPLE, len(facts)), replace=False)
    k, found = index.shape[1], 0
    for lo in range(0, len(rows), 64):
        part = rows[lo:lo + 64]
        sims = facts[part] @ facts.T
        sims[np.arange(len(part)), part] = -np.inf
        exact = np.argpartition(sims, sims.shape[1] - k, axis=1)[:, -k:]
        found += sum(len(set(a) & set(b)) for a, b in zip(exact.tolist(), index[part].tolist()))
    return found / (len(rows) * k)


def trace_summary(traces: list[np.ndarray]) -> dict[str, Any]:
    sizes = [len(t) for t in traces]
    return {"traces": len(traces), "units_in_traces": int(sum(sizes)), "largest_trace": max(sizes, default=0)}


def save_traces(path: Path, traces: list[np.ndarray]) -> None:
    np.savez(path, rows=np.concatenate(traces) if traces else np.zeros(0, np.int64), ends=np.cumsum([len(t) for t in traces]))


def load_traces(path: Path) -> set[tuple[int, ...]]:
    with np.load(path) as saved:
        rows, ends = saved["rows"], saved["ends"]
    return {tuple(part.tolist()) for part in np.split(rows, ends[:-1])} if len(ends) else set()


def equal_share(reference: Path, other: Path) -> float | None:
    """Share of the reference run's traces (member sets) that the other run has too; None when either is missing."""
    if not (reference.is_file() and other.is_file()):
        return None
    expected = load_traces(reference)
    return round(len(expected & load_traces(other)) / max(1, len(expected)), 4)


def faiss_lists(facts: np.ndarray, neighbours: int) -> NeighbourLists:
    """The k nearest by a faiss IVF-Flat index (about 4·√N lists, 8 probed), without each unit itself."""
    import faiss

    n = len(facts)
    cells = int(4 * np.sqrt(n))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, cells, faiss.METRIC_INNER_PRODUCT)
    index.train(facts[np.random.default_rng(0).choice(n, min(n, 40 * cells), replace=False)])
    index.add(facts)
    index.nprobe = 8
    sims, rows = index.search(facts, neighbours + 1)
    own = rows == np.arange(n)[:, None]
    drop = np.where(own.any(axis=1), own.argmax(axis=1), neighbours)
    keep = np.ones(rows.shape, bool)
    keep[np.arange(n), drop] = False
    return NeighbourLists(rows[keep].reshape(n, neighbours).astype(np.int32), sims[keep].reshape(n, neighbours))


def child(algorithm: str, n: int, added: float, work: Path, tag: str = "") -> dict[str, Any]:
    """One measurement in this process; returns its figures. ``tag`` names its output files (traces, an add's graph)."""
    cc = ConstructionConfig()
    facts, relations, linkable = synthetic_units(n)
    result: dict[str, Any] = {"algorithm": algorithm, "units": n, "input_mb": round(2 * facts.nbytes / 2**20)}
    phases: dict[str, float] = {}
    cpu_start = cpu_seconds()
    start = time.perf_counter()
    if algorithm == "old":
        traces = cut(old_link_clusters(facts, relations, cc.neighbours, cc.relation_threshold, cc.min_cluster_size, linkable), cc)
    elif algorithm in ("new", "cells", "faiss", "base"):
        if algorithm == "base":
            n = n - int(round(added * n))
            facts, relations, linkable = facts[:n], relations[:n], linkable[:n]
            result["units"] = n
        if algorithm == "faiss":
            lists = faiss_lists(facts, cc.neighbours)
        else:
            lists = nearest_neighbours(facts, cc.neighbours, exact_max=0 if algorithm == "cells" else EXACT_MAX_UNITS)
        phases["neighbours_s"] = time.perf_counter() - start
        graph = TraceGraph(lists, np.zeros(lists.index.shape, bool), cc.relation_threshold)
        retest_relations(graph, relations, np.arange(n), 256 * 2**20)
        phases["relations_s"] = time.perf_counter() - start - sum(phases.values())
        traces = cut(linked_components(graph, linkable, cc.min_cluster_size), cc)
        phases["components_and_cut_s"] = time.perf_counter() - start - sum(phases.values())
        result["search"] = "faiss IVF-Flat" if algorithm == "faiss" else ("exact" if lists.cells is None else f"cells ({len(lists.cells.centroids)})")
        if algorithm == "base":
            write_graph(work / "graph.npz", [f"u{i}" for i in range(n)], fingerprints(facts, relations), graph)
    else:  # add
        ids = [f"u{i}" for i in range(n)]
        prints = fingerprints(facts, relations)
        # what the cache reader bounds its read by (k as memory.neighbours.neighbour_count, which a baseline may lack)
        bounds = {"k": max(0, min(cc.neighbours, n - 1)), "dim": facts.shape[1]}
        accepted = inspect.signature(read_graph).parameters  # a baseline written before the bounded read takes neither
        stored = read_graph(work / "graph.npz", ids, prints, **{name: value for name, value in bounds.items() if name in accepted})
        assert stored is not None and can_extend(stored.graph.lists, n, cc.neighbours), "no usable cached graph"
        phases["read_cache_s"] = time.perf_counter() - start
        changed = extend_trace_graph(stored.graph, facts, relations, stored.new_rows, cc.relation_threshold)
        phases["extend_s"] = time.perf_counter() - start - sum(phases.values())
        graph = stored.graph
        traces = cut(linked_components(graph, linkable, cc.min_cluster_size), cc)
        phases["components_and_cut_s"] = time.perf_counter() - start - sum(phases.values())
        write_graph(work / f"{algorithm}{tag}_graph.npz", ids, prints, graph)
        phases["write_cache_s"] = time.perf_counter() - start - sum(phases.values())
        result.update(added_units=len(stored.new_rows), lists_changed=int(changed.sum()))
        result["search"] = "exact" if graph.lists.cells is None else f"cells ({len(graph.lists.cells.centroids)})"
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["cpu_seconds"] = round(cpu_seconds() - cpu_start, 2)
    result["peak_rss_mb"] = round(peak_mb())
    result["phases"] = {key: round(value, 2) for key, value in phases.items()}
    result.update(trace_summary(traces))
    if algorithm != "old":
        result["recall_at_20"] = round(recall(facts, graph.lists.index), 4)
    save_traces(work / f"{algorithm}{tag}_traces.npz", traces)
    return result


def run_child(algorithm: str, n: int, added: float, work: Path, timeout: float, blas_threads: int, code: Path = ROOT, tag: str = "") -> dict[str, Any]:
    """:func:`child` in a fresh process (its own peak memory) with ``qgmem_train`` from ``code``; a run past ``timeout`` seconds is reported as such."""
    command = [sys.executable, __file__, "--child", algorithm, "--sizes", str(n), "--added", str(added), "--work", str(work), "--tag", tag]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(ROOT / "bench")]))
    env.update({name: str(blas_threads) for name in BLAS_THREAD_VARIABLES})
    try:
        done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"algorithm": algorithm, "units": n, "timed_out_s": timeout}
    except subprocess.CalledProcessError as exc:
        return {"algorithm": algorithm, "units": n, "failed": exc.stderr.strip().splitlines()[-1:] or [str(exc)]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_adds(n: int, args: argparse.Namespace, work: Path) -> dict[str, list[dict[str, Any]]]:
    """The add run ``args.add_repeats`` times by each code (ours, and the baseline's when given), alternating."""
    codes = {"": ROOT} | ({BASELINE_TAG: args.baseline} if args.baseline else {})
    runs: dict[str, list[dict[str, Any]]] = {tag: [] for tag in codes}
    for repeat in range(args.add_repeats):
        for tag, code in (codes.items() if repeat % 2 == 0 else reversed(codes.items())):
            run = run_child("add", n, args.added, work, args.timeout, args.blas_threads, code, tag)
            run["code"] = "baseline" if tag else "this"
            runs[tag].append(run)
            print(json.dumps(run), flush=True)
    return runs


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time (the first when any failed), with the wall and CPU seconds of every run."""
    done = [r for r in runs if "seconds" in r]
    if len(done) < len(runs):
        return next(r for r in runs if "seconds" not in r)
    middle = dict(sorted(done, key=lambda r: r["seconds"])[(len(done) - 1) // 2])
    middle.update(all_seconds=[r["seconds"] for r in done], all_cpu_seconds=[r["cpu_seconds"] for r in done],
                  cpu_seconds=statistics.median(r["cpu_seconds"] for r in done))
    return middle


NOTES = [
    "- `old`: the previous clustering (2048 units against all at a time, argpartition, union-find in Python); "
    "`new`: exact up to 20k units, cells beyond; `cells`: the cell search forced where `new` is exact; "
    "`faiss`: the same linking with lists from faiss IVF-Flat (4·√N lists, 8 probed); `base`: `new` over all but the "
    "last 1% of the units, cached as consolidation caches it; `add`: those 1% added to the cached graph.",
    "- recall@20: share of the exact 20 nearest neighbours listed, over 1000 sampled units. Traces equal to exact: share "
    "of the exact run's traces (member sets) that the run has too; one missed or extra neighbour can split, join or "
    "shift a trace, so this is stricter than recall.",
    "- With a baseline: `add (baseline)` is the same add run with the baseline's `qgmem_train`, alternating with ours; "
    "each add row is the median of its repeats (wall; CPU is the median CPU), all repeats listed in the JSON.",
    "- Runs use one BLAS thread: the cell search makes thousands of mid-sized matrix products, and with two OpenBLAS "
    "threads on this shared machine a thread spins while the other waits to be scheduled (a 30k-unit build took "
    "20 CPU s and 335 s with two threads, 2.4 CPU s and 37 s with one, `OPENBLAS_NUM_THREADS`).",
]


def targets(report: dict[str, Any]) -> list[str]:
    """The targets (largest size: under 10 minutes and 4 GB; adding 1% under 5% of a full build), met or not, as measured."""
    full = [r for r in report["runs"] if r["algorithm"] == "new" and "seconds" in r]
    if not full:
        return []
    largest = max(full, key=lambda r: r["units"])
    lines = [
        f"- {largest['units']} units, full build: {largest['seconds']} s wall ({largest['cpu_seconds']} CPU s), target 600 s: "
        f"{'met' if largest['seconds'] < 600 else 'not met'}; peak {largest['peak_rss_mb']} MB, target 4096 MB: "
        f"{'met' if largest['peak_rss_mb'] < 4096 else 'not met'}."
    ]
    for row in report["incremental"]:
        met = "met" if row["ratio"] < 0.05 else "not met"
        lines.append(f"- {row['units']} units, adding {row['added']} ({row.get('code', 'this')} code): {row['ratio']:.1%} of a full build's wall time ({row['cpu_ratio']:.1%} of its CPU), target 5%: {met}.")
    return lines


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Trace building at scale",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}; Python {m['python']}; load average {m.get('load_average_1m')} at the start "
        f"(`uptime` then: {report['uptime_start']}; at the end: {report['uptime_end']}). The machine is shared with other jobs: "
        "figures are as measured under that load.",
        f"Synthetic turns-like units, {DIM}-d; neighbours 20, τ 0.80, min cluster 2, max trace size {ConstructionConfig().max_trace_size}; "
        f"exact search up to {EXACT_MAX_UNITS} units, cells beyond; BLAS threads per run: {report['blas_threads']}. "
        "Peak RSS includes the two input matrices (input MB); CPU s is the run's user + system time. "
        "Command: `python bench/bench_traces.py " + report.get("command", "") + "`."
        + (f" Baseline code: {report['baseline']}." if report.get("baseline") else ""),
        "",
        "| units | algorithm | search | wall s | CPU s | peak RSS MB | input MB | traces | units in traces | largest | recall@20 | traces equal to exact | phases (wall s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        if "seconds" not in r:
            status = f"timed out after {r['timed_out_s']:.0f} s" if "timed_out_s" in r else f"failed: {r.get('failed')}"
            lines.append(f"| {r['units']} | {r['algorithm']} | | {status} | | | | | | | | | |")
            continue
        phases = ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in r.get("phases", {}).items())
        lines.append(
            f"| {r['units']} | {r['algorithm']}{' (baseline)' if r.get('code') == 'baseline' else ''} | {r.get('search', 'exact, 2048-row blocks')} | {r['seconds']} | {r['cpu_seconds']} | {r['peak_rss_mb']} | {r['input_mb']} | "
            f"{r['traces']} | {r['units_in_traces']} | {r['largest_trace']} | {r.get('recall_at_20', '')} | {r.get('traces_equal_to_exact', '')} | {phases} |"
        )
    lines += ["", "Adding units to a namespace (`add`: read the cached graph, extend it, link, cut, write it back) against building all units anew (`new`):", ""]
    lines += [
        "| units | added | code | full build s (CPU s) | add s (CPU s) | add / full, wall (CPU) | lists changed | peak RSS MB (add) | traces equal to the full build's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["incremental"]:
        lines.append(
            f"| {row['units']} | {row['added']} | {row.get('code', 'this')} | {row['full_s']} ({row['full_cpu_s']}) | {row['add_s']} ({row['add_cpu_s']}) | {row['ratio']} ({row['cpu_ratio']}) | "
            f"{row['lists_changed']} | {row['peak_rss_mb']} | {row['traces_equal']} |"
        )
    return "\n".join(lines + ["", "Targets:", ""] + targets(report) + ["", "Notes:", ""] + NOTES) + "\n"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="namespace sizes (units)")
    parser.add_argument("--old-max", type=int, default=100_000, help="largest size the previous algorithm runs at")
    parser.add_argument("--cells", type=int, nargs="*", default=[10_000], help="sizes to also run the cell search at where it would be exact")
    parser.add_argument("--faiss", type=int, nargs="*", default=[], help="sizes to also run the faiss IVF-Flat lists at")
    parser.add_argument("--added", type=float, default=0.01, help="share of units added to a built namespace")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a run is stopped")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads of each run (1: many small products; see the results' notes)")
    parser.add_argument("--baseline", type=Path, help="a checkout whose qgmem_train also runs each add, side by side with ours")
    parser.add_argument("--baseline-label", help="what the baseline is, for the report (default: its path), e.g. the commit it was taken from")
    parser.add_argument("--add-repeats", type=int, default=1, help="times each code's add runs (alternating); the median is reported")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "traces.json")
    parser.add_argument("--render", action="store_true", help="only rewrite the .md from the .json at --out")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.sizes[0], args.added, args.work, args.tag)))
        return 0
    if args.baseline is not None and not (args.baseline / "qgmem_train" / "memory" / "trace_graph.py").is_file():
        print(f"--baseline {args.baseline}: no qgmem_train/memory/trace_graph.py there", file=sys.stderr)
        return 2
    if args.add_repeats < 1:
        print("--add-repeats must be at least 1", file=sys.stderr)
        return 2
    if args.render:
        report = json.loads(args.out.read_text())
        write_report_atomic(args.out, report, markdown(report))
        return 0
    report: dict[str, Any] = {
        "machine": machine_info(), "command": " ".join(sys.argv[1:] if argv is None else argv), "blas_threads": args.blas_threads,
        "uptime_start": uptime(), "runs": [], "incremental": [], "baseline": (args.baseline_label or str(args.baseline)) if args.baseline else None,
    }
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench_traces.") as folder:
            work = Path(folder)
            plan = (["old"] if n <= args.old_max else []) + ["new"] + (["cells"] if n in args.cells else []) + (["faiss"] if n in args.faiss else [])
            measured = {}
            for algorithm in plan + ["base"]:
                measured[algorithm] = run_child(algorithm, n, args.added, work, args.timeout, args.blas_threads)
                print(json.dumps(measured[algorithm]), flush=True)
            adds = {tag: median_run(runs) for tag, runs in run_adds(n, args, work).items()}
            exact = "old" if "seconds" in measured.get("old", {}) else "new" if measured["new"].get("search") == "exact" else None
            for algorithm in plan:
                if exact is not None and algorithm != exact:
                    measured[algorithm]["traces_equal_to_exact"] = equal_share(work / f"{exact}_traces.npz", work / f"{algorithm}_traces.npz")
                report["runs"].append(measured[algorithm])
            report["runs"].append(measured["base"])
            full = measured["new"]
            for tag, add in sorted(adds.items()):
                add["traces_equal_to_full_build"] = equal_share(work / "new_traces.npz", work / f"add{tag}_traces.npz")
                report["runs"].append(add)
                if "seconds" in full and "seconds" in add:
                    report["incremental"].append({
                        "units": n, "added": add["added_units"], "code": add["code"], "full_s": full["seconds"], "add_s": add["seconds"],
                        "full_cpu_s": full["cpu_seconds"], "add_cpu_s": add["cpu_seconds"],
                        "ratio": round(add["seconds"] / full["seconds"], 4), "cpu_ratio": round(add["cpu_seconds"] / full["cpu_seconds"], 4),
                        "lists_changed": add["lists_changed"],
                        "peak_rss_mb": add["peak_rss_mb"], "traces_equal": add.get("traces_equal_to_full_build"),
                    })
    report["uptime_end"] = uptime()
    write_report_atomic(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
