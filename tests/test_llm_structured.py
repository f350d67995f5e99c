"""JSON mending over a corpus of malformed replies (real SmolLM2 ones included) and the structured-output loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem_train.llm.json_repair import parse_json_object
from qgmem_train.llm.schemas import AnswerOutput, ExtractionOutput, IntentOutput, extraction_schema
from qgmem_train.llm.structured import ParseStats, generate_structured, parse_record, strict_json_schema
from tests.fakes import ScriptedLLM

CAPTURED = Path(__file__).parent / "data" / "unconstrained_outputs" / "extraction_smollm2.jsonl"

# (reply, the object it holds) — damage seen in model replies, one kind per line.
MALFORMED = [
    ('{"answer": "Paris", "reasoning_path": "MU1"}', {"answer": "Paris", "reasoning_path": "MU1"}),
    ('Sure! Here is the JSON:\n```json\n{"answer": "Paris", "reasoning_path": "MU1"}\n```\nHope this helps!', {"answer": "Paris", "reasoning_path": "MU1"}),
    ('<think>\nThe user wants {json}.\n</think>\n{"answer": "Paris", "reasoning_path": "F1"}', {"answer": "Paris", "reasoning_path": "F1"}),
    ('{"entities": ["Caroline", "support group",], "locations": [],}', {"entities": ["Caroline", "support group"], "locations": []}),
    ("{'answer': 'Caroline\\'s dog', 'reasoning_path': 'MU2'}", {"answer": "Caroline's dog", "reasoning_path": "MU2"}),
    ('{answer: "7 May 2023", reasoning_path: "MU1"}', {"answer": "7 May 2023", "reasoning_path": "MU1"}),
    ('{"ok": True, "missing": None, "no": False}', {"ok": True, "missing": None, "no": False}),
    ('{"memory_units": [{"start_turn": "D1:3", "end_turn": "D1:3", "fact_text": "Caroline went to a sup', {"memory_units": [{"start_turn": "D1:3", "end_turn": "D1:3", "fact_text": "Caroline went to a sup"}]}),
    ('{"memory_units": [{"start_turn": "D1:3"}, {"start_turn": "D1:4", "end_turn"', {"memory_units": [{"start_turn": "D1:3"}, {"start_turn": "D1:4"}]}),
    ('{"trajectory": "first line\nsecond line", "note": "she said "yes" twice"}', {"trajectory": "first line\nsecond line", "note": 'she said "yes" twice'}),
    ('The output schema is below.\n{"x": -1.5e2, "y": [1, 2, 3]} and that is all.', {"x": -150.0, "y": [1, 2, 3]}),
]


@pytest.mark.parametrize(("reply", "expected"), MALFORMED)
def test_mending_recovers_the_object(reply: str, expected: dict) -> None:
    value, mended = parse_json_object(reply)
    assert value == expected
    assert mended == (reply != MALFORMED[0][0])


@pytest.mark.parametrize("reply", ["", "no JSON at all", "[1, 2, 3]", "{: :}"])
def test_replies_without_an_object_raise_value_error(reply: str) -> None:
    with pytest.raises(ValueError):
        parse_json_object(reply)


def _captured() -> list[dict]:
    if not CAPTURED.exists():
        pytest.skip(f"{CAPTURED.name} not captured yet: run {CAPTURED.parent / 'capture.py'}")
    return [json.loads(line) for line in CAPTURED.read_text().splitlines()]


def test_real_unconstrained_smollm2_extraction_replies_never_break_the_parser() -> None:
    records = _captured()
    assert len(records) >= 8
    for item in records:
        record, _, error = parse_record(item["reply"], extraction_schema(item["turn_ids"]))
        assert (record is None) == bool(error)
        if record is not None:
            assert all(u.start_turn in item["turn_ids"] for u in record.memory_units)
    replies = [item["reply"] for item in records]
    llm = ScriptedLLM(replies + replies)
    stats = ParseStats()
    out = generate_structured(llm, [[{"role": "user", "content": "window"}]] * len(replies), ExtractionOutput, stats=stats)
    assert stats.requested == len(replies) == stats.valid + stats.dropped
    assert stats.dropped == out.count(None) and stats.retried == len(llm.calls) - len(replies)


def test_structured_loop_counts_valid_mended_retried_and_dropped() -> None:
    llm = ScriptedLLM([
        '{"answer": "Paris", "reasoning_path": "MU1"}',
        "```json\n{'answer': 'Lyon', 'reasoning_path': 'MU2',}\n```",
        '{"answer": "Nice"}',
        "I think the answer is Paris.",
        '{"answer": "Nice", "reasoning_path": "MU3"}',
        "still no JSON",
    ])  # fmt: skip
    chats = [[{"role": "user", "content": f"q{i}"}] for i in range(4)]
    stats = ParseStats()
    records = generate_structured(llm, chats, AnswerOutput, stats=stats)
    assert [r.answer if r else None for r in records] == ["Paris", "Lyon", "Nice", None]
    assert stats.as_dict() == {"requested": 4, "valid": 3, "repaired": 1, "retried": 2, "dropped": 1}
    first_retry, second_retry = llm.calls[4], llm.calls[5]
    assert first_retry[:1] == chats[2] and first_retry[1] == {"role": "assistant", "content": '{"answer": "Nice"}'}
    assert "reasoning_path: Field required" in first_retry[2]["content"]
    assert "no JSON object found" in second_retry[2]["content"]


def test_stats_merge_and_schema_is_closed() -> None:
    total = ParseStats(requested=2, valid=1, dropped=1).merge(ParseStats(requested=3, valid=3, repaired=1))
    assert total.as_dict() == {"requested": 5, "valid": 4, "repaired": 1, "retried": 0, "dropped": 1}
    schema = strict_json_schema(IntentOutput)
    assert schema["additionalProperties"] is False and schema["required"] == ["entities", "locations", "time"]
    assert schema["$defs"]["IntentTime"]["additionalProperties"] is False
    assert "default" not in json.dumps(schema)


def test_enum_schema_rejects_turns_outside_the_window() -> None:
    reply = '{"memory_units": [{"start_turn": "D9:9", "end_turn": "D1:1", "fact_text": "x", "triple": {"subject": "a", "predicate": "b", "object": "c"}}]}'
    record, _, error = parse_record(reply, extraction_schema(["D1:1", "D1:2"]))
    assert record is None and "memory_units.0.start_turn" in error
    assert parse_record(reply.replace("D9:9", "D1:2"), ExtractionOutput)[0] is not None
