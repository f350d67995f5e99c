"""Typed output schemas of every LLM stage; generation is constrained to their JSON schema."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Triple(_Strict):
    subject: str
    predicate: str
    object: str


class ExtractedUnit(_Strict):
    start_turn: str
    end_turn: str
    fact_text: str
    triple: Triple


class ExtractionOutput(_Strict):
    """Stage 1 (memory-unit extraction prompt)."""

    memory_units: list[ExtractedUnit]


def extraction_schema(turn_ids: list[str]) -> type[ExtractionOutput]:
    """Stage-1 schema whose start/end turns are an enum of the window's source ids."""
    turn = Literal[tuple(turn_ids)]  # type: ignore[valid-type]
    unit = create_model("WindowUnit", __base__=ExtractedUnit, start_turn=(turn, ...), end_turn=(turn, ...))
    return create_model("WindowExtraction", __base__=ExtractionOutput, memory_units=(list[unit], ...))


class TimeItem(_Strict):
    start: str
    end: str
    granularity: Literal["day", "week", "month", "year"]


class UnitIndex(_Strict):
    memory_unit_id: str
    entities: list[str] = Field(default_factory=list)
    locations: list[str] = Field(default_factory=list)
    time: list[TimeItem] = Field(default_factory=list)


class IndexOutput(_Strict):
    """Stage 2 (retrieval-index prompt)."""

    memory_units: list[UnitIndex]


def index_schema(unit_ids: list[str]) -> type[IndexOutput]:
    """Stage-2 schema whose ``memory_unit_id`` is an enum of the batch's unit ids."""
    uid = Literal[tuple(unit_ids)]  # type: ignore[valid-type]
    unit = create_model("BatchUnitIndex", __base__=UnitIndex, memory_unit_id=(uid, ...))
    return create_model("BatchIndex", __base__=IndexOutput, memory_units=(list[unit], ...))


class TrajectoryOutput(_Strict):
    """Trace consolidation prompt."""

    trajectory: str


class IntentTime(_Strict):
    fact: list[str] = Field(default_factory=list)
    utterance: list[str] = Field(default_factory=list)


class IntentOutput(_Strict):
    """Query intent parsing prompt."""

    entities: list[str] = Field(default_factory=list)
    locations: list[str] = Field(default_factory=list)
    time: IntentTime = Field(default_factory=IntentTime)


class AnswerOutput(_Strict):
    """Final answer prompt; field order is the paper's (reasoning first)."""

    reasoning_path: str
    answer: str


class JudgeOutput(_Strict):
    """LoCoMo judge prompt."""

    judgment: Literal["correct", "incorrect"]
    reason: str


class NuggetJudgeOutput(_Strict):
    """BEAM rubric-nugget judge: 1 fully satisfied, 0.5 partly, 0 not."""

    score: Literal[0, 0.5, 1]
    reason: str
