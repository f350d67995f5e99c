"""The answering layer: every frozen entry point renders the same final-answer chat (import directions: test_import_directions)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.answer.citations import cited_units
from qgmem_train.answer.evidence import answer_evidence
from qgmem_train.answer.prompt import GRAPH_FACTS_HEADING
from qgmem_train.answer.text_path import answer_chats, frozen_answer_chat
from qgmem_train.llm.base import Chat
from qgmem_train.llm.prompts import FINAL_ANSWER
from qgmem_train.llm.schemas import AnswerOutput
from qgmem_train.memory.store import AttributeIndex, NamespaceMemory
from qgmem_train.memory.types import Conversation, MemoryUnit, Session, Trace, Turn
from tests.fakes import ScriptedLLM

QUESTION = "What did Melanie paint?"
CONFIG = "pipeline:\n  construction:\n    units: turns\n    traces: false\n  retrieval:\n    k: 3\n  generation:\n    max_new_tokens: 32\n"
TURNS = [
    Turn("D1:1", "Caroline", "I went to the LGBTQ support group yesterday and it was so powerful."),
    Turn("D1:2", "Melanie", "I painted a sunrise over the lake last week."),
    Turn("D1:3", "Caroline", "I am planning to study counseling next year."),
]


def _unit(uid: str, subject: str, predicate: str, obj: str, text: str, serial: int) -> MemoryUnit:
    return MemoryUnit(uid, "S1", text, subject, predicate, obj, [f"D1:{serial}"], text, "2023-05-08", serial)


WORKING_MEMORY = [
    _unit("u1", "Caroline", "plans", "to study counseling", "Caroline plans to study counseling.", 1),
    _unit("u2", "Melanie", "painted", "a sunrise", "Melanie painted a sunrise over the lake.", 2),
    _unit("u3", "", "says", "", "Hmm.", 3),
    _unit("u4", "Caroline", "plans", "to adopt children", "Caroline now plans to adopt children.", 4),
]
"""Working-memory order; u1 and u4 form one trace, u3 has no triple (so no graph edge)."""


def _memory() -> NamespaceMemory:
    trace = Trace("t0", "Caroline plans", ["u1", "u4"], "Caroline first planned to study counseling; she now plans to adopt children.", "u4")
    attributes = AttributeIndex(np.zeros(0, np.int64), np.zeros(0, np.int8), [], np.zeros((0, 4), np.float32))
    return NamespaceMemory("demo", WORKING_MEMORY, np.zeros((len(WORKING_MEMORY), 4), np.float32), attributes, [trace],
                           {"u1": "t0", "u4": "t0"}, {}, {}, "none")  # fmt: skip


def _graph_facts(chat: Chat) -> str:
    return chat[-1]["content"].split(f"{GRAPH_FACTS_HEADING}\n", 1)[1]


def test_the_frozen_chat_lists_every_units_triple_clustered_ones_included() -> None:
    evidence = answer_evidence(WORKING_MEMORY, _memory(), None, max_edges=10)
    assert set(evidence.context.labels.values()) == {"u1", "u2", "u3", "u4"}
    assert [evidence.context.labels[label] for label in evidence.graph.edge_unit_labels] == ["u1", "u2", "u4"]
    facts = _graph_facts(frozen_answer_chat("What does Caroline plan?", None, evidence))
    for unit in (WORKING_MEMORY[0], WORKING_MEMORY[1], WORKING_MEMORY[3]):
        assert f"{unit.subject} | {unit.predicate} | {unit.object}" in facts
    assert answer_evidence(WORKING_MEMORY, _memory(), None, max_edges=1).graph.edge_unit_labels == ["MU1"]


def test_graph_fact_labels_cite_the_units_behind_their_edges() -> None:
    evidence = answer_evidence(WORKING_MEMORY, _memory(), None, max_edges=10)
    facts = _graph_facts(frozen_answer_chat("What does Caroline plan?", None, evidence))
    label = re.search(r"\[((?:MU|F)\d+)\] Caroline \| plans \| to adopt children", facts)[1]
    assert evidence.context.labels[label] == "u4", "a clustered unit's edge carries its cluster label"
    assert cited_units(f"{label} is the latest plan.", evidence) == ["u4"]


def test_a_reasoning_path_label_names_one_unit_in_every_prompt() -> None:
    """The gold reasoning path cites an evidence unit by its MEMORY_CONTEXT label; that label names the same unit in a
    triples-only prompt, in the context + triples prompt and in the citations (no graph fact numbered apart from it)."""
    from data_prep.targets import gold_reasoning_path
    from qgmem_train.answer.prompt import final_answer_chat

    evidence = answer_evidence(WORKING_MEMORY, _memory(), None, max_edges=10)
    triples_only = final_answer_chat(QUESTION, None, "", evidence.graph, text_path=True)[-1]["content"]
    with_context = frozen_answer_chat(QUESTION, None, evidence)[-1]["content"]
    for unit in (WORKING_MEMORY[1], WORKING_MEMORY[3]):
        path = gold_reasoning_path(evidence.context.labels, {unit.id})
        label = re.search(r"\b(?:MU|F)\d+\b", path)[0]
        triple = f"{unit.subject} | {unit.predicate} | {unit.object}"
        for prompt in (triples_only, with_context):
            named = re.findall(rf"^\[{label}\] (.*)$", prompt, re.MULTILINE)
            assert named and all(triple in line or unit.fact_text in line for line in named), (label, named)
        assert f"[{label}] {triple}" in triples_only and f"[{label}] {triple}" in _graph_facts([{"content": with_context}])
        assert cited_units(path, evidence) == [unit.id]


def test_answer_chats_parses_the_answer_of_each_chat() -> None:
    llm = ScriptedLLM(['{"reasoning_path": "F1 says a sunrise", "answer": "a sunrise"}'])
    chat = frozen_answer_chat("What did Melanie paint?", None, answer_evidence(WORKING_MEMORY[1:2], _memory(), llm, max_edges=10))
    assert answer_chats(llm, [chat]) == [AnswerOutput(reasoning_path="F1 says a sunrise", answer="a sunrise")]
    assert llm.calls == [chat] and "Question: What did Melanie paint?" in chat[-1]["content"]


def _reply(chat: Chat) -> str:
    """An answer to the final-answer prompt, a verdict to anything else (the data-prep judge)."""
    if chat[0]["content"] == FINAL_ANSWER.system:
        return json.dumps({"reasoning_path": "F1 says so.", "answer": "a sunrise"})
    return json.dumps({"judgment": "correct", "reason": "scripted"})


def test_the_four_frozen_entry_points_render_the_same_chat(minilm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data prep, ask, the predictor's text path and eval answers, over one stored working memory."""
    from data_prep.config import DataPrepConfig
    from data_prep.convomem import CaseQuestion, ConvoMemCase, case_namespace
    from data_prep.pipeline import run_case
    from data_prep.sampling import CaseRef
    from qgmem_train.__main__ import main
    from qgmem_train.benchmarks.loaders import BenchmarkQuestion
    from qgmem_train.config import load_pipeline_config
    from qgmem_train.eval.answer_quality import AnswerVariant, answer_text_path
    from qgmem_train.llm import factory
    from qgmem_train.llm.structured import ParseStats
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.pipeline import PipelineModels
    from qgmem_train.predictor import QGMemPredictor

    config = tmp_path / "frozen.yaml"
    config.write_text(CONFIG)
    pipeline = load_pipeline_config(config)
    llm = ScriptedLLM(_reply)
    monkeypatch.setattr(factory, "build_llm", lambda cfg: llm)
    monkeypatch.setattr(factory, "build_embedder", lambda cfg: minilm)
    store_dir = tmp_path / "store"
    case = ConvoMemCase(CaseRef("category_1", "case.json"), Conversation("case", [Session("S1", "2023-05-08", TURNS)]),
                        [CaseQuestion(QUESTION, "a sunrise", [TURNS[1].text], ["S1"])])  # fmt: skip
    namespace = case_namespace(case.ref.case_id)

    def answer_chats_since(start: int) -> list[Chat]:
        return [chat for chat in llm.calls[start:] if chat[0]["content"] == FINAL_ANSWER.system]

    with MemoryStore.open(store_dir, create=True) as store:
        run_case(case, store, PipelineModels.built(pipeline, llm=llm, embedder=minilm, reranker=None, intent="rules"), DataPrepConfig(intent="rules", target="judge_correct"), pipeline)
    chats = {"data prep": answer_chats_since(0)}
    start = len(llm.calls)
    assert main(["ask", "--store", str(store_dir), "--namespace", namespace, "--config", str(config), "--reranker", "none", "--intent", "rules", QUESTION]) == 0
    chats["ask"] = answer_chats_since(start)
    start = len(llm.calls)
    predictor = QGMemPredictor(None, pipeline, llm=llm, embedder=minilm, reranker=None, intent="rules")
    with predictor.memory(namespace, store_dir) as memory:
        memory.ask(QUESTION)
    chats["predictor"] = answer_chats_since(start)
    start = len(llm.calls)
    question = BenchmarkQuestion("q1", namespace, QUESTION, "single-hop", "a sunrise", None)
    answer_text_path([question], store_dir, pipeline, AnswerVariant(reranker="none"), intent_mode="rules", llm=llm, stats=ParseStats())
    chats["eval answers"] = answer_chats_since(start)

    assert all(len(rendered) == 1 for rendered in chats.values()), {name: len(rendered) for name, rendered in chats.items()}
    reference = chats["data prep"][0]
    assert "Melanie | painted | a sunrise" in reference[-1]["content"]
    assert {name: rendered[0] == reference for name, rendered in chats.items()} == dict.fromkeys(chats, True)


def test_the_predictor_cites_a_unit_by_its_graph_fact_label(minilm, tmp_path: Path) -> None:
    from qgmem_train.config import load_pipeline_config
    from qgmem_train.predictor import QGMemPredictor

    def cite_melanies_graph_fact(chat: Chat) -> str:
        label = re.search(r"\[(F\d+)\] Melanie \|", _graph_facts(chat))[1]
        return json.dumps({"reasoning_path": f"{label} says what Melanie painted.", "answer": "a sunrise"})

    config = tmp_path / "frozen.yaml"
    config.write_text(CONFIG)
    predictor = QGMemPredictor(None, load_pipeline_config(config), llm=ScriptedLLM(cite_melanies_graph_fact), embedder=minilm, reranker=None, intent="rules")
    with predictor.memory("alice", tmp_path / "store") as memory:
        memory.add_session(TURNS, time="2023-05-08", session_id="S1")
        result = memory.ask(QUESTION)
    assert result.reasoning_path.startswith("F") and [unit.id for unit in result.cited] == ["D1:2"]
