"""Concurrent store writers: W processes adding S sessions each to one store at once, against one process adding them all.

Run ``python bench/bench_store_writers.py --help``. Results go to bench/results/store_writers.{json,md}.
Each session is added as ``PredictorMemory.add_session`` adds it (``build_conversation`` of one session
whose id is :func:`~qgmem_train.memory.types.session_fingerprint`), in turns mode with traces written by
the rule trajectory (no LLM). The embedder is, by default, a hash embedder (SHA-256-seeded unit vectors,
no model) so that the figures are the store's; ``--embedder minilm`` uses the bundled MiniLM instead.
Every run ends with a check that each session is stored exactly once and its namespace is consistent.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from qgmem_train.reports import machine_info

import numpy as np

from qgmem_train.config import BUNDLED_EMBEDDER, PipelineConfig
from qgmem_train.fileio import write_report_atomic
from qgmem_train.memory.construct import build_conversation
from qgmem_train.memory.store import MemoryStore
from qgmem_train.memory.types import Conversation, Session, Turn, session_fingerprint

ROOT = Path(__file__).resolve().parents[1]
PLACES = ["harbour", "museum", "old town", "market", "castle", "beach", "bridge", "park", "lake", "tower"]


class HashEmbedder:
    """Unit vectors seeded by each text's SHA-256: equal texts embed equally, at no model cost."""

    model_id = "hash-sha256"

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        rows = [np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")).standard_normal(self.dim) for t in texts]
        vectors = np.asarray(rows, np.float32).reshape(len(texts), self.dim)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-12)


def sessions_of(writer: str, count: int, turns: int) -> list[dict[str, Any]]:
    """``count`` distinct sessions of ``turns`` turns: the writer's trips, so its units link into traces."""
    return [
        {
            "time": f"2024-{1 + k % 12:02d}-{1 + k % 28:02d}",
            "turns": [
                {"speaker": writer if i % 2 == 0 else "Assistant", "text": f"I went to the {PLACES[(k + i) % len(PLACES)]} on trip {k} of {writer}, day {i}."}
                for i in range(turns)
            ],
        }
        for k in range(count)
    ]


def _config() -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.models.device, cfg.construction.units, cfg.construction.traces = "cpu", "turns", True
    return cfg


def _embedder(kind: str):
    if kind == "hash":
        return HashEmbedder()
    from qgmem_train.llm.embedder import Embedder

    return Embedder(BUNDLED_EMBEDDER, device="cpu")


def add_sessions(store_dir: str, plan: list[tuple[str, dict[str, Any]]], embedder_kind: str, ready: Any, go: Any, done: Any) -> None:
    """Writer process: load the embedder, wait for the start signal, add every (namespace, session) of ``plan``."""
    embedder = _embedder(embedder_kind)
    embedder.encode(["warm up"])
    cfg = _config()
    ready.put(1)
    go.wait()
    started = time.perf_counter()
    traces = Counter()
    with MemoryStore.open(store_dir, create=True) as store:
        for namespace, session in plan:
            session_id = session_fingerprint(session["turns"], session["time"])
            turns = [Turn(f"{session_id}:{n}", t["speaker"], t["text"]) for n, t in enumerate(session["turns"], start=1)]
            report = build_conversation(store, Conversation(namespace, [Session(session_id, session["time"], turns)]), cfg, embedder, namespace=namespace)
            traces["updated" if report.traces_updated else "deferred" if report.traces_deferred else "already current"] += 1
    done.put((time.perf_counter() - started, dict(traces)))


def run_writers(store_dir: Path, plans: list[list[tuple[str, dict[str, Any]]]], embedder_kind: str) -> dict[str, Any]:
    """Start one process per plan, release them together, and time them until the last one has finished."""
    ctx = multiprocessing.get_context("spawn")
    ready, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    MemoryStore.open(store_dir, create=True).close()
    procs = [ctx.Process(target=add_sessions, args=(str(store_dir), plan, embedder_kind, ready, go, done)) for plan in plans]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=600)
    started = time.perf_counter()
    go.set()
    finished = [done.get(timeout=7200) for _ in procs]
    wall = time.perf_counter() - started
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"writer process exited with {proc.exitcode}")
    sessions = sum(map(len, plans))
    consolidations = sum((Counter(counts) for _, counts in finished), Counter())
    return {
        "processes": len(procs), "sessions": sessions, "wall_s": round(wall, 2), "process_s": [round(s, 2) for s, _ in finished],
        "sessions_per_s": round(sessions / wall, 2), "trace_consolidations": dict(consolidations),
    }  # fmt: skip


def check_once(store_dir: Path, plans: list[list[tuple[str, dict[str, Any]]]]) -> dict[str, Any]:
    """Each planned session stored exactly once per namespace, turn positions distinct, one unit per turn, traces current."""
    expected: dict[str, Counter] = {}
    for plan in plans:
        for namespace, session in plan:
            sid = session_fingerprint(session["turns"], session["time"])
            expected.setdefault(namespace, Counter()).update((sid, t["text"]) for t in session["turns"])
    problems: list[str] = []
    with MemoryStore.open(store_dir) as store:
        for namespace, want in expected.items():
            rows = store._db.execute("SELECT session_id, text, position FROM turns WHERE namespace = ?", (namespace,)).fetchall()
            got = Counter((r[0], r[1]) for r in rows)
            if got != want:
                problems.append(f"{namespace}: {sum((got - want).values())} extra, {sum((want - got).values())} missing turns")
            if sorted(r[2] for r in rows) != list(range(len(rows))):
                problems.append(f"{namespace}: turn positions not distinct")
            if store.count_units(namespace) != sum(want.values()):
                problems.append(f"{namespace}: {store.count_units(namespace)} units for {sum(want.values())} turns")
            if store.traces_stale(namespace):
                problems.append(f"{namespace}: traces stale")
        sessions = {n: len({sid for sid, _ in want}) for n, want in expected.items()}
        traces = {n: store.count_traces(n) for n in expected}
    return {"exactly_once": not problems, "problems": problems, "sessions_per_namespace": sessions, "traces_per_namespace": traces}


