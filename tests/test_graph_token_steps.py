"""The graph-token study's steps: step 0 (does the graph hold the answer?) and step 1 (can the slot carry content?).

Their pure parts on hand-built examples; both steps end to end through the package over the cut-down conversations of
the study's tests, with the tiny random decoder as the frozen LLM (the steps' numbers mean nothing there; their
outputs, resume and verdict logic are what is tested).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.graph_token.capacity import CAPACITY_NATS, TARGETS, target_examples, verdict
from experiments.graph_token.information import coverage, label_words
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.trajectory import TrajectoryExample
from tests.test_graph_token_experiment import tiny_convomem
from tests.tiny_decoder import fixture_corpus, save_tiny_decoder

ROOT = Path(__file__).resolve().parents[1]


def example(qid: str, answer: str, context: str, graph: LocalGraph) -> TrajectoryExample:
    return TrajectoryExample(case_id="c", question_id=qid, source_dataset="convomem", namespace="n", question="Where?",
                             question_time="", context=context, answer=answer, reasoning_path="MU1", graph=graph)  # fmt: skip


BEACH = LocalGraph(node_labels=["Alex", "the beach"], edge_src=[0], edge_dst=[1], edge_labels=["walks Biscuit on"])


def test_coverage_counts_answers_whose_words_the_graph_labels_hold() -> None:
    examples = [
        example("q1", "The beach", "Alex walks on the beach", BEACH),  # every word in the graph and the context
        example("q2", "beach in Maine", "Alex lives in Maine", BEACH),  # 1 of 3 words in the graph, 2 of 3 in the context
        example("q3", "", "anything", BEACH),  # no words: not counted
    ]
    assert label_words(BEACH) == {"alex", "beach", "walks", "biscuit", "on"}
    result = coverage(examples)
    assert result["graph"] == {"answers": 2, "all_words": 0.5, "mean_word_share": (1 + 1 / 3) / 2}
    assert result["context"]["all_words"] == 0.5 and abs(result["context"]["mean_word_share"] - (1 + 2 / 3) / 2) < 1e-9


def test_capacity_targets_rewrite_the_answer_and_drop_the_context() -> None:
    examples = [example("q1", "the beach", "context text", BEACH), example("q2", "x", "context text", LocalGraph())]
    triples, answer, in_prompt = (target_examples(examples, t) for t in TARGETS)
    assert [e.question_id for e in triples] == ["q1"], "a graph without edges has no triples to carry"
    assert "Alex" in triples[0].answer and "walks Biscuit on" in triples[0].answer and triples[0].context == ""
    assert [e.answer for e in answer] == ["the beach", "x"] and all(e.context == "" for e in answer)
    assert all(e.context == "context text" for e in in_prompt)


def row(target: str, difference: float, low: float) -> dict[str, object]:
    return {"target": target, "swap_cost": {"mean_difference": difference, "ci95": [low, difference + 0.1]}}


def test_the_slot_carries_content_only_when_swapping_costs_enough_on_triples_and_answers() -> None:
    above = CAPACITY_NATS + 0.1
    assert verdict([row("triples", above, 0.2), row("answer", 0.1, 0.0), row("answer", above, 0.3)])[0]
    assert not verdict([row("triples", above, 0.2), row("answer", CAPACITY_NATS - 0.1, 0.1)])[0]
    assert not verdict([row("triples", above, -0.1), row("answer", above, 0.2)])[0], "an interval holding 0 does not pass"
    assert verdict([row("answer-in-prompt", above, 0.2), row("answer", above, 0.2)])[0] is None, "(a) not measured: no verdict"


@pytest.mark.slow
def test_steps_0_and_1_run_through_the_package_and_resume(tmp_path: Path) -> None:
    llm = save_tiny_decoder(tmp_path / "tiny", fixture_corpus())
    out = tmp_path / "out"
    common = [
        "--data", str(tiny_convomem(tmp_path / "cases")), "--out", str(out), "--llm", str(llm), "--test-count", "1",
        "--max-test-questions", "3", "--max-val-questions", "2", "--max-context-tokens", "64", "--eval-batch-size", "2",
        "--bootstrap-resamples", "200",
    ]  # fmt: skip
    step0 = [sys.executable, "-m", "experiments.graph_token.information", *common, "--step-questions", "2"]
    result = subprocess.run(step0, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "information" / "results.json").read_text())
    assert set(report["answer_loss"]) == {"question", "triples", "context", "context+triples"}
    assert (report["test_questions"], report["test_questions_total"]) == (2, 3), "a seeded sample of the test questions"
    assert all(c["questions"] == 2 for c in report["comparisons"])
    assert report["comparisons"][0]["control"] == "question" and report["comparisons"][0]["treatment"] == "triples"
    assert report["passed"] == (report["comparisons"][0]["ci95"][0] > 0)
    assert result.stdout.strip() == report["verdict"] and "step 0" in (out / "information" / "results.md").read_text()

    again = subprocess.run(step0, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and again.stderr.count("reusing") >= 5, "data and every prompt's losses are reused"

    step1 = [sys.executable, "-m", "experiments.graph_token.capacity", *common, "--capacity-questions", "2", "--capacity-steps", "2"]
    result = subprocess.run(step1, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    capacity = json.loads((out / "capacity" / "results.json").read_text())
    assert [(r["target"], r["tokens"]) for r in capacity["rows"]] == [(t.key, n) for t in TARGETS for n in (1, 10)]
    for r in capacity["rows"]:
        assert r["questions"] >= 1 and set(r["mean"]) == {"own", "swapped", "shared"}
    assert result.stdout.strip() == capacity["verdict"]


def test_a_step_without_data_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for step in ("information", "capacity"):
        command = [sys.executable, "-m", f"experiments.graph_token.{step}", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "missing" in result.stderr, result.stderr
