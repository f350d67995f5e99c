"""Whether a model reads its graphs: the shuffle gap, the loss with another example's graph minus the loss with its own.

A model that uses what its graph says loses more when given the graph of another question; tokens that act as one
learned prompt for every question lose nothing. Each example's donor is another question of the same conversation
where there is one (the harder control: the same people and topics, another question's facts), else another lone
question. The gap is the mean per-example difference of the mean token loss, in nats a token, measured twice: on the
answer field's tokens (``answer_shuffle_gap``, the figure the verdict reads) and on the whole target (``shuffle_gap``),
whose reasoning path and JSON are formulaic and dilute it. Each has a 95% percentile bootstrap interval that resamples
conversations, not examples: a conversation's examples share people, facts and their donor cycle, so their differences
are not independent and a per-example interval would be too narrow.

The verdict needs more than an interval that excludes 0: the loss pass is deterministic, so with enough examples even
tokens that collapsed into one prompt show a gap that is "significant" and meaningless (0.0002 to 0.0015 nats in
``experiments/graph_token/results/graph_token.md``, token cosine 0.99999). A gap counts as read only when its whole interval lies above
a noise floor (``model.diagnostics.shuffle_floor``, default :data:`DEFAULT_FLOOR`, several times the largest collapsed gap
measured), and as nothing when its whole interval lies below it; in between, the split is too small to tell.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
"""Conversation resamples behind each shuffle-gap interval."""
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


def conversation_interval(case_ids: Sequence[str], differences: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """The mean of per-example differences with a 95% percentile bootstrap interval over conversations (``case_ids``).

    Each resample draws the conversations with replacement and averages all their examples' differences, so the donor
    cycle inside a conversation stays whole; lone questions (conversations of one) share one cycle across conversations,
    a dependence this does not resample. Examples whose difference is not a number (an empty answer span) are left out.
    ``None`` bounds with fewer than two conversations.
    """
    kept = [(case, d) for case, d in zip(case_ids, differences) if math.isfinite(d)]
    cases = sorted({case for case, _ in kept})
    if not kept:
        return {"mean": None, "low": None, "high": None, "examples": 0, "conversations": 0}
    row = {case: i for i, case in enumerate(cases)}
    sums, counts = np.zeros(len(cases)), np.zeros(len(cases))
    for case, d in kept:
        sums[row[case]] += d
        counts[row[case]] += 1
    low = high = None
    if len(cases) > 1:
        picks = np.random.default_rng(seed).integers(0, len(cases), size=(resamples, len(cases)))
        low, high = (float(x) for x in np.percentile(sums[picks].sum(1) / counts[picks].sum(1), [2.5, 97.5]))
    return {"mean": float(sums.sum() / counts.sum()), "low": low, "high": high, "examples": len(kept), "conversations": len(cases)}


def shuffle_gap_summary(case_ids: Sequence[str], whole: Sequence[float], answer: Sequence[float]) -> dict[str, Any]:
    """The shuffle gap on the whole target (``shuffle_gap``, ``_low``, ``_high``) and on the answer span (``answer_shuffle_gap``,
    ...) from per-example ``shuffled - own`` losses, with their :func:`conversation_interval` and how many examples and
    conversations each counts."""
    reading: dict[str, Any] = {}
    for prefix, differences in (("", whole), ("answer_", answer)):
        got = conversation_interval(case_ids, differences)
        reading |= {f"{prefix}shuffle_gap": got["mean"], f"{prefix}shuffle_gap_low": got["low"], f"{prefix}shuffle_gap_high": got["high"]}
        reading |= {f"{prefix}examples": got["examples"], f"{prefix}conversations": got["conversations"]}
    return reading


def graph_reading_line(reading: Mapping[str, Any] | None) -> str:
    """One line saying what a validation's shuffle gap and token cosine mean (the last line of ``fit``, the model card's).

    The verdict reads the answer span's gap where the reading has one (a checkpoint written before it has the whole
    target's only)."""
    if reading is None:
        return "graph reading: no validation ran, so whether the model reads its graphs is unknown"
    cosine = reading.get("token_cosine")
    cosine_text = f"graph-token cosine {cosine:.4f} (centred)" if cosine is not None else ""
    if "skipped" in reading:
        return f"graph reading: not measured ({reading['skipped']})" + (f"; {cosine_text}" if cosine_text else "")
    answer = reading.get("answer_shuffle_gap") is not None
    prefix = "answer_" if answer else ""
    floor = reading["floor"]
    gap, low, high = (reading[f"{prefix}shuffle_gap{end}"] for end in ("", "_low", "_high"))

    def figure(key: str, what: str) -> str:
        low, high = reading[f"{key}_low"], reading[f"{key}_high"]
        interval = f"[{low:+.4f}, {high:+.4f}]" if low is not None and high is not None else "(no interval)"
        return f"{what} {reading[key]:+.4f} nats a token, 95% interval {interval}"

    parts = [figure("answer_shuffle_gap", "shuffle gap on the answer")] if answer else []
    parts.append(figure("shuffle_gap", "on the whole target" if answer else "shuffle gap"))
    counted = f"over {reading[f'{prefix}examples']} validation examples" + (
        f" of {reading[f'{prefix}conversations']} conversations" if reading.get(f"{prefix}conversations") else ""
    )
    figures = ", ".join(parts) + f", {counted}" + (f"; {cosine_text}" if cosine_text else "")
    if low is not None and low > floor:
        return f"graph reading: graph tokens carry {gap:.3f} nats {'an answer' if answer else 'a'} token the model uses ({figures})"
    if high is not None and high < floor:
        return f"graph reading: the model reads nothing from its graphs: the tokens act as a learned prompt ({figures}; floor {floor} nats)"
    return f"graph reading: undecided, the interval reaches the {floor}-nat floor: validate on more examples ({figures})"
