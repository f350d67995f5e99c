"""Whether a model reads its graphs: the shuffle gap, the loss with another example's graph minus the loss with its own.

A model that uses what its graph says loses more when given the graph of another question; tokens that act as one
learned prompt for every question lose nothing. Each example's donor is another question of the same conversation
where there is one (the harder control: the same people and topics, another question's facts), else another lone
question. The gap is the mean per-example difference of the mean token loss, in nats a target token, with a 95%
Student-t interval over the examples.

The verdict needs more than an interval that excludes 0: the loss pass is deterministic, so with enough examples even
tokens that collapsed into one prompt show a gap that is "significant" and meaningless (0.0002 to 0.0015 nats in
``experiments/graph_token/results/graph_token.md``, token cosine 0.99999). A gap counts as read only when its whole interval lies above
a noise floor (``model.diagnostics.shuffle_floor``, default :data:`DEFAULT_FLOOR`, several times the largest collapsed gap
measured), and as nothing when its whole interval lies below it; in between, the split is too small to tell.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_FLOOR = 0.01
"""Nats a target token below which a shuffle gap means nothing: about 7x the largest gap of collapsed tokens measured."""


def graph_donors(case_ids: Sequence[str], seed: int = 0) -> list[int | None]:
    """For each example (by its case id, i.e. conversation), the index of the example whose graph it is given.

    Within a case of two or more examples: a seeded random cycle (each example takes the next one's graph, the last the
    first's), the same derangement as the shuffled-graph test of ``experiments/graph_token/arms.py``. The lone examples
    of their cases form one more cycle among themselves; a single lone example takes a seeded other example's graph.
    ``None`` only when the split has one example.
    """
    by_case: dict[str, list[int]] = defaultdict(list)
    for i, case_id in enumerate(case_ids):
        by_case[case_id].append(i)
    donors: list[int | None] = [None] * len(case_ids)
    alone = sorted(members[0] for members in by_case.values() if len(members) == 1)
    cycles = [(f"shuffle:{seed}:{case_id}", members) for case_id, members in sorted(by_case.items()) if len(members) > 1]
    if len(alone) > 1:
        cycles.append((f"shuffle:{seed}:", alone))
    for key, members in cycles:
        order = list(members)
        random.Random(key).shuffle(order)
        for i, j in zip(order, order[1:] + order[:1]):
            donors[i] = j
    if len(alone) == 1 and len(case_ids) > 1:
        lone = alone[0]
        donors[lone] = random.Random(f"shuffle:{seed}:").choice([i for i in range(len(case_ids)) if i != lone])
    return donors


def shuffle_gap_summary(differences: Sequence[float]) -> dict[str, Any]:
    """The mean of per-example ``shuffled - own`` losses with its 95% t interval (``None`` bounds for one example)."""
    from scipy.stats import t

    n = len(differences)
    mean = statistics.fmean(differences)
    low = high = None
    if n > 1:
        half = float(t.ppf(0.975, n - 1)) * statistics.stdev(differences) / n**0.5
        low, high = mean - half, mean + half
    return {"shuffle_gap": mean, "shuffle_gap_low": low, "shuffle_gap_high": high, "examples": n}


def graph_reading_line(reading: Mapping[str, Any] | None) -> str:
    """One line saying what a validation's shuffle gap and token cosine mean (the last line of ``fit``, the model card's)."""
    if reading is None:
        return "graph reading: no validation ran, so whether the model reads its graphs is unknown"
    if "skipped" in reading:
        return f"graph reading: not measured ({reading['skipped']})"
    gap, low, high, floor = reading["shuffle_gap"], reading["shuffle_gap_low"], reading["shuffle_gap_high"], reading["floor"]
    interval = f"[{low:+.4f}, {high:+.4f}]" if low is not None and high is not None else "(no interval)"
    cosine = reading.get("token_cosine")
    figures = f"shuffle gap {gap:+.4f} nats a token, 95% interval {interval} over {reading['examples']} validation examples" + (
        f"; graph-token cosine {cosine:.4f}" if cosine is not None else ""
    )
    if low is not None and low > floor:
        return f"graph reading: graph tokens carry {gap:.3f} nats a token the model uses ({figures})"
    if high is not None and high < floor:
        return f"graph reading: the model reads nothing from its graphs: the tokens act as a learned prompt ({figures}; floor {floor} nats)"
    return f"graph reading: undecided, the interval reaches the {floor}-nat floor: validate on more examples ({figures})"
