"""Step 0's decomposition across runs: saved prompt losses of several step folders (the question alone, retrieved and
oracle contexts, each graph representation under oracle retrieval, ...) set side by side with paired intervals.

    python -m experiments.graph_token.decomposition --out experiments/graph_token/results/step0_decomposition \\
        --part question=out/graph_token/information/losses-question.json \\
        --part oracle-context=out/graph_token/information/losses-context-oracle.json \\
        --compare question:oracle-context --split out/graph_token/data/split.json

Each ``--part KEY=FILE`` is a ``losses-<prompt>.json`` written by :mod:`experiments.graph_token.information` (with the
settings that made it); each ``--compare CONTROL:TREATMENT`` is the control's loss minus the treatment's (above 0: the
treatment makes the answer likelier), paired over questions, overall and per category (``--split``). Every part must hold
the same questions; a part that does not, or a file that is not a saved part, is one line and exit 2. Nothing is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from qgmem_train.errors import InputError
from qgmem_train.reports import add_report_options, commit_text, git_state, machine_info, machine_text, paired_bootstrap, remake_reports, write_report


def read_part(key: str, file: Path) -> dict[str, Any]:
    """One saved prompt's answer-span losses per question with the settings and wall time it was measured under."""
    try:
        record = json.loads(file.read_text())
        losses = {q: float(v["answer_loss"]) for q, v in record["losses"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(str(file), f"not a saved step-0 part ({type(exc).__name__}: {exc})") from exc
    settings = record.get("settings") or {}
    return {"key": key, "source": str(file), "losses": losses, "mean": sum(losses.values()) / len(losses), "wall_s": record.get("wall_s"),
            "prompt": settings.get("prompt"), "retrieval": settings.get("retrieval"), "units": settings.get("units"),
            "graph": settings.get("graph"), "llm": settings.get("llm"), "data": settings.get("data")}  # fmt: skip


def decomposition(parts: list[dict[str, Any]], pairs: list[tuple[str, str]], categories: dict[str, str], resamples: int, seed: int) -> dict[str, Any]:
    """The parts' mean losses and each pair's paired difference (overall and per category); parts must share questions."""
    by_key = {part["key"]: part for part in parts}
    first = parts[0]
    for part in parts[1:]:
        if set(part["losses"]) != set(first["losses"]):
            raise InputError(part["source"], f"holds other questions than {first['source']} ({len(part['losses'])} against {len(first['losses'])})")
    unknown = sorted({key for pair in pairs for key in pair} - set(by_key))
    if unknown:
        raise InputError("--compare", f"names no --part: {', '.join(unknown)}")
    comparisons = []
    for control, treatment in pairs:
        a, b = by_key[control]["losses"], by_key[treatment]["losses"]
        within = {}
        for category in sorted({categories[q] for q in a if q in categories}):
            ids = [q for q in a if categories.get(q) == category]
            boot = paired_bootstrap({q: a[q] for q in ids}, {q: b[q] for q in ids}, resamples, seed)
            within[category] = {k: boot[k] for k in ("questions", "mean_difference", "ci95")}
        comparisons.append({"control": control, "treatment": treatment, **paired_bootstrap(a, b, resamples, seed), "per_category": within})
    return {"questions": len(first["losses"]), "parts": [{k: v for k, v in p.items() if k != "losses"} for p in parts], "comparisons": comparisons}


def markdown(result: dict[str, Any]) -> str:
    """results.md: the parts, the paired differences, the same per category, the notes, the commit and machine."""
    lines = [f"# {result['title']}", "", f"{result['questions']} test questions, answer-span loss in nats a token; nothing measured "
             "here: each part is a saved `losses-<prompt>.json` with the settings that made it.", ""]  # fmt: skip
    lines += ["| part | prompt | retrieval | units | graph | loss | wall time (s) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {p['key']} | {p['prompt']} | {p['retrieval']} | {p['units']} | {p['graph']} | {p['mean']:.3f} | {p['wall_s']} |" for p in result["parts"]]
    lines += ["", "Loss of the control minus loss of the treatment (above 0: the treatment makes the answer likelier), paired bootstrap "
              "95% interval over questions:", "", "| control | treatment | difference | 95% interval |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {c['control']} | {c['treatment']} | {c['mean_difference']:+.3f} | [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] |"
              for c in result["comparisons"]]  # fmt: skip
    categories = sorted({k for c in result["comparisons"] for k in c["per_category"]})
    if categories:
        lines += ["", "The same within each question category:", "",
                  "| control − treatment | " + " | ".join(categories) + " |", "|---|" + "---|" * len(categories)]  # fmt: skip
        for c in result["comparisons"]:
            cells = [c["per_category"].get(k) for k in categories]
            lines.append(f"| {c['control']} − {c['treatment']} | " + " | ".join(
                f"{x['mean_difference']:+.3f} [{x['ci95'][0]:+.3f}, {x['ci95'][1]:+.3f}] ({x['questions']} q)" if x else "" for x in cells) + " |")  # fmt: skip
    lines += ["", *[f"{note}\n" for note in result["notes"]]]
    lines += ["Sources: " + "; ".join(f"{p['key']}: `{p['source']}`" for p in result["parts"]) + ".", "",
              f"Commit: {commit_text(result['git'])}. Machine: {machine_text(result['machine'])} (the report; each part's wall time "
              "is its own run's).", ""]  # fmt: skip
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.graph_token.decomposition", description=__doc__.split("\n\n")[0])
    add_report_options(p, Path("out/graph_token/decomposition"), "results")
    p.add_argument("--part", action="append", default=[], metavar="KEY=FILE", help="a saved losses-<prompt>.json under a short key")
    p.add_argument("--compare", action="append", default=[], metavar="CONTROL:TREATMENT", help="a paired difference of two parts' keys")
    p.add_argument("--split", type=Path, default=None, help="the study's data/split.json (question categories)")
    p.add_argument("--title", default="Graph-token study, step 0: the decomposition")
    p.add_argument("--note", action="append", default=[], help="a paragraph of reading printed under the tables")
    p.add_argument("--bootstrap-resamples", type=int, default=2000)
    p.add_argument("--bootstrap-seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    """Set the saved parts side by side; bad input is one line and exit 2."""
    args = parser().parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown, args.check)
    try:
        specs = [spec.split("=", 1) for spec in args.part]
        pairs = [tuple(spec.split(":", 1)) for spec in args.compare]
        if not specs or any(len(s) != 2 for s in specs) or any(len(p) != 2 for p in pairs):
            raise InputError("--part/--compare", "give at least one --part KEY=FILE and each --compare as CONTROL:TREATMENT")
        categories = {}
        if args.split is not None:
            try:
                categories = {q: v["category"] for q, v in json.loads(args.split.read_text())["questions"].items()}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise InputError(str(args.split), f"not the study's split.json ({type(exc).__name__})") from exc
        found = decomposition([read_part(k, Path(f)) for k, f in specs], pairs, categories, args.bootstrap_resamples, args.bootstrap_seed)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = {"title": args.title, **found, "notes": args.note, "machine": machine_info(), "git": git_state()}
    write_report(args.out / f"{args.report}.json", report, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
