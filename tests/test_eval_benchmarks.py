"""Benchmark loaders on the committed samples and hand-made fixtures, and one-line errors on bad records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem_train.benchmarks.loaders import BEAM_ABILITIES, FACT_SESSION_SIZE, load_benchmark, longmemeval_time
from qgmem_train.errors import InputError

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"
LME = DATA / "longmemeval_s_tiny.json"
FACTS = DATA / "factconsolidation_tiny.json"


def test_locomo_questions_have_answers_types_and_time() -> None:
    bench = load_benchmark("locomo", ROOT / "samples" / "locomo_sample.json")
    assert [c.id for c in bench.conversations] == ["conv-26"]
    q = bench.questions[0]
    assert (q.id, q.qtype, q.reference, q.question_time, q.evidence) == ("conv-26/0", "temporal", "7 May 2023", "2023-06-27T10:37:00", ["D1:3"])
    assert {q.qtype for q in bench.questions} <= {"multi-hop", "temporal", "open-domain", "single-hop"}


def test_beam_sample_has_ten_abilities_with_nuggets() -> None:
    bench = load_benchmark("beam", ROOT / "samples" / "beam")
    assert {c.id for c in bench.conversations} == {"beam-1", "beam-2"}
    assert sorted(q.qtype for q in bench.questions) == sorted(BEAM_ABILITIES)
    ordering = next(q for q in bench.questions if q.qtype == "event_ordering")
    assert ordering.nuggets == ["Core functionality", "Transaction error handling", "Security and deployment"]
    assert ordering.evidence == ["4", "60", "116"] and ordering.conversation_id == "beam-1" and ordering.question_time
    assert all(q.reference and q.nuggets for q in bench.questions)


def test_longmemeval_sessions_dates_evidence_and_abstention() -> None:
    bench = load_benchmark("longmemeval", LME)
    assert [c.id for c in bench.conversations] == ["tiny_ss_user_1", "tiny_ku_1", "tiny_temporal_1_abs"]
    first = bench.conversations[0]
    assert [(s.id, s.time) for s in first.sessions] == [("s_a1", "2023-05-20T02:21:00"), ("s_a2", "2023-05-27T18:40:00")]
    assert first.sessions[0].turns[0].id == "s_a1:0" and first.sessions[0].turns[0].speaker == "user"
    assert bench.questions[1].evidence == ["s_b1:0", "s_b2:0"] and bench.questions[1].qtype == "knowledge-update"
    assert bench.questions[2].qtype == "abstention" and bench.questions[0].question_time == "2023-06-01T10:15:00"
    assert longmemeval_time("2023/05/20", "x") == "2023-05-20"


def test_factconsolidation_facts_become_ordered_turns() -> None:
    bench = load_benchmark("factconsolidation", FACTS)
    turns = [t for s in bench.conversations[0].sessions for t in s.turns]
    assert [t.id for t in turns] == [f"fact-0:{n}" for n in range(5)] and turns[2].text == "The capital of Veloria is Brisk."
    assert all(len(s.turns) <= FACT_SESSION_SIZE and s.time is None for s in bench.conversations[0].sessions)
    assert [(q.qtype, q.reference) for q in bench.questions] == [("multi-hop", "Brisk"), ("multi-hop", "Brisk"), ("single-hop", "violin or the violin")]


@pytest.mark.parametrize(
    "name,source,edit,needle",
    [
        ("longmemeval", LME, lambda d: d[1].pop("question_type"), "record tiny_ku_1.question_type"),
        ("longmemeval", LME, lambda d: d[0].update(haystack_dates=["yesterday", "2023/05/27 (Sat) 18:40"]), "record tiny_ss_user_1.haystack_dates[0]"),
        ("longmemeval", LME, lambda d: d[0]["haystack_sessions"][1][0].pop("content"), "haystack_sessions[1][0].content"),
        ("longmemeval", LME, lambda d: d[2]["haystack_session_ids"].append("extra"), "record tiny_temporal_1_abs.haystack_sessions"),
        ("factconsolidation", FACTS, lambda d: d[1].update(answers=[]), "record 1.answers"),
        ("factconsolidation", FACTS, lambda d: d[0].update(context="no numbered facts"), "record 0.context"),
        ("factconsolidation", FACTS, lambda d: d[1].update(answers=[[3]]), "record 1.answers[0]"),
    ],
)
def test_bad_records_name_file_record_and_field(tmp_path: Path, name: str, source: Path, edit, needle: str) -> None:
    data = json.loads(source.read_text())
    edit(data)
    path = tmp_path / source.name
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        load_benchmark(name, path)
    assert needle in str(info.value) and str(path) in str(info.value)


def test_bad_beam_probing_questions_and_missing_input(tmp_path: Path) -> None:
    chat = tmp_path / "7"
    (chat / "probing_questions").mkdir(parents=True)
    (chat / "chat.json").write_text((ROOT / "samples" / "beam" / "1" / "chat.json").read_text())
    (chat / "probing_questions" / "probing_questions.json").write_text(json.dumps({"summarization": [{"question": "q?", "rubric": [], "ideal_summary": "s"}]}))
    with pytest.raises(InputError, match=r"summarization\[0\]\.rubric"):
        load_benchmark("beam", tmp_path)
    (chat / "probing_questions" / "probing_questions.json").write_text(json.dumps({"telepathy": []}))
    with pytest.raises(InputError, match="unknown ability"):
        load_benchmark("beam", tmp_path)
    with pytest.raises(InputError, match="input not found"):
        load_benchmark("longmemeval", tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("[{")
    with pytest.raises(InputError, match="not valid JSON"):
        load_benchmark("factconsolidation", tmp_path / "broken.json")


def test_conversations_export_round_trips_through_the_plain_loader(tmp_path: Path) -> None:
    from qgmem_train.__main__ import main
    from qgmem_train.memory.loaders import load_conversations

    out = tmp_path / "lme.jsonl"
    assert main(["eval", "conversations", "--benchmark", "longmemeval", "--input", str(LME), "--out", str(out)]) == 0
    assert load_conversations("jsonl", out) == load_benchmark("longmemeval", LME).conversations


def _beam_with_a_long_id(tmp_path: Path) -> list[str]:
    chat = tmp_path / "beam" / "1" / "chat.json"
    chat.parent.mkdir(parents=True)
    chat.write_text((ROOT / "samples" / "beam" / "1" / "chat.json").read_text().replace('"id": 0,', f'"id": {"9" * 5000},', 1))
    return ["eval", "conversations", "--benchmark", "beam", "--input", str(chat.parent.parent), "--out", str(tmp_path / "beam.jsonl")]


def _locomo_with_a_long_session_key(tmp_path: Path) -> list[str]:
    data = json.loads((ROOT / "samples" / "locomo_sample.json").read_text())
    data[0]["conversation"]["session_" + "9" * 5000] = []
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(data))
    return ["eval", "conversations", "--benchmark", "locomo", "--input", str(path), "--out", str(tmp_path / "locomo.jsonl")]


def _report_folder_that_is_a_file(tmp_path: Path) -> list[str]:
    (tmp_path / "report").write_text("a file of the user's")
    return ["eval", "retrieval", "--dataset", "locomo", "--input", str(ROOT / "samples" / "locomo_sample.json"), "--store", str(tmp_path / "no-store"),
            "--out", str(tmp_path / "report"), "--intent", "rules"]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (_beam_with_a_long_id, "beam/1/chat.json: not readable JSON: a number longer than 4300 digits"),
        (_locomo_with_a_long_session_key, "locomo.json: sample conv-26.conversation.session_999999999999...: a session number longer than 9 digits"),
        (_report_folder_that_is_a_file, "report: exists and is not a folder: --out names the report folder"),
    ],
)
def test_hostile_input_to_eval_is_one_line_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str], make, needle: str) -> None:
    from qgmem_train.__main__ import main

    assert main(make(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err and "Traceback" not in err, err[-500:]
