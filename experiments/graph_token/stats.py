"""Statistics of the graph-token study: per-arm means over seeds, per-category F1, and the paired comparisons of each
arm with its controls (a bootstrap over questions, and a t interval over seeds)."""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

from qgmem_train.reports import paired_bootstrap, seed_interval
from experiments.graph_token.arms import CENTERED_ARMS, GRAPH_ARMS, Variant, variants

METRICS = ("test_answer_loss", "test_loss", "json_valid", "f1", "bleu1", "exact_match")
"""Per-run test metrics, in table order."""


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def per_question(runs: list[dict[str, Any]], field: str) -> dict[str, float]:
    """``field`` (``f1``, ``answer_loss``) per test question id, averaged over the runs (seeds)."""
    scores: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for record in run["predictions"]:
            if field in record:  # answers are scored on a subset of the test questions (--max-f1-questions)
                scores[record["question_id"]].append(float(record[field]))
    return {qid: statistics.fmean(v) for qid, v in scores.items()}


def comparisons(arms: dict[str, Variant]) -> list[tuple[str, str]]:
    """``(arm, control)`` pairs the report bootstraps: each graph design against its soft prompt, its shuffled graphs and no
    graph; LoRA + a design against LoRA alone and its shuffled graphs; the text path against no graph."""
    pairs = [(key, f"{key}{suffix}") for key in GRAPH_ARMS for suffix in ("-soft", "-shuffled")]
    pairs += [(key, "none") for key in GRAPH_ARMS]
    pairs += [(f"{key}-centered", control) for key in CENTERED_ARMS for control in (f"{key}-soft", f"{key}-centered-shuffled", key, "none")]
    pairs += [(key, control) for key in arms if key.startswith("lora+") and arms[key].trained for control in ("lora", f"{key}-shuffled")]
    return pairs + [("text", "none")]


def summarize(runs: dict[str, list[dict[str, Any]]], questions: dict[str, dict[str, str]], args: argparse.Namespace) -> dict[str, Any]:
    """Per-variant means ± std over seeds, per-category F1, graph-token diagnostics, and the paired bootstraps of :func:`comparisons`
    (F1, and answer-span loss) over the seeds both arms ran (a shuffled test of seed 0 is not paired with seed 1's
    training), also seed by seed where both ran several."""
    out: dict[str, Any] = {"variants": {}, "bootstrap": {}}
    for key, done in runs.items():
        if not done:
            continue
        row: dict[str, Any] = {"name": done[0]["name"], "seeds": [r["seed"] for r in done], "steps": done[0]["steps"]}
        for metric in METRICS:
            mean, std = mean_std([r[metric] for r in done])
            row[metric] = {"mean": mean, "std": std}
        by_category: dict[str, list[float]] = defaultdict(list)
        for qid, f1 in per_question(done, "f1").items():
            by_category[questions[qid]["category"]].append(f1)
        row["f1_per_category"] = {c: {"mean": statistics.fmean(v), "questions": len(v)} for c, v in sorted(by_category.items())}
        row["runs"] = [{k: v for k, v in r.items() if k not in ("predictions",)} for r in done]
        for name in ("graph_token_cosine", "graph_token_between_variance_ratio"):
            values = [r[name] for r in done if r.get(name) is not None]
            if values:
                row[name] = statistics.fmean(values)
        out["variants"][key] = row
    out["bootstrap_answer_loss"], out["seeds"], out["seeds_answer_loss"] = {}, {}, {}
    for arm, control in comparisons(variants(args.edge_tokens, args.query_tokens, args.lora_readout)):
        if runs.get(arm) and runs.get(control):
            pair = f"{arm} - {control}"
            common = sorted({r["seed"] for r in runs[arm]} & {r["seed"] for r in runs[control]})
            paired = {k: [r for r in runs[k] if r["seed"] in common] or runs[k] for k in (arm, control)}
            for key, seeds_key, field, better, worse in (("bootstrap", "seeds", "f1", arm, control),
                                                          ("bootstrap_answer_loss", "seeds_answer_loss", "answer_loss", control, arm)):  # fmt: skip
                boot = paired_bootstrap(
                    per_question(paired[better], field), per_question(paired[worse], field), args.bootstrap_resamples, args.bootstrap_seed
                )
                out[key][pair] = {**boot, "training_seeds": common or None}
                seeded = per_seed_differences(runs[better], runs[worse], field, args)
                if seeded is not None:
                    out[seeds_key][pair] = seeded
    return out


def per_seed_differences(first: list[dict[str, Any]], second: list[dict[str, Any]], field: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """``first - second`` in ``field`` seed by seed (each a question bootstrap) and over the seeds both have (a t interval),
    or None under two such seeds: a difference seen in one training run may not come back in the next."""
    by_seed = {r["seed"]: r for r in second}
    pairs = [(r, by_seed[r["seed"]]) for r in sorted(first, key=lambda r: r["seed"]) if r["seed"] in by_seed]
    if len(pairs) < 2:
        return None
    rows = [
        {"training_seed": a["seed"], **paired_bootstrap(per_question([a], field), per_question([b], field), args.bootstrap_resamples, args.bootstrap_seed)}
        for a, b in pairs
    ]
    return {"per_seed": rows, **seed_interval([row["mean_difference"] for row in rows])}
