"""Request and response bodies of ``serve``: they make its OpenAPI schema, and the ask response is ``ask --json``'s object."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from qgmem_train.pipeline.results import AskResult, EvidenceUnit, SearchResult

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


class TurnsIn(Strict):
    turns: list[TurnIn] = Field(min_length=1, description="turns appended to the session, in order; they take its date")


class SessionOut(BaseModel):
    namespace: str
    session_id: str
    turns_total: int = Field(description="the session's turns now stored")
    units: int
    windows_built: int
    dropped: int
    seconds: float


class AddAccepted(BaseModel):
    add_id: str
    status_url: str = Field(description="GET it for the add's state")


class AddStatus(BaseModel):
    add_id: str
    namespace: str
    session_id: str | None
    state: Literal["queued", "running", "done", "failed"]
    result: SessionOut | None = Field(description="the synchronous add's answer, once done")
    status: int | None = Field(description="the HTTP status the synchronous add would have answered, once failed")
    error: str | None = Field(description="its one-line error, once failed")


class QuestionIn(Strict):
    question: str = Field(min_length=1)
    time: str | None = Field(None, max_length=64, description="when the question is asked (ISO date); resolves relative expressions")


class SearchIn(QuestionIn):
    top_k: int | None = Field(None, ge=1, le=100, description="units in the working memory (default: the server's retrieval.k)")
    speaker: str | None = Field(None, min_length=1, max_length=256, description="only units from a turn of this speaker")
    session_id: str | None = Field(None, min_length=1, max_length=256, description="only units of this session")
    since: str | None = Field(None, max_length=64, description="only units of sessions dated on or after this date")
    until: str | None = Field(None, max_length=64, description="only units of sessions dated on or before this date")


def model_of(cls: type, name: str, **extra: Any) -> type[BaseModel]:
    """A response model with the fields of the dataclass ``cls`` (and ``extra``): the schema cannot drift from the result."""
    hints = get_type_hints(cls)
    return create_model(name, **{f.name: (hints[f.name], ...) for f in fields(cls)}, **extra)


SearchOut = model_of(SearchResult, "SearchOut")
AskOut = model_of(AskResult, "AskOut", cited=(list[EvidenceUnit], ...))
"""The object ``python -m qgmem_train ask --json`` prints."""


class UnitOut(BaseModel):
    id: str
    fact_text: str
    source_turn_ids: list[str]


class MemoryOut(BaseModel):
    namespace: str
    units_total: int
    sessions_total: int
    offset: int
    units: list[UnitOut]


class SessionSummary(BaseModel):
    session_id: str
    turns: int
    time: str | None


class SessionsOut(BaseModel):
    namespace: str
    sessions_total: int
    offset: int
    sessions: list[SessionSummary]


class StoredTurn(BaseModel):
    id: str
    speaker: str
    text: str


class SessionTurnsOut(BaseModel):
    namespace: str
    session_id: str
    turns_total: int
    time: str | None
    offset: int
    turns: list[StoredTurn]


class NamespacesOut(BaseModel):
    namespaces: list[str]
    next: str | None = Field(description="the `after` of the next page; null on the last page")


class HealthOut(BaseModel):
    status: Literal["ok"]
    path: Literal["graph", "text"]


class ErrorOut(BaseModel):
    error: str = Field(description="one line: where, and what is wrong")
