"""BEAM scoring: rubric nuggets judged one by one, and event ordering by normalised Kendall tau_b.

The nine nugget abilities score the mean over a question's rubric nuggets of the judge's 0 / 0.5 / 1
(:data:`~qgmem_train.llm.prompts.BEAM_NUGGET_JUDGE`, one call per nugget; a dropped judge output scores
0). Event ordering locates each reference item in the answer and compares the order found with the
reference order by Kendall tau_b, mapped to [0, 1] as (tau_b + 1) / 2; an answer that names none of
the items scores 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from scipy.stats import kendalltau

from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.prompts import BEAM_NUGGET_JUDGE
from qgmem_train.llm.schemas import NuggetJudgeOutput
from qgmem_train.llm.structured import ParseStats, generate_structured

EVENT_ORDERING = "event_ordering"
NUGGET_MAX_NEW_TOKENS = 128
_WORD = re.compile(r"[a-z0-9]+")
_SEGMENT = re.compile(r"(?:\n+|(?<=[.;])\s+|\s+(?=\d+[.)]\s))")
_ORDINAL_PREFIX = re.compile(r"^\s*\d+(?:st|nd|rd|th)?\s*[:.)]\s*", re.I)
_STOP = frozenset("a an and the of to in on for with my i you your is was were be it that this by as at from".split())


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def ordering_positions(items: Sequence[str], prediction: str) -> list[int | None]:
    """Position of each reference item in ``prediction``: the segment (line, sentence or list entry) sharing most words; None if none."""
    segments = [s for s in _SEGMENT.split(prediction) if s and s.strip()]
    seg_words = [_words(s) for s in segments]
    positions = []
    for item in items:
        wanted = _words(_ORDINAL_PREFIX.sub("", item))
        overlaps = [len(wanted & words) / max(1, len(wanted)) for words in seg_words]
        best = max(range(len(overlaps)), key=overlaps.__getitem__, default=None)
        positions.append(best if best is not None and overlaps[best] > 0 else None)
    return positions


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall tau_b of two rankings; 0 when undefined (fewer than two items, or one ranking all tied)."""
    if len(x) < 2:
        return 0.0
    tau = kendalltau(x, y, variant="b").statistic
    return 0.0 if tau is None or math.isnan(tau) else float(tau)


def event_ordering_score(items: Sequence[str], prediction: str) -> float:
    """(tau_b + 1) / 2 between the reference order of ``items`` and the order they appear in ``prediction``.

    Items not found are tied after the last found one; an answer naming none of them scores 0.
    """
    positions = ordering_positions(items, prediction)
    found = [p for p in positions if p is not None]
    if not found:
        return 0.0
    ranks = [p if p is not None else max(found) + 1 for p in positions]
    return (kendall_tau_b(list(range(len(items))), ranks) + 1) / 2


def nugget_scores(
    llm: ChatLLM, question: str, nuggets: Sequence[str], prediction: str, *, repeats: int, stats: ParseStats | None = None
) -> tuple[list[float], list[str]]:
    """Mean nugget score (0 / 0.5 / 1 each) of ``prediction``, once per repeat, and the first repeat's reasons."""
    chats = [BEAM_NUGGET_JUDGE.render(question=question, nugget=nugget, answer=prediction) for nugget in nuggets]
    per_repeat: list[float] = []
    reasons: list[str] = []
    for r in range(repeats):
        outputs = generate_structured(llm, chats, NuggetJudgeOutput, max_new_tokens=NUGGET_MAX_NEW_TOKENS, stats=stats)
        per_repeat.append(sum(float(o.score) if o is not None else 0.0 for o in outputs) / len(chats))
        if r == 0:
            reasons = [f"{nugget}: {o.score} {o.reason}" if o is not None else f"{nugget}: judge output dropped" for nugget, o in zip(nuggets, outputs)]
    return per_repeat, reasons
