"""Answer quality of the configured pipeline on the four benchmark formats, side by side in one run.

For each benchmark: write its histories as plain JSONL, build a turns-mode store (no LLM extraction),
then ``eval answers`` on an evenly spaced subset of questions with the judge repeated R times. The
defaults use the committed samples and hand-made fixtures (LoCoMo sample, BEAM chat-1 sample,
LongMemEval-S and FactConsolidation fixtures), so it runs on a fresh clone; pass --locomo/--beam/...
for the full data. With the bundled SmolLM2-135M the figures check the harness, not the method.

    python -m experiments.answer_quality --limit 3 --repeats 2
    python -m experiments.answer_quality --report-only experiments/answer_quality/results/answer_quality.json   # remake its markdown
Writes experiments/answer_quality/results/answer_quality.{json,md} and prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from qgmem_train.reports import add_report_options, machine_info, remake_reports, write_report
from qgmem_train.__main__ import main as cli

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_INPUTS = {
    "locomo": ROOT / "samples" / "locomo_sample.json",
    "beam": ROOT / "samples" / "beam" / "1",
    "longmemeval": ROOT / "tests" / "data" / "longmemeval_s_tiny.json",
    "factconsolidation": ROOT / "tests" / "data" / "factconsolidation_tiny.json",
}
KEYS = ("n_questions", "judge_accuracy", "judge_std", "mean_context_tokens", "mean_online_tokens", "mean_seconds")


def run_benchmark(name: str, source: Path, work: Path, config: Path, limit: int, repeats: int, intent: str) -> dict[str, object]:
    """Histories → turns store → eval answers; the run's metrics.json."""
    conversations = work / f"{name}.jsonl"
    store = work / f"{name}_store"
    out = work / f"{name}_answers"
    steps = [
        ["eval", "conversations", "--benchmark", name, "--input", str(source), "--out", str(conversations)],
        ["build", "--dataset", "jsonl", "--input", str(conversations), "--store", str(store), "--units", "turns", "--config", str(config)],
        ["eval", "answers", "--benchmark", name, "--input", str(source), "--store", str(store), "--out", str(out), "--config", str(config),
         "--limit", str(limit), "--repeats", str(repeats), "--reranker", "none", "--intent", intent],
    ]  # fmt: skip
    for step in steps:
        if cli(step) != 0:
            raise SystemExit(f"step failed: {' '.join(step)}")
    return json.loads((out / "metrics.json").read_text())


def markdown(report: dict) -> str:
    """The report's table: one row a benchmark."""
    machine, settings = report["machine"], report["settings"]
    lines = [
        "# Answer quality (eval answers), turns-mode stores",
        f"Machine: {machine['cpu']}, {machine['cores']} cores (load average {machine.get('load_average_1m')} at the start). "
        f"LLM and judge: {settings['llm_and_judge']}; k={settings['k']}, max_new_tokens={settings['max_new_tokens']}, intent={settings['intent']}, no reranker.",
        "",
        "| benchmark | questions | judge accuracy (mean ± std, R=%d) | context tokens/q | online tokens/q | seconds/q |" % settings["repeats"],
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {r['n_questions']} | {r['judge_accuracy']:.3f} ± {r['judge_std']:.3f} | {r['mean_context_tokens']:.0f} | "
              f"{r['mean_online_tokens']:.0f} | {r['mean_seconds']:.1f} |" for n, r in report["benchmarks"].items()]  # fmt: skip
    lines += ["", f"Total {report['seconds']} s. Per-question records and figures: {report.get('work', '<work>')}/<benchmark>_answers/."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark, write experiments/answer_quality/results/answer_quality.{json,md}, print the table (or remake
    saved reports: --report-only)."""
    parser = argparse.ArgumentParser(prog="python -m experiments.answer_quality", description=__doc__.split("\n\n")[0])
    for name, path in DEFAULT_INPUTS.items():
        parser.add_argument(f"--{name}", type=Path, default=path, help=f"{name} input (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=3, help="questions per benchmark, evenly spaced")
    parser.add_argument("--repeats", type=int, default=2, help="judge repeats (paper: 10)")
    parser.add_argument("--k", type=int, default=5, help="working-memory budget (paper: retrieval.k)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="answer and judge budget")
    parser.add_argument("--intent", choices=["llm", "rules"], default="rules", help="query-intent parser")
    parser.add_argument("--work", type=Path, default=Path("/tmp/answer_quality"), help="folder for stores and per-benchmark reports")
    add_report_options(parser, Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown, args.check)

    args.work.mkdir(parents=True, exist_ok=True)
    config = args.work / "turns.yaml"
    config.write_text(f"pipeline:\n  construction:\n    units: turns\n    traces: false\n  retrieval:\n    k: {args.k}\n"
                      f"  generation:\n    max_new_tokens: {args.max_new_tokens}\n")  # fmt: skip
    machine = machine_info()
    started = time.perf_counter()
    rows = {}
    for name in DEFAULT_INPUTS:
        metrics = run_benchmark(name, getattr(args, name), args.work, config, args.limit, args.repeats, args.intent)
        rows[name] = {key: metrics[key] for key in KEYS} | {"input": metrics["input"], "per_type": {k: v for k, v in metrics.items() if k.startswith("judge_accuracy/")}}
    report = {
        "machine": machine,
        "settings": {"limit": args.limit, "repeats": args.repeats, "k": args.k, "max_new_tokens": args.max_new_tokens, "intent": args.intent,
                     "units": "turns", "reranker": "none", "llm_and_judge": metrics["models"]["llm"]},
        "benchmarks": rows, "seconds": round(time.perf_counter() - started, 1), "work": str(args.work),
    }  # fmt: skip
    write_report(args.out / "answer_quality.json", report, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
