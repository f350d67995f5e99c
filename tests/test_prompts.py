"""The prompts are the paper's, word for word, and render only by their named fields."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from qgmem_train.llm import prompts
from qgmem_train.llm.prompts import ALL_PROMPTS, FINAL_ANSWER, MEMORY_UNIT_INDEX, PIPELINE_PROMPTS

PAPER = Path(__file__).resolve().parents[2] / "shared" / "paper" / "qgmem-paper.txt"


def _normalise(text: str) -> str:
    """The paper prints prompts on one line with typographic quotes for backticks and escaped angle brackets."""
    text = html.unescape(text).replace("`", "‘")
    return re.sub(r"\s+", " ", text).strip()


@pytest.fixture(scope="module")
def paper() -> str:
    if not PAPER.exists():
        pytest.skip(f"the paper is not beside this checkout ({PAPER})")
    return _normalise(PAPER.read_text())


@pytest.mark.parametrize("name", sorted(ALL_PROMPTS))
def test_prompt_text_is_verbatim(paper: str, name: str) -> None:
    template = ALL_PROMPTS[name]
    for text in (template.system, template.user):
        for chunk in re.split(r"\{[a-z_]+\}", text):
            if chunk.strip():
                assert _normalise(chunk) in paper, f"{name}: not in the paper: {chunk[:80]!r}"


def test_pipeline_prompts_have_system_and_user_parts(paper: str) -> None:
    for template in PIPELINE_PROMPTS:
        assert f"[System] {_normalise(template.system)} [User template]" in paper


def test_render_fills_fields_and_keeps_json_braces() -> None:
    messages = FINAL_ANSWER.render(query="Where did Jon dance?", question_time="2023-06-01", serialized_graph="F1: Jon – dances at – studio")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "Question: Where did Jon dance?" in messages[1]["content"]
    assert "F1: Jon – dances at – studio" in messages[1]["content"]
    assert '{ "reasoning_path": "brief chain' in messages[0]["content"]


def test_render_rejects_missing_and_unknown_fields() -> None:
    with pytest.raises(KeyError, match="missing fields"):
        MEMORY_UNIT_INDEX.render(session_id="s1")
    with pytest.raises(KeyError, match="unknown fields"):
        FINAL_ANSWER.render(query="q", question_time="", serialized_graph="", extra="x")


def test_no_other_module_spells_a_prompt() -> None:
    package = Path(prompts.__file__).resolve().parents[1]
    markers = ("You are a long-conversation memory-unit extractor", "You answer questions using only the provided memory context")
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "prompts.py" and any(marker in path.read_text() for marker in markers)
    ]
    assert offenders == []
