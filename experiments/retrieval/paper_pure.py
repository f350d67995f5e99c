"""Paper-pure retrieval versus ours on LoCoMo in turns mode: every project addition off, on, and each one switched alone.

Each row is the fused working memory of ``eval retrieval`` (rule-based intents, no reranker) with the
retrieval switches of one variant; the store is built once, in turns mode with sentence vectors, so
``retrieval.sentence_vectors`` decides at query time whether the dense channel reads them. The traces
switch (``retrieval.drop_superseded``) is not measured: turns-mode stores have no traces.

    python -m experiments.retrieval.paper_pure --store /tmp/locomo_turns --conversations conv-26,conv-30,conv-41
Default input: ../shared/data/locomo/locomo_dev.json when present; pass --input for another copy. The store
is built (or extended) in turns mode for the conversations evaluated: all of the input's, or ``--conversations``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from qgmem_train.reports import machine_info, remake_reports, write_report
from experiments.retrieval.channels import KEYS, check_locomo, locomo_parser, run_eval
from qgmem_train.fileio import read_text, write_json_atomic
from qgmem_train.reranker.data import ensure_turns_store

PAPER_VALUES = {
    "sentence_vectors": False,
    "lexical_context_turns": 0,
    "subject_entities": False,
    "attr_tiebreak": False,
    "utterance_day_fallback": False,
}
"""Each retrieval addition and its paper value (off)."""
OUR_VALUES = {"sentence_vectors": True, "lexical_context_turns": 1, "subject_entities": True, "attr_tiebreak": True, "utterance_day_fallback": True}
"""Each retrieval addition and our default (on)."""


def variants() -> dict[str, dict[str, object]]:
    """Retrieval settings of every measured variant: ours, paper-pure, each addition alone off (ours) and alone on (paper)."""
    rows: dict[str, dict[str, object]] = {"ours (every addition on)": OUR_VALUES, "paper-pure (every addition off)": PAPER_VALUES}
    rows |= {f"ours without {name}": OUR_VALUES | {name: value} for name, value in PAPER_VALUES.items()}
    rows |= {f"paper-pure with {name}": PAPER_VALUES | {name: OUR_VALUES[name]} for name in PAPER_VALUES}
    return rows


def conversation_subset(input_path: Path, conversations: str | None, work: Path) -> Path:
    """``input_path`` itself, or a copy under ``work`` holding only the comma-separated ``conversations``."""
    if not conversations:
        return input_path
    wanted = conversations.split(",")
    samples = [s for s in json.loads(read_text(input_path)) if s.get("sample_id") in wanted]
    if len(samples) != len(wanted):
        raise SystemExit(f"{input_path} lacks some of the conversations {conversations}")
    subset = work / "locomo_subset.json"
    write_json_atomic(subset, samples)
    return subset


def main(argv: list[str] | None = None) -> int:
    """Build the turns-mode store if needed, evaluate every variant, write experiments/retrieval/results/paper_pure_retrieval.{json,md}
    (or remake saved reports: --report-only)."""
    parser = locomo_parser("python -m experiments.retrieval.paper_pure", __doc__.split("\n\n")[0], "/tmp/paper_pure_retrieval")
    parser.add_argument("--conversations", help="comma-separated sample ids to evaluate (default: every conversation of the input)")
    args = parser.parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown, args.check)
    check_locomo(parser, args)
    args.work.mkdir(parents=True, exist_ok=True)
    source = conversation_subset(args.input, args.conversations, args.work)
    ensure_turns_store(source, args.store)
    rows, n_questions, commit = {}, 0, None
    for number, (name, retrieval) in enumerate(variants().items()):
        metrics = run_eval(source, args.store, args.work / f"v{number}", "none", None, retrieval)
        rows[name] = {"retrieval": retrieval, "seconds": metrics["seconds"]} | {key: round(metrics[f"fused/{key}"], 4) for key in KEYS}
        n_questions, commit = metrics["n_questions"], metrics["commit"]
    report = {"input": str(args.input), "conversations": args.conversations or "all", "units": "turns", "intent_parser": "rules",
              "reranker": "none", "n_questions": n_questions, "commit": commit, "machine": machine_info(), "variants": rows}
    write_report(args.out / "paper_pure_retrieval.json", report, markdown)
    return 0


def markdown(report: dict) -> str:
    """The Markdown table of a report: one row of fused metrics per variant."""
    machine = report["machine"]
    lines = [f"# Paper-pure retrieval versus ours (LoCoMo {Path(report['input']).name}, conversations: {report['conversations']}; "
             f"turns mode, {report['n_questions']} questions)", "",
             f"Machine: {machine['cpu']}, {machine['cores']} cores. Fused working memory (RRF of BM25, dense and attributes; "
             "rule-based intents, no reranker), bundled MiniLM embedder. Switches: `retrieval.sentence_vectors`, "
             "`lexical_context_turns`, `subject_entities`, `attr_tiebreak`, `utterance_day_fallback` (README, \"Paper-pure "
             "settings and our additions\").", "",
             "| variant | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{row[key]:.3f}" for key in KEYS) + " |" for name, row in report["variants"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
