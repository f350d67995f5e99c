"""Request and response bodies of ``serve``: they make its OpenAPI schema, and the ask response is ``ask --json``'s object."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
"""A namespace in a URL: letters, digits and ``. _ : @ -``, at most 128 characters."""


class Strict(BaseModel):
    """Unknown fields are refused, not ignored: a misspelt field should not silently do nothing."""

    model_config = ConfigDict(extra="forbid")


class TurnIn(Strict):
    id: str | None = Field(None, min_length=1, max_length=256, description="turn id (default: <session_id>:<n>)")
    speaker: str = Field(min_length=1, max_length=256)
    text: str = Field(min_length=1)


class SessionIn(Strict):
    turns: list[TurnIn] = Field(min_length=1)
    time: str | None = Field(None, max_length=64, description="the session's date (ISO or a recognised date format)")
    session_id: str | None = Field(
        None, min_length=1, max_length=256, description="default: a fingerprint of the turns and time, so a retried call stores the session once"
    )


class SessionOut(BaseModel):
    namespace: str
    session_id: str
    units: int
    windows_built: int
    dropped: int
    seconds: float


class QuestionIn(Strict):
    question: str = Field(min_length=1)
    time: str | None = Field(None, max_length=64, description="when the question is asked (ISO date); resolves relative expressions")


class SourceTurnOut(BaseModel):
    id: str
    speaker: str | None
    text: str | None
    time: str | None


class EvidenceUnitOut(BaseModel):
    id: str
    label: str
    fact_text: str
    score: float
    cited: bool
    source_turns: list[SourceTurnOut]


class SearchOut(BaseModel):
    question: str
    question_time: str | None
    memory_context: str = Field(description="the working memory serialized as the answer prompt's MEMORY_CONTEXT")
    units: list[EvidenceUnitOut]
    tokens: dict[str, int]
    seconds: dict[str, float]


class AskOut(BaseModel):
    """The object ``python -m qgmem_train ask --json`` prints."""

    question: str
    question_time: str | None
    answer: str | None
    reasoning_path: str | None
    generated: str
    path: Literal["graph", "text"]
    units: list[EvidenceUnitOut]
    tokens: dict[str, int]
    seconds: dict[str, float]
    cited: list[EvidenceUnitOut]


class UnitOut(BaseModel):
    id: str
    fact_text: str
    source_turn_ids: list[str]


class MemoryOut(BaseModel):
    namespace: str
    units_total: int
    offset: int
    units: list[UnitOut]
    sessions: list[str]


class NamespacesOut(BaseModel):
    namespaces: list[str]


class HealthOut(BaseModel):
    status: Literal["ok"]
    path: Literal["graph", "text"]


class ErrorOut(BaseModel):
    error: str = Field(description="one line: where, and what is wrong")
