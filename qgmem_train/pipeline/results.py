"""What a search and an answer return (``PredictorMemory.search`` and ``ask``, ``serve``): the answer, the working memory
behind it, token counts and timings, and :func:`ask_record`, the JSON object ``ask --json`` prints and ``serve`` returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from qgmem_train.terminal import shown


@dataclass
class SourceTurn:
    """A dialogue turn a memory unit came from."""

    id: str
    speaker: str | None
    text: str | None
    time: str | None


@dataclass
class EvidenceUnit:
    """One working-memory unit: its label in the prompt, its fact, score, and source turns."""

    id: str
    label: str
    fact_text: str
    score: float
    cited: bool
    source_turns: list[SourceTurn]


@dataclass
class AskResult:
    """The answer to one question, the evidence behind it, token counts and seconds per stage."""

    question: str
    question_time: str | None
    answer: str | None
    """``None`` when the model's output was not a valid answer JSON."""
    reasoning_path: str | None
    generated: str
    """The model's raw output."""
    path: Literal["graph", "text"]
    """Graph tokens (local backbone) or text path (API backbone)."""
    units: list[EvidenceUnit]
    """The working memory, best first; ``cited`` marks units the reasoning path names."""
    tokens: dict[str, int] = field(default_factory=dict)
    """``context`` (serialized memory), ``prompt`` (what the LLM read, graph tokens included), ``generated``."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds per stage: memory load, activation steps, serialization, graph, generation (the question's share of its
    batch's call), total."""

    @property
    def cited(self) -> list[EvidenceUnit]:
        """The units the reasoning path cites, in working-memory order."""
        return [u for u in self.units if u.cited]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return asdict(self)

    def render(self) -> str:
        """Answer, reasoning and evidence (the cited units, else the whole working memory) with source turns; stored and
        generated text is shown with its control, bidi and line-separator characters escaped (:func:`~qgmem_train.terminal.shown`)."""
        lines = [f"answer: {shown(self.answer)}" if self.answer is not None else "answer: (the model gave no valid answer)"]
        if self.reasoning_path is not None:
            lines.append(f"reasoning: {shown(self.reasoning_path)}")
        evidence = self.cited or self.units
        kind = "cited units" if self.cited else "working memory (nothing cited)"
        lines.append(f"\n{kind} ({len(evidence)} of {len(self.units)} units, {self.tokens.get('context', 0)} context tokens, {self.path} path):")
        for unit in evidence:
            lines.append(f"[{shown(unit.label)}] {shown(unit.fact_text)}")
            for turn in unit.source_turns:
                text = f"{shown(turn.speaker)}: {shown(turn.text)}" if turn.text is not None else "(turn not in store)"
                lines.append(f"    {shown(turn.id)} ({shown(turn.time or 'time unknown')}) {text}")
        return "\n".join(lines)


@dataclass
class SearchResult:
    """The working memory for one question and its MEMORY_CONTEXT, as an LLM of the caller's would read it."""

    question: str
    question_time: str | None
    memory_context: str
    """The serialized working memory (the final-answer prompt's MEMORY_CONTEXT, units labelled MU#/F#)."""
    units: list[EvidenceUnit]
    """The working memory, best first (``cited`` is false: nothing answered)."""
    tokens: dict[str, int] = field(default_factory=dict)
    """``context``: tokens of ``memory_context``."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds per stage: memory load, activation steps, serialization, total."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return asdict(self)


def ask_record(result: AskResult) -> dict[str, Any]:
    """The JSON object of an answer: every field of the result (``units`` is the working memory) plus ``cited``, the cited units."""
    return {**result.to_dict(), "cited": [asdict(unit) for unit in result.cited]}
