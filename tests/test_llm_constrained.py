"""Constrained decoding with SmolLM2 gives schema-valid records for each of the paper's five pipeline prompts."""

from __future__ import annotations

import json

import pytest

from qgmem_train.llm.prompts import FINAL_ANSWER, MEMORY_UNIT_EXTRACTION, MEMORY_UNIT_INDEX, QUERY_INTENT, TRACE_CONSOLIDATION
from qgmem_train.llm.schemas import AnswerOutput, IntentOutput, TrajectoryOutput, extraction_schema, index_schema
from qgmem_train.llm.structured import ParseStats, generate_structured

WINDOW = """NEW_IN_THIS_WINDOW
[D1:3] time: 1:56 pm on 8 May, 2023 Caroline: I went to a LGBTQ support group yesterday and it was so powerful.
[D1:4] time: 1:56 pm on 8 May, 2023 Melanie: Wow, that's cool, Caroline! What happened that was so awesome?
OVERLAP_FROM_PREVIOUS_WINDOW
[D1:2] time: 1:56 pm on 8 May, 2023 Melanie: Hey Caroline! I'm swamped with the kids & work."""
UNITS = [
    {"memory_unit_id": "MU1", "utterance_time": "2023-05-08", "fact_text": "Caroline went to an LGBTQ support group on 7 May 2023.", "evidence_text": "[D1:3] Caroline: I went to a LGBTQ support group yesterday."},
    {"memory_unit_id": "MU2", "utterance_time": "2023-05-08", "fact_text": "Melanie paints sunsets at the lake.", "evidence_text": "[D1:8] Melanie: I painted the sunset at the lake."},
]
MEMBERS = [
    {"memory_unit_id": "MU1", "time": "2023-05-07", "fact_text": "Caroline is researching adoption agencies."},
    {"memory_unit_id": "MU7", "time": "2023-08-02", "fact_text": "Caroline applied to an adoption agency."},
]

CASES = {
    "extraction": (
        MEMORY_UNIT_EXTRACTION.render(session_id="session_1", start_turn="D1:3", end_turn="D1:4", utterance_time="1:56 pm on 8 May, 2023", annotated_memory_content=WINDOW),
        extraction_schema(["D1:3", "D1:4"]),
    ),
    "index": (
        MEMORY_UNIT_INDEX.render(session_id="session_1", start_turn="D1:3", end_turn="D1:8", utterance_time="2023-05-08", memory_units_json=json.dumps(UNITS)),
        index_schema(["MU1", "MU2"]),
    ),
    "trace": (TRACE_CONSOLIDATION.render(relation_text="Caroline adoption", members_json=json.dumps(MEMBERS)), TrajectoryOutput),
    "intent": (QUERY_INTENT.render(query="When did Caroline go to the LGBTQ support group?", question_time="2023-06-01"), IntentOutput),
    "answer": (
        FINAL_ANSWER.render(query="When did Caroline go to the LGBTQ support group?", question_time="2023-06-01", serialized_graph="MU1: Caroline went to an LGBTQ support group (utterance_time 2023-05-08). F1: Caroline – attended – LGBTQ support group"),
        AnswerOutput,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(CASES))
def test_constrained_generation_is_schema_valid_for_each_pipeline_prompt(smollm2, stage: str) -> None:
    chat, schema_cls = CASES[stage]
    stats = ParseStats()
    (record,) = generate_structured(smollm2, [chat], schema_cls, max_new_tokens=80, stats=stats)
    assert isinstance(record, schema_cls), stats.as_dict()
    assert schema_cls.model_validate(record.model_dump()) == record
    assert stats.valid == 1 and stats.dropped == 0
    if stage == "extraction":
        assert all(u.start_turn in {"D1:3", "D1:4"} for u in record.memory_units)
    if stage == "index":
        assert {u.memory_unit_id for u in record.memory_units} <= {"MU1", "MU2"}
