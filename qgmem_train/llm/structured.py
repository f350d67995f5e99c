"""Schema-valid records from any backend: constrained decoding where supported, else parse, mend, retry once, drop.

Every LLM stage calls :func:`generate_structured` and reports its :class:`ParseStats`; a bad generation
never raises, it ends as ``None`` and is counted as dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from qgmem_train.llm.base import Chat, ChatLLM
from qgmem_train.llm.json_repair import parse_json_object
from qgmem_train.llm.prompts import JSON_RETRY

log = logging.getLogger(__name__)
Record = TypeVar("Record", bound=BaseModel)
_MAX_ERROR_CHARS = 300


@dataclass
class ParseStats:
    """Counts of one or more structured calls: ``valid + dropped == requested``."""

    requested: int = 0
    valid: int = 0
    repaired: int = 0
    """Valid records whose reply needed mending (prose, fences, broken JSON) before it parsed."""
    retried: int = 0
    """Replies that failed and were asked again once with the validation error."""
    dropped: int = 0

    def merge(self, other: ParseStats) -> ParseStats:
        """Add ``other``'s counts into this one (returns self)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, int]:
        """Plain dict for logs and reports."""
        return asdict(self)


def strict_json_schema(schema_cls: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with every object closed and every property required.

    Closed objects keep a constrained decoder from inventing keys; OpenAI's strict ``response_format``
    demands both and rejects ``default``.
    """

    def close(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: close(v) for k, v in node.items() if k != "default"}
            if node.get("type") == "object" and "properties" in node:
                node["additionalProperties"] = False
                node["required"] = list(node["properties"])
            return node
        if isinstance(node, list):
            return [close(v) for v in node]
        return node

    return close(schema_cls.model_json_schema())


def parse_record(text: str, schema_cls: type[Record]) -> tuple[Record | None, bool, str]:
    """``(record, mended, error)``: the validated record (or None) from one reply, and why it failed."""
    try:
        value, mended = parse_json_object(text)
    except ValueError as exc:
        return None, False, str(exc)
    try:
        return schema_cls.model_validate(value), mended, ""
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'object'}: {e['msg']}" for e in exc.errors()[:3])
        return None, mended, f"schema validation failed: {problems}"


def generate_structured(
    llm: ChatLLM,
    chats: Sequence[Chat],
    schema_cls: type[Record],
    *,
    max_new_tokens: int | None = None,
    stats: ParseStats | None = None,
    json_schema: dict[str, Any] | None = None,
) -> list[Record | None]:
    """One validated ``schema_cls`` record (or None, counted as dropped) per chat; updates ``stats``.

    Decoding is constrained (where the backend supports it) to ``json_schema``, by default ``schema_cls``'s strict schema.
    """
    stats = stats if stats is not None else ParseStats()
    schema = (json_schema or strict_json_schema(schema_cls)) if llm.supports_schema else None
    replies = llm.generate(chats, max_new_tokens=max_new_tokens, json_schema=schema)
    records: list[Record | None] = [None] * len(chats)
    mended = [False] * len(chats)
    failed: dict[int, tuple[str, str]] = {}
    for i, reply in enumerate(replies):
        records[i], mended[i], error = parse_record(reply, schema_cls)
        if records[i] is None:
            failed[i] = (reply, error)
    if failed:
        retry_chats = [
            [*chats[i], {"role": "assistant", "content": reply}, *JSON_RETRY.render(error=error[:_MAX_ERROR_CHARS])]
            for i, (reply, error) in failed.items()
        ]
        retry_replies = llm.generate(retry_chats, max_new_tokens=max_new_tokens, json_schema=schema)
        for i, reply in zip(failed, retry_replies):
            records[i], mended[i], error = parse_record(reply, schema_cls)
            if records[i] is None:
                log.debug("dropped a %s reply after one retry: %s", schema_cls.__name__, error)
    valid = [r is not None for r in records]
    stats.merge(
        ParseStats(
            requested=len(chats),
            valid=sum(valid),
            repaired=sum(v and m for v, m in zip(valid, mended)),
            retried=len(failed),
            dropped=valid.count(False),
        )
    )
    return records
