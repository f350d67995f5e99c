"""Schema-capped answers: both paths decode under one string cap, and a cut string ends at a word, marked."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from qgmem_train.answer.capped import CUT_MARK, answer_char_limit, capped_answer_schema, end_at_word
from qgmem_train.answer.parsing import parse_answer
from qgmem_train.answer.evidence import answer_evidence
from qgmem_train.answer.text_path import answer_chats, frozen_answer_chat
from qgmem_train.llm.base import Chat
from qgmem_train.memory.store import AttributeIndex, NamespaceMemory
from qgmem_train.memory.types import MemoryUnit, TimeSpan
from tests.fakes import ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "configs" / "demo-cpu.yaml"
DEMO_QUESTION = "Where does Alex walk Biscuit?"
SENTENCE = "I adopted a beagle called Biscuit (2 weeks ago) and walk him at the park before work."


class SchemaRecordingLLM(ScriptedLLM):
    """A scripted LLM that enforces schemas (as llguidance does) and records the schema of each call."""

    def __init__(self, replies: Sequence[str]) -> None:
        super().__init__(replies)
        self.schemas: list[dict[str, Any] | None] = []

    @property
    def supports_schema(self) -> bool:
        return True

    def generate(self, chats: Sequence[Chat], *, max_new_tokens: int | None = None, json_schema: dict[str, Any] | None = None) -> list[str]:
        self.schemas.append(json_schema)
        return super().generate(chats, max_new_tokens=max_new_tokens, json_schema=json_schema)


@pytest.mark.parametrize("limit", range(2, len(SENTENCE) + 1))
def test_a_capped_string_ends_at_a_word_boundary_marked(limit: int) -> None:
    cut = end_at_word(SENTENCE, limit)
    kept = cut.removesuffix(CUT_MARK)
    assert cut.endswith(CUT_MARK) and len(cut) <= limit
    assert SENTENCE.startswith(kept)
    assert kept and not SENTENCE[len(kept)].isalnum(), cut
    assert not kept.endswith((" ", "("))


def test_a_string_below_the_cap_is_kept_whole_and_a_single_long_word_is_cut_inside() -> None:
    assert end_at_word(SENTENCE, len(SENTENCE) + 1) == SENTENCE
    assert end_at_word("Supercalifragilistic", 8) == "Superca" + CUT_MARK


def test_the_text_path_decodes_under_the_graph_paths_cap_and_marks_a_cut_answer() -> None:
    limit = answer_char_limit(96)
    reply = json.dumps({"reasoning_path": "F1 says so", "answer": SENTENCE[:limit]})
    llm = SchemaRecordingLLM([reply])
    (record,) = answer_chats(llm, [[{"role": "user", "content": DEMO_QUESTION}]], max_new_tokens=96)
    assert llm.schemas == [capped_answer_schema(96)]
    assert {field["maxLength"] for field in capped_answer_schema(96)["properties"].values()} == {limit}
    assert record.reasoning_path == "F1 says so"
    assert record.answer == end_at_word(SENTENCE[:limit], limit) and record.answer.endswith(CUT_MARK)


def test_the_graph_paths_parse_ends_a_capped_string_at_a_word() -> None:
    limit = answer_char_limit(96)
    text = json.dumps({"reasoning_path": "F1", "answer": SENTENCE[:limit]})
    assert parse_answer(text).answer == SENTENCE[:limit]
    assert parse_answer(text, 96).answer == end_at_word(SENTENCE[:limit], limit)


def _demo_memory() -> tuple[list[MemoryUnit], NamespaceMemory]:
    """The one unit the demo's LLM build (step 3: SmolLM2's extraction of samples/plain_chat.jsonl's first session) stores."""
    unit = MemoryUnit(
        "s1:1#0", "s1", "I adopted a beagle called Biscuit last weekend!", "I", "I", "Biscuit", ["s1:1", "s1:2", "s1:3", "s1:4"],
        "Alex: I adopted a beagle called Biscuit last weekend!", "2024-03-02T18:30:00", 0, [TimeSpan("2024-02-24", "2024-02-25", "day")],
        ["I", "Alex", "Biscuit", "Assistant"], [],
    )  # fmt: skip
    attributes = AttributeIndex(np.zeros(0, np.int64), np.zeros(0, np.int8), [], np.zeros((0, 4), np.float32))
    return [unit], NamespaceMemory("alex", [unit], np.zeros((1, 4), np.float32), attributes, [], {}, {}, {}, "none")


@pytest.mark.slow
def test_the_demos_question_gets_a_capped_parsing_answer_from_smollm2_on_the_text_path(smollm2) -> None:
    """The demo's text-path step (step 4): its working memory, question and budget, with SmolLM2; uncapped, the reply is cut and dropped."""
    budget = yaml.safe_load(DEMO_CONFIG.read_text())["pipeline"]["generation"]["max_new_tokens"]
    units, memory = _demo_memory()
    chat = frozen_answer_chat(DEMO_QUESTION, "2024-05-01", answer_evidence(units, memory, smollm2, max_edges=10))
    (record,) = answer_chats(smollm2, [chat], max_new_tokens=budget)
    assert record is not None
    limit = answer_char_limit(budget)
    for text in (record.answer, record.reasoning_path):
        assert len(text) < limit or len(text) == limit and text.endswith(CUT_MARK), text
