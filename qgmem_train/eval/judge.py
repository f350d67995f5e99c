"""LLM-as-judge with the paper's judge prompts, repeated R times, majority and mean ± std."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from qgmem_train.llm.base import ChatLLM
from qgmem_train.llm.prompts import LOCOMO_JUDGE
from qgmem_train.llm.schemas import JudgeOutput
from qgmem_train.llm.structured import ParseStats, generate_structured


@dataclass
class JudgeItem:
    """One prediction to judge against its reference answer."""

    question: str
    reference: str
    prediction: str


@dataclass
class Verdict:
    """R judgments of one prediction; a dropped (unparseable) judgment counts as incorrect."""

    judgments: list[bool]
    reasons: list[str] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        """Strict majority of the R judgments."""
        return sum(self.judgments) * 2 > len(self.judgments)


def judge(
    llm: ChatLLM, items: Sequence[JudgeItem], *, repeats: int = 1, max_new_tokens: int = 128, stats: ParseStats | None = None
) -> list[Verdict]:
    """Judge every item ``repeats`` times with the LoCoMo judge prompt (batched over items)."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    chats = [
        LOCOMO_JUDGE.render(question=i.question, reference_answer=i.reference, model_prediction=i.prediction) for i in items
    ]
    verdicts = [Verdict(judgments=[]) for _ in items]
    for _ in range(repeats):
        outputs = generate_structured(llm, chats, JudgeOutput, max_new_tokens=max_new_tokens, stats=stats)
        for verdict, out in zip(verdicts, outputs):
            verdict.judgments.append(out is not None and out.judgment == "correct")
            verdict.reasons.append(out.reason if out is not None else "judge output dropped")
    return verdicts


def accuracy_mean_std(verdicts: Sequence[Verdict]) -> tuple[float, float]:
    """Accuracy of each repeat over all items, then mean and (population) std across repeats."""
    if not verdicts:
        return 0.0, 0.0
    repeats = len(verdicts[0].judgments)
    per_repeat = [sum(v.judgments[r] for v in verdicts) / len(verdicts) for r in range(repeats)]
    return statistics.fmean(per_repeat), statistics.pstdev(per_repeat)
