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


def close(figure: Figure) -> None:
    """Release a figure's memory once saved."""
    plt.close(figure)
