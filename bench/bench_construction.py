"""Memory-construction benchmark: LLM extraction batched vs sequential, bytes per unit, 100k-unit bulk load.

Run ``python bench/bench_construction.py --help``. Results go to bench/results/construction.{json,md}.
The data default is ../shared/data/locomo/locomo_dev.json when present, else the committed sample
samples/locomo_sample.json (pass --data for another LoCoMo-format file).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from qgmem_train.reports import machine_info

import numpy as np

from qgmem_train.config import PipelineConfig
from qgmem_train.llm.factory import build_embedder, build_llm
from qgmem_train.llm.structured import ParseStats
from qgmem_train.memory.construct import build_conversation
from qgmem_train.memory.extraction import extract_windows
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.store import STORE_FILE, EmbeddedUnit, MemoryStore, WindowResult
from qgmem_train.memory.types import MemoryUnit, TimeSpan
from qgmem_train.memory.windows import session_windows

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
SAMPLE = ROOT / "samples" / "locomo_sample.json"


def bench_extraction(data: Path, n_windows: int, max_new_tokens: int, cfg: PipelineConfig) -> dict[str, object]:
    """Both LLM stages over the first ``n_windows`` windows: one batched call vs one window at a time."""
    conv = load_conversations("locomo", data)[0]
    windows = [w for s in conv.sessions for w in session_windows(s, cfg.construction.window, cfg.construction.overlap)][:n_windows]
    positions = {t.id: i for i, t in enumerate(t for s in conv.sessions for t in s.turns)}
    cfg.generation.max_new_tokens = max_new_tokens
    cfg.generation.batch_size = n_windows
    llm = build_llm(cfg)
    out: dict[str, object] = {"llm": llm.model_id, "windows": len(windows), "max_new_tokens": max_new_tokens, "constrained": llm.supports_schema}
    for mode in ("sequential", "batched"):
        stats = ParseStats()
        started = time.perf_counter()
        if mode == "batched":
            results = extract_windows(llm, windows, positions, cfg, stats)
        else:
            results = [r for w in windows for r in extract_windows(llm, [w], positions, cfg, stats)]
        seconds = time.perf_counter() - started
        out[mode] = {
            "seconds": round(seconds, 2),
            "windows_per_s": round(len(windows) / seconds, 4),
            "units": sum(len(u) for u, _ in results),
            "dropped": sum(d for _, d in results),
            "parse": stats.as_dict(),
        }
    out["batched_over_sequential"] = round(out["batched"]["windows_per_s"] / out["sequential"]["windows_per_s"], 2)
    return out


def store_bytes(path: Path) -> int:
    """Bytes of the store's database files."""
    return sum(f.stat().st_size for f in path.glob(STORE_FILE + "*"))


def bench_bytes_per_unit(data: Path, cfg: PipelineConfig, workdir: Path) -> dict[str, object]:
    """Turns-mode build of the first conversation (no traces): store bytes per unit."""
    conv = load_conversations("locomo", data)[0]
    cfg.construction.units = "turns"
    cfg.construction.traces = False
    embedder = build_embedder(cfg)
    path = workdir / "turns"
    started = time.perf_counter()
    with MemoryStore.open(path, create=True) as store:
        report = build_conversation(store, conv, cfg, embedder)
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        attributes = len(store.load_namespace(conv.id).attributes.texts)
    size = store_bytes(path)
    return {
        "conversation": conv.id, "units": report.units, "attributes": attributes, "dim": embedder.dim,
        "bytes": size, "bytes_per_unit": round(size / report.units), "build_seconds": round(time.perf_counter() - started, 2),
        "turns_mode_units_per_s": round(report.units / report.seconds, 1),
    }  # fmt: skip