def measure(layout: str, writers: list[str], per_writer: int, turns: int, embedder_kind: str, repeats: int, workdir: Path) -> dict[str, Any]:
    """The writers at once, and one process adding the same sessions one plan after another, each into a fresh store,
    ``repeats`` times in alternating order (a load that drifts during the run then weighs on both)."""
    sessions = {w: sessions_of(w, per_writer, turns) for w in writers}
    plans = [[("shared" if layout == "shared" else f"own-{w}", s) for s in sessions[w]] for w in writers]
    modes = {"sequential": [[item for plan in plans for item in plan]], "concurrent": plans}
    runs = []
    for repeat in range(repeats):
        for mode in sorted(modes, reverse=repeat % 2 == 1):
            store_dir = workdir / f"{layout}-{mode}-{repeat}"
            run = {"mode": mode, "repeat": repeat, **run_writers(store_dir, modes[mode], embedder_kind)}
            run["check"] = check_once(store_dir, plans)
            shutil.rmtree(store_dir, ignore_errors=True)
            runs.append(run)
    median = {mode: statistics.median(r["wall_s"] for r in runs if r["mode"] == mode) for mode in modes}
    return {"layout": layout, "runs": runs, "median_wall_s": median, "concurrent_over_sequential_wall": round(median["concurrent"] / median["sequential"], 2)}


def markdown(results: dict[str, Any]) -> str:
    """The results as a short markdown report."""
    m, s = results["machine"], results["settings"]
    lines = [
        "# Concurrent store writers",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}; Python {m['python']}; load average {m.get('load_average_1m')} at the start.",
        f"{s['writers']} writer processes × {s['sessions_per_writer']} sessions of {s['turns_per_session']} turns each; "
        f"units: turns mode; traces: rule trajectory (no LLM); embedder: {s['embedder']}.",
        "",
        "| layout | repeat | mode | processes | sessions | wall s | sessions/s | consolidations run / left to the other writer / not needed | each session once |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for layout in results["layouts"]:
        for r in layout["runs"]:
            c = r["trace_consolidations"]
            once = "yes" if r["check"]["exactly_once"] else "NO: " + "; ".join(r["check"]["problems"])
            counts = f"{c.get('updated', 0)} / {c.get('deferred', 0)} / {c.get('already current', 0)}"
            lines.append(
                f"| {layout['layout']} | {r['repeat'] + 1} | {r['mode']} | {r['processes']} | {r['sessions']} | {r['wall_s']} | {r['sessions_per_s']} | {counts} | {once} |"
            )
    lines.append("")
    for layout in results["layouts"]:
        median = layout["median_wall_s"]
        lines.append(
            f"- {layout['layout']}: median concurrent wall / median sequential wall = **{layout['concurrent_over_sequential_wall']}** "
            f"({median['concurrent']:.1f} s / {median['sequential']:.1f} s)"
        )
    lines += ["", results["note"], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run both layouts, write bench/results/store_writers.{json,md}, print the markdown."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writers", type=int, default=2, help="concurrent writer processes")
    p.add_argument("--sessions", type=int, default=200, help="sessions each writer adds")
    p.add_argument("--turns", type=int, default=4, help="turns per session")
    p.add_argument("--embedder", choices=("hash", "minilm"), default="hash", help="hash: no model (the store's own cost); minilm: the bundled embedder")
    p.add_argument("--repeats", type=int, default=1, help="measurements of each mode, alternating which runs first")
    p.add_argument("--layouts", nargs="+", choices=("shared", "own"), default=["shared", "own"], help="shared: all writers into one namespace; own: one namespace each")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results folder")
    args = p.parse_args(argv)
    writers = [f"Writer{i + 1}" for i in range(args.writers)]
    embedder = "SHA-256-seeded unit vectors (hash-sha256, 384-d, no model)" if args.embedder == "hash" else f"{BUNDLED_EMBEDDER} (CPU)"
    results: dict[str, Any] = {
        "machine": machine_info(),
        "settings": {"writers": args.writers, "sessions_per_writer": args.sessions, "turns_per_session": args.turns, "embedder": embedder, "repeats": args.repeats},
    }
    workdir = Path(tempfile.mkdtemp(prefix="qgmem-writers-"))
    try:
        results["layouts"] = [measure(layout, writers, args.sessions, args.turns, args.embedder, args.repeats, workdir) for layout in args.layouts]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["note"] = (
        "Wall time runs from releasing the already started writers to the last one finishing, so model loading and process start are "
        "left out. Writes take the store's one write lock in turn, so concurrency gains only the work done outside it (embedding, "
        "clustering). Each session re-consolidates its namespace's traces (a read of the whole namespace), so a shared namespace costs "
        "more per session as it grows; with two writers in one namespace most consolidations are overtaken by the other writer's units "
        "and left to it (computed, then not stored), and the last writer's consolidation covers every session."
    )
    write_report_atomic(args.out / "store_writers.json", results, markdown(results))
    print(markdown(results))
    return 0 if all(r["check"]["exactly_once"] for layout in results["layouts"] for r in layout["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
