"""Run every benchmark of bench/ with quick defaults and write one report, bench/results/REPORT.md (``make bench``).

Each script runs in its own process with the quick arguments below, writing its own results under
``--out`` (default bench/results/quick/, so the committed full-size results stay untouched; ``--full``
runs the scripts' own defaults into bench/results/); REPORT.md gathers their status, time and tables. A script whose input is missing is listed as
skipped with what it needs; a script added to bench/ without quick arguments runs with its defaults.

    python -m bench.run_all                 # quick: minutes on 2 cores
    python -m bench.run_all --only bench_llm bench_construction
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from qgmem_train.reports import machine_info

from qgmem_train.fileio import atomic_output

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
HELPERS = {"__init__", "run_all", "gpu_report", "gpu_standins", "gpu_prefix_timing"}
"""Modules of bench/ that are not benchmarks (the GPU check's own modules included)."""
GPU_ONLY = "needs CUDA: run scripts/gpu_check.sh on a GPU machine"


def quick_arguments(out: Path, work: Path, model: Path | None) -> dict[str, list[str] | str]:
    """Quick arguments per script (a string: why it is skipped). ``out`` is the results folder of this run."""
    return {
        "bench_activation": ["--sizes", "10000", "--queries", "20", "--out", str(out)],
        "bench_construction": ["--windows", "1", "--bulk-units", "10000", "--out", str(out)],
        "bench_store_writers": ["--sessions", "20", "--out", str(out)],
        "bench_namespace_index": ["--runs", "1", "--rounds", "2", "--work", str(work / "namespace_index"), "--out", str(out / "namespace_index.json")],
        "bench_llm": ["--prompts", "4", "--max-new-tokens", "16", "--out", str(out / "llm.json")],
        "bench_prefix_cache": ["--quick", "--out", str(out / "prefix_cache.json")],
        "bench_prefix_gqa": ["--prefix", "64", "--after", "32", "--rounds", "1", "--out", str(out / "prefix_gqa.json")],
        "bench_training": ["--train-steps", "4", "--timing-steps", "2", "--sections", "timing,validation,ablations", "--out", str(out / "training.json")],
        "bench_predictor": ["--model", str(model), "--questions", "2", "--out", str(out / "predictor")] if model else
                           "needs --model EXPORT_DIR (an exported model: python -m qgmem_train export ...)",
        "gpu_check": GPU_ONLY,
    }  # fmt: skip


def full_arguments(out: Path, work: Path, model: Path | None) -> dict[str, list[str] | str]:
    """The scripts' own defaults; only required inputs are given."""
    return {
        "bench_predictor": ["--model", str(model)] if model else "needs --model EXPORT_DIR",
        "gpu_check": GPU_ONLY,
    }


def shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (so a committed report holds no machine paths)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def written_markdown(out: Path, since: float) -> list[Path]:
    """Markdown results written under ``out`` since ``since`` (what one script produced)."""
    return sorted(p for p in out.rglob("*.md") if p.name != "REPORT.md" and p.stat().st_mtime >= since)


def main() -> int:
    """Run the benchmarks one after another; REPORT.md gathers each one's status, time and markdown result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the scripts' own (full-size) defaults, results into bench/results/")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these scripts (names without .py)")
    parser.add_argument("--model", type=Path, help="exported model folder for bench_predictor")
    parser.add_argument("--work", type=Path, default=Path("/tmp/qgmem_bench"), help="scratch folder for stores and intermediate reports")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds allowed per script")
    parser.add_argument("--out", type=Path, help="results folder (default: bench/results/quick, or bench/results with --full)")
    parser.add_argument("--report", type=Path, default=BENCH / "results" / "REPORT.md", help="the one report (default: %(default)s)")
    args = parser.parse_args()

    out = args.out or (BENCH / "results" if args.full else BENCH / "results" / "quick")
    out.mkdir(parents=True, exist_ok=True)
    plan = (full_arguments if args.full else quick_arguments)(out, args.work, args.model)
    scripts = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in HELPERS)
    unknown = sorted(set(args.only or []) - set(scripts))
    if unknown:
        print(f"error: --only {unknown[0]}: no bench/{unknown[0]}.py", file=sys.stderr)
        return 2
    machine = machine_info()
    rows, sections = [], []
    for name in args.only or scripts:
        arguments = plan.get(name, [])
        if isinstance(arguments, str):
            rows.append((name, "skipped", "", arguments))
            continue
        command = [sys.executable, "-m", f"bench.{name}", *arguments]
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        started, wall = time.time(), time.perf_counter()
        try:
            result = subprocess.run(command, cwd=ROOT, timeout=args.timeout, capture_output=True, text=True)
            status = "ok" if result.returncode == 0 else f"failed (exit {result.returncode})"
            detail = "" if result.returncode == 0 else (result.stderr.strip().splitlines() or ["no output"])[-1][:200]
        except subprocess.TimeoutExpired:
            status, detail = f"timed out after {args.timeout} s", ""
        seconds = round(time.perf_counter() - wall, 1)
        print(f"   {status} in {seconds} s {detail}", flush=True)
        rows.append((name, status, seconds, detail))
        for path in written_markdown(out, started):
            sections.append(f"## {name}: {path.relative_to(out)}\n\n{path.read_text().strip()}\n")

    header = [
        "# Benchmark report",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, load average {machine.get('load_average_1m')} at the start. "
        f"Mode: {'full' if args.full else 'quick'} (`python bench/run_all.py{' --full' if args.full else ''}`); results in `{shown(out)}`.",
        "",
        "| script | status | seconds | note |",
        "|---|---|---|---|",
        *[f"| {n} | {s} | {t} | {d} |" for n, s, t, d in rows],
        "",
    ]
    report = "\n".join(header) + "\n" + "\n".join(sections)
    with atomic_output(args.report) as handle:
        handle.write(report)
    print(f"wrote {args.report}")
    return 0 if all(s in ("ok", "skipped") for _, s, _, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
