"""Reports of answer evaluations: a Markdown summary and PNG figures a person can read at a glance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qgmem_train.eval.plots import accuracy_bars_figure, close, cost_per_question_figure
from qgmem_train.fileio import atomic_output


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "" if value is None else str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; floats with four decimals."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def per_type_scores(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``judge_accuracy/<type>`` entries of a metrics dict, keyed by type."""
    prefix = "judge_accuracy/"
    return {key[len(prefix) :]: value for key, value in metrics.items() if key.startswith(prefix) and value is not None}


def answers_markdown(metrics: Mapping[str, Any]) -> str:
    """Summary of one ``eval answers`` run: overall score, per type/ability, cost per question, models and settings.

    Token F1, BLEU-1 and exact match appear where the metrics have them (runs before they existed do not).
    """
    text_metrics = [("token F1", "f1"), ("BLEU-1", "bleu1"), ("exact match", "exact_match")]
    overall = [
        ("judge accuracy (mean ± std over repeats)", f"{metrics['judge_accuracy']:.4f} ± {metrics['judge_std']:.4f}"),
        *[(label, metrics[key]) for label, key in text_metrics if key in metrics],
        ("questions", metrics["n_questions"]),
        ("repeats", metrics["repeats"]),
        ("mean retrieved-context tokens", metrics["mean_context_tokens"]),
        ("mean online tokens", metrics["mean_online_tokens"]),
        ("mean seconds per question", metrics["mean_seconds"]),
    ]
    if metrics.get("beam_nugget_score") is not None:
        overall.insert(1, ("BEAM nugget score (nine abilities)", metrics["beam_nugget_score"]))
        overall.insert(2, ("BEAM event ordering (normalised tau_b)", metrics.get("beam_event_ordering_tau_b")))
    types = per_type_scores(metrics)
    shown = [(label, key) for label, key in text_metrics if key in metrics]
    per_type = [(t, v, *[metrics.get(f"{key}/{t}") for _, key in shown], metrics.get(f"n_questions/{t}")) for t, v in types.items()]
    parts = [
        f"# Answer evaluation: {metrics['benchmark']} ({metrics['input']})",
        markdown_table(["metric", "value"], overall),
        "## Per question type / ability",
        markdown_table(["type", "judge accuracy", *[label for label, _ in shown], "questions"], per_type),
        "## Models and settings",
        markdown_table(["setting", "value"], [(k, v) for k, v in {**metrics["models"], **metrics["settings"]}.items() if not isinstance(v, dict)]),
        "Figures: `accuracy_by_type.png`, `cost_per_question.png`.",
    ]
    return "\n\n".join(parts) + "\n"


def write_answer_figures(out: Path, metrics: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[Path]:
    """Per type/ability accuracy bars and per-question latency/tokens, as PNG files in ``out``."""
    paths = []
    figures = {
        "accuracy_by_type.png": accuracy_bars_figure(per_type_scores(metrics), title=f"{metrics['benchmark']}: judge accuracy by type"),
        "cost_per_question.png": cost_per_question_figure(
            [r["seconds"] for r in records],
            {"context": [r["context_tokens"] for r in records], "online": [r["online_tokens"] for r in records]},
            title=f"{metrics['benchmark']}: cost per question ({len(records)} questions)",
        ),
    }
    for name, figure in figures.items():
        with atomic_output(out / name, "wb") as handle:
            figure.savefig(handle, format="png")
        close(figure)
        paths.append(out / name)
    return paths


def ablations_markdown(benchmark: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """Side-by-side table of ablation variants: accuracy ± std, delta to the full pipeline, cost, or what a skipped one needs."""
    full = next((r for r in rows if r["variant"] == "full" and r.get("judge_accuracy") is not None), None)
    table = []
    for r in rows:
        if r.get("judge_accuracy") is None:
            table.append((r["variant"], r["description"], "", "", "", "", "", r.get("skipped", "")))
            continue
        delta = r["judge_accuracy"] - full["judge_accuracy"] if full else None
        table.append((r["variant"], r["description"], f"{r['judge_accuracy']:.4f} ± {r['judge_std']:.4f}",
                      None if delta is None else round(delta, 4), r.get("f1"), r["mean_context_tokens"], r["mean_seconds"], ""))
    header = ["variant", "change", "judge accuracy", "Δ vs full", "token F1", "context tokens", "seconds/q", "skipped"]
    return f"# Ablations on {benchmark}\n\n" + markdown_table(header, table) + "\n"
