"""Stage 1 and 2 around the LLM: the evidence bound, overlap rule, keyed index and time repair (scripted replies)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from qgmem_train.config import PipelineConfig
from qgmem_train.llm.base import Chat
from qgmem_train.llm.structured import ParseStats
from qgmem_train.memory.extraction import extract_windows
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.types import TimeSpan
from qgmem_train.memory.windows import session_windows
from tests.fakes import ScriptedLLM

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _ids(block: str) -> list[str]:
    return re.findall(r"^\[([^\]]+)\]", block, re.M)


def _unit(start: str, end: str, fact: str) -> dict:
    return {"start_turn": start, "end_turn": end, "fact_text": fact, "triple": {"subject": "Caroline", "predicate": "attended", "object": fact}}


def _reply(chat: Chat) -> str:
    """Per window: one good unit, one overlap-only unit, one unit citing a turn outside the window, one spanning overlap and new."""
    user = chat[-1]["content"]
    if "MEMORY_CONTENT:" in user:
        content = user.split("MEMORY_CONTENT:")[1]
        new_part, _, overlap_part = content.partition("OVERLAP_FROM_PREVIOUS_WINDOW")
        new, overlap = _ids(new_part), _ids(overlap_part)
        units = [_unit(new[0], new[0], f"good {new[0]}"), _unit("D7:1", "D7:1", "outside the window")]
        if overlap:
            units += [_unit(overlap[0], overlap[-1], "overlap only"), _unit(new[0], overlap[-1], f"spans {overlap[-1]}..{new[0]}")]
        return "Here you go:\n```json\n" + json.dumps({"memory_units": units}) + "\n```"
    if "MEMORY_UNITS:" in user:
        items = json.loads(user.split("MEMORY_UNITS:")[1])
        out = [
            {"memory_unit_id": item["memory_unit_id"], "entities": ["support group", " support group ", ""], "locations": ["LGBTQ center"],
             "time": [{"start": "2023-05-08", "end": "2023-05-08", "granularity": "day"}]}
            for item in items[:-1]  # the last unit of each chunk gets no index record
        ]
        return json.dumps({"memory_units": out + [{"memory_unit_id": "not-a-unit", "entities": ["x"]}]})
    raise AssertionError("unexpected prompt")


def test_evidence_bound_and_overlap_rule_drop_and_count_units() -> None:
    (conv,) = load_conversations("locomo", SAMPLES / "locomo_sample.json")
    session = conv.sessions[0]
    windows = session_windows(session, 6, 2)[:3]
    positions = {t.id: i for i, t in enumerate(session.turns)}
    cfg = PipelineConfig()
    cfg.construction.index_batch_size = 1
    llm, stats = ScriptedLLM(_reply), ParseStats()

    results = extract_windows(llm, windows, positions, cfg, stats)

    first, second, third = results
    assert [u.fact_text for u in first[0]] == ["good D1:1"] and first[1] == 1  # outside id dropped
    assert [u.fact_text for u in second[0]] == ["good D1:7", "spans D1:6..D1:7"] and second[1] == 2  # + overlap-only dropped
    assert [u.id for u in second[0]] == ["D1:7#0", "D1:7#1"]
    spanning = second[0][1]
    assert spanning.source_turn_ids == ["D1:6", "D1:7"] and spanning.serial == positions["D1:6"]
    assert spanning.source_text.startswith("Melanie: ")
    assert third[1] == 2
    assert stats.requested == 3 + 5 and stats.valid == 8 and stats.repaired == 3 and stats.dropped == 0


def test_stage_two_is_keyed_by_unit_id_and_time_is_repaired_by_rules() -> None:
    (conv,) = load_conversations("locomo", SAMPLES / "locomo_sample.json")
    session = conv.sessions[0]
    windows = session_windows(session, 6, 2)[:2]
    positions = {t.id: i for i, t in enumerate(session.turns)}
    cfg = PipelineConfig()
    cfg.construction.index_batch_size = 8
    units = [u for us, _ in extract_windows(ScriptedLLM(_reply), windows, positions, cfg) for u in us]

    by_id = {u.id: u for u in units}
    indexed = by_id["D1:7#0"]  # first unit of the second window's chunk: has an index record
    assert indexed.entities == ["support group"] and indexed.locations == ["LGBTQ center"]
    assert indexed.fact_time == []  # the LLM copied the utterance day; the rules reject it
    assert by_id["D1:7#1"].entities == []  # last unit of the chunk: no record, rules only
    support = by_id["D1:1#0"]  # "Hey Mel! ..." has no time expression
    assert support.fact_time == [] and support.utterance_time == "2023-05-08T13:56:00"


def test_unparseable_window_counts_as_dropped_and_does_not_stop_the_batch() -> None:
    (conv,) = load_conversations("locomo", SAMPLES / "locomo_sample.json")
    session = conv.sessions[0]
    windows = session_windows(session, 6, 2)[:2]
    positions = {t.id: i for i, t in enumerate(session.turns)}

    def reply(chat: Chat) -> str:
        if any("NEW_IN_THIS_WINDOW\n[D1:1]" in m["content"] for m in chat):  # the first window, and its retry
            return "I cannot do that."
        return _reply(chat)

    stats = ParseStats()
    results = extract_windows(ScriptedLLM(reply), windows, positions, PipelineConfig(), stats)
    assert results[0] == ([], 1)
    assert len(results[1][0]) == 2
    assert stats.dropped == 1 and stats.retried == 1


def test_time_expression_in_evidence_wins_over_llm_item() -> None:
    (conv,) = load_conversations("locomo", SAMPLES / "locomo_sample.json")
    session = conv.sessions[0]
    window = session_windows(session, 6, 2)[0]
    positions = {t.id: i for i, t in enumerate(session.turns)}

    def reply(chat: Chat) -> str:
        user = chat[-1]["content"]
        if "MEMORY_CONTENT:" in user:
            return json.dumps({"memory_units": [_unit("D1:3", "D1:3", "Caroline went to an LGBTQ support group on 7 May 2023.")]})
        return json.dumps({"memory_units": [{"memory_unit_id": "D1:1#0", "time": [{"start": "2023-05", "end": "2023-05", "granularity": "month"}]}]})

    ((units, dropped),) = extract_windows(ScriptedLLM(reply), [window], positions, PipelineConfig())
    assert dropped == 0
    assert units[0].fact_time == [TimeSpan("2023-05-07", "2023-05-07", "day")]  # "yesterday" said on 8 May