def bench_bulk_load(n_units: int, dim: int, workdir: Path, repeats: int = 3) -> dict[str, object]:
    """Write ``n_units`` synthetic units (random unit vectors, 2 attributes each), then time ``load_namespace``."""
    rng = np.random.default_rng(0)
    path = workdir / "bulk"
    chunk = 5000
    started = time.perf_counter()
    with MemoryStore.open(path, create=True) as store:
        store.ensure_namespace("synthetic", "turns", "random", dim)
        for lo in range(0, n_units, chunk):
            vectors = rng.standard_normal((4 * min(chunk, n_units - lo), dim)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            items = []
            for k, i in enumerate(range(lo, min(n_units, lo + chunk))):
                unit = MemoryUnit(
                    f"u{i}", f"s{i // 100}", f"Person {i % 97} did thing {i} at place {i % 13}.", f"Person {i % 97}", "did", f"thing {i}",
                    [f"t{i}"], f"Person {i % 97}: I did thing {i}.", "2024-01-01", i,
                    fact_time=[TimeSpan("2023-12-31", "2023-12-31", "day")], entities=[f"thing {i}"], locations=[f"place {i % 13}"],
                )  # fmt: skip
                items.append(EmbeddedUnit(unit, vectors[4 * k], vectors[4 * k + 1], vectors[4 * k + 2:4 * k + 4]))
            store.add_windows("synthetic", [WindowResult(f"s{lo}", 0, items)])
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    write_seconds = time.perf_counter() - started
    times, cpu_times = [], []
    for _ in range(repeats):
        with MemoryStore.open(path) as store:
            started, cpu_started = time.perf_counter(), time.process_time()
            memory = store.load_namespace("synthetic")
            times.append(time.perf_counter() - started)
            cpu_times.append(time.process_time() - cpu_started)
        assert len(memory.units) == n_units and memory.fact_embeddings.shape == (n_units, dim)
    size = store_bytes(path)
    return {
        "units": n_units, "dim": dim, "attributes_per_unit": 2, "write_seconds": round(write_seconds, 1),
        "load_seconds_median": round(statistics.median(times), 3), "load_seconds_all": [round(t, 3) for t in times],
        "load_cpu_seconds_median": round(statistics.median(cpu_times), 3),
        "bytes": size, "bytes_per_unit": round(size / n_units),
    }  # fmt: skip


def markdown(results: dict[str, object]) -> str:
    """The results as a short markdown report."""
    m, e, b, bulk = results["machine"], results["extraction"], results["bytes_per_unit"], results["bulk_load"]
    lines = [
        "# Memory construction benchmark",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}; Python {m['python']}. Data: `{results['data']}`.",
        "",
        f"## LLM extraction ({e['llm']}, {e['windows']} windows, stage 1 + stage 2, max_new_tokens {e['max_new_tokens']}, constrained {e['constrained']})",
        "| mode | seconds | windows/s | units kept | outputs dropped |",
        "|---|---|---|---|---|",
    ]
    for mode in ("sequential", "batched"):
        r = e[mode]
        lines.append(f"| {mode} | {r['seconds']} | {r['windows_per_s']} | {r['units']} | {r['dropped']} |")
    lines += [
        f"\nBatched over sequential: **{e['batched_over_sequential']}x** windows/s (same process, same windows, side by side).",
        "",
        f"## Bytes on disk ({b['conversation']}, turns mode, {b['dim']}-d)",
        f"{b['units']} units, {b['attributes']} attributes: {b['bytes']:,} bytes, **{b['bytes_per_unit']:,} bytes per unit** "
        f"(turns-mode build {b['build_seconds']} s, {b['turns_mode_units_per_s']} units/s).",
        "",
        f"## Bulk load of a {bulk['units']:,}-unit namespace ({bulk['dim']}-d, {bulk['attributes_per_unit']} attributes a unit)",
        f"`load_namespace`: **{bulk['load_seconds_median']} s** wall (median of {bulk['load_seconds_all']}), "
        f"{bulk.get('load_cpu_seconds_median', 'n/a')} s CPU; store {bulk['bytes']:,} bytes "
        f"({bulk['bytes_per_unit']:,} a unit); written in {bulk['write_seconds']} s.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements, write bench/results/construction.{json,md}, print the markdown."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=SHARED if SHARED.exists() else SAMPLE, help="LoCoMo-format JSON (default: %(default)s)")
    p.add_argument("--windows", type=int, default=3, help="windows for the LLM throughput measurement")
    p.add_argument("--max-new-tokens", type=int, default=96, help="generation budget per LLM call")
    p.add_argument("--bulk-units", type=int, default=100_000, help="units in the synthetic bulk-load namespace")
    p.add_argument("--skip-llm", action="store_true", help="skip the LLM throughput measurement")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results folder")
    args = p.parse_args(argv)
    results: dict[str, object] = {"machine": machine_info(), "data": str(args.data)}
    workdir = Path(tempfile.mkdtemp(prefix="qgmem-bench-"))
    try:
        if not args.skip_llm:
            results["extraction"] = bench_extraction(args.data, args.windows, args.max_new_tokens, PipelineConfig())
        results["bytes_per_unit"] = bench_bytes_per_unit(args.data, PipelineConfig(), workdir)
        results["bulk_load"] = bench_bulk_load(args.bulk_units, results["bytes_per_unit"]["dim"], workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "construction.json").write_text(json.dumps(results, indent=2) + "\n")
    if "extraction" in results:
        report = markdown(results)
        (args.out / "construction.md").write_text(report)
        print(report)
    else:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
