"""Figures of evaluation reports (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def recall_curves_figure(curves: Mapping[str, Sequence[float]], ks: Sequence[int], *, title: str) -> Figure:
    """Recall@k against k, one line per ranking (channels, fused, reranked)."""
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, values in curves.items():
        axes.plot(list(ks), list(values), marker="o", markersize=3, label=name)
    axes.set_xlabel("k (units)")
    axes.set_ylabel("Recall@k")
    axes.set_xticks(list(ks))
    axes.set_ylim(0, 1)
    axes.grid(alpha=0.3)
    axes.set_title(title)
    axes.legend(loc="lower right")
    figure.tight_layout()
    return figure


def accuracy_bars_figure(scores: Mapping[str, float], *, title: str, ylabel: str = "judge accuracy") -> Figure:
    """One bar per question type, ability or variant, labelled with its value (0-1 scale)."""
    figure, axes = plt.subplots(figsize=(max(5.0, 0.8 * len(scores) + 2), 4.5), dpi=120)
    names = list(scores)
    bars = axes.bar(range(len(names)), [scores[n] for n in names], color="#4C72B0")
    axes.bar_label(bars, labels=[f"{scores[n]:.2f}" for n in names], fontsize=8)
    axes.set_xticks(range(len(names)), names, rotation=30, ha="right")
    axes.set_ylim(0, 1.05)
    axes.set_ylabel(ylabel)
    axes.grid(axis="y", alpha=0.3)
    axes.set_title(title)
    figure.tight_layout()
    return figure


def cost_per_question_figure(seconds: Sequence[float], tokens: Mapping[str, Sequence[int]], *, title: str) -> Figure:
    """Per-question latency (left) and token counts (right, one box per kind: context, online)."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 4), dpi=120)
    left.boxplot([list(seconds)], tick_labels=["seconds"], showmeans=True)
    left.set_ylim(bottom=0)
    left.set_ylabel("seconds per question")
    left.grid(axis="y", alpha=0.3)
    right.boxplot([list(v) for v in tokens.values()], tick_labels=list(tokens), showmeans=True)
    right.set_ylim(bottom=0)
    right.set_ylabel("tokens per question")
    right.grid(axis="y", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def close(figure: Figure) -> None:
    """Release a figure's memory once saved."""
    plt.close(figure)
