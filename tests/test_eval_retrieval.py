"""Retrieval metrics on hand-computed examples, and ``eval retrieval`` end to end on the committed LoCoMo sample."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from qgmem_train.__main__ import main
from qgmem_train.metrics.retrieval import (
    aggregate,
    ndcg_at_k,
    precision_at_k,
    question_metrics,
    ranking_metrics,
    recall_at_k,
    recall_curve,
    sufficiency_at_k,
)
from qgmem_train.benchmarks.loaders import load_locomo_questions, spread_subset

SAMPLE = Path(__file__).parent.parent / "samples" / "locomo_sample.json"
RANKED = [["D1:1"], ["D1:5", "D1:6"], ["D2:3"], ["D1:2"]]


def test_metrics_match_hand_computation() -> None:
    gold = {"D1:2", "D1:6", "D9:9"}
    assert recall_at_k(RANKED, gold, 2) == pytest.approx(1 / 3)
    assert recall_at_k(RANKED, gold, 4) == pytest.approx(2 / 3)
    assert precision_at_k(RANKED, gold, 4) == pytest.approx(2 / 4)
    assert precision_at_k(RANKED, gold, 10) == pytest.approx(2 / 10)
    assert sufficiency_at_k(RANKED, gold, 10) == 0.0 and sufficiency_at_k(RANKED, {"D1:6", "D1:2"}, 4) == 1.0
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    ideal = 1 + 1 / math.log2(3)
    assert ndcg_at_k(RANKED, gold, 10, n_relevant=2) == pytest.approx(dcg / ideal)
    assert ndcg_at_k(RANKED, gold, 1, n_relevant=2) == 0.0 and ndcg_at_k(RANKED, gold, 10, n_relevant=0) == 0.0
    assert recall_curve(RANKED, gold, [1, 2, 3, 4]) == pytest.approx([0, 1 / 3, 1 / 3, 2 / 3])
    assert set(question_metrics(RANKED, gold, 10, 2)) == {"recall@10", "precision@10", "sufficiency@10", "ndcg@10"}


def test_ranking_metrics_key_each_ranking_and_count_relevant_units_over_the_whole_namespace() -> None:
    sources = {"a": ["D1:1"], "b": ["D1:5", "D1:6"], "c": ["D2:3"], "d": ["D1:2"], "e": ["D1:2"]}
    gold = {"D1:2", "D1:6", "D9:9"}
    out = ranking_metrics({"fused": ["a", "b", "c", "d"], "dense": ["d", "a"]}, sources, gold, 10)
    assert {key: out[f"fused/{key}"] for key in question_metrics(RANKED, gold, 10, 3)} == question_metrics(RANKED, gold, 10, 3)
    assert out["dense/ndcg@10"] == pytest.approx(ndcg_at_k([["D1:2"], ["D1:1"]], gold, 10, n_relevant=3))
    assert len(out) == 8


def test_aggregate_means_and_categories() -> None:
    records = [{"category": 1, "recall@10": 1.0}, {"category": 1, "recall@10": 0.0}, {"category": 4, "recall@10": 0.5}]
    out = aggregate(records, ["recall@10"])
    assert out == {"n_questions": 3, "recall@10": 0.5, "recall@10/cat1": 0.5, "n_questions/cat1": 2, "recall@10/cat4": 0.5, "n_questions/cat4": 1}


def test_question_loader_splits_evidence_and_skips_category_5(tmp_path: Path) -> None:
    data = [{"sample_id": "c1", "qa": [
        {"question": "a?", "answer": "x", "evidence": ["D1:1; D1:2"], "category": 1},
        {"question": "b?", "adversarial_answer": "y", "evidence": ["D1:3"], "category": 5},
        {"question": "c?", "answer": "z", "evidence": [], "category": 4},
    ]}]
    path = tmp_path / "l.json"
    path.write_text(json.dumps(data))
    questions = load_locomo_questions(path)
    assert [(q.question, q.evidence) for q in questions] == [("a?", ["D1:1", "D1:2"])]
    assert spread_subset(list(range(10)), 3) == [0, 3, 6] and spread_subset([1, 2], None) == [1, 2]


def test_bad_question_record_names_file_record_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"sample_id": "c1", "conversation": {"session_1": []}, "qa": [{"question": "a?", "category": "x"}]}]))
    with pytest.raises(Exception) as info:
        load_locomo_questions(path)
    assert "sample c1.qa[0].category" in str(info.value)


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory, locomo_turns_store) -> Path:
    """The committed LoCoMo sample built in turns mode (no LLM, no traces)."""
    return locomo_turns_store(tmp_path_factory.mktemp("eval") / "store")


def test_eval_retrieval_cli_end_to_end(sample_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    code = main(["eval", "retrieval", "--dataset", "locomo", "--input", str(SAMPLE), "--store", str(sample_store), "--out", str(out),
                 "--reranker", "none", "--intent", "rules", "--limit", "12"])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("recall@10", "precision@10", "sufficiency@10", "ndcg@10"):
        assert 0.0 <= metrics[key] <= 1.0 and key in metrics and f"bm25/{key}" in metrics and f"fused/{key}" in metrics
    assert metrics["n_questions"] == 12 and metrics["recall@10"] == metrics["fused/recall@10"] > 0.3
    assert any(key.startswith("recall@10/cat") for key in metrics)
    assert metrics["models"]["embedder"] and metrics["settings"]["retrieval"]["kappa"] == 60 and metrics["rankings"] == ["bm25", "dense", "attr", "fused"]
    lines = (out / "questions.jsonl").read_text().splitlines()
    assert len(lines) == 12 and len(json.loads(lines[0])["working_memory"]) == 10
    assert (out / "recall_at_k.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--channels", "bm25,colbert"], "retrieval.channels"),
        (["--limit", "0"], "--limit"),
        (["--conversation", "conv-99"], "conv-99"),
    ],
)
def test_eval_retrieval_bad_input_exits_2(sample_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    code = main(["eval", "retrieval", "--dataset", "locomo", "--input", str(SAMPLE), "--store", str(sample_store), "--out", str(tmp_path / "o"),
                 "--reranker", "none", "--intent", "rules", *extra])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and not (tmp_path / "o").exists()


@pytest.fixture
def two_conversations(tmp_path: Path) -> Path:
    """The sample's conversation and a second one the sample store was not built from."""
    data = json.loads(SAMPLE.read_text())
    path = tmp_path / "two.json"
    path.write_text(json.dumps([data[0], {**data[0], "sample_id": "conv-unbuilt"}]))
    return path


def test_eval_retrieval_evaluates_the_conversations_the_store_holds(sample_store: Path, two_conversations: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "report"
    code = main(["eval", "retrieval", "--dataset", "locomo", "--input", str(two_conversations), "--store", str(sample_store), "--out", str(out),
                 "--reranker", "none", "--intent", "rules", "--limit", "6"])
    assert code == 0
    printed = capsys.readouterr().out
    assert f"evaluating 1 of 2 conversations; not in {sample_store}, skipped: conv-unbuilt" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["settings"]["conversations"] == ["conv-26"] and metrics["settings"]["skipped_conversations"] == ["conv-unbuilt"]
    records = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    assert metrics["n_questions"] == len(records) == 6 and {r["conversation"] for r in records} == {"conv-26"}


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--conversation", "conv-unbuilt"], "namespace conv-unbuilt: not in the store"),
        (["--conversation", "conv-26", "conv-unbuilt"], "namespace conv-unbuilt: not in the store"),
    ],
)
def test_eval_retrieval_of_a_named_conversation_missing_from_the_store_exits_2(
    sample_store: Path, two_conversations: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    code = main(["eval", "retrieval", "--dataset", "locomo", "--input", str(two_conversations), "--store", str(sample_store),
                 "--out", str(tmp_path / "o"), "--reranker", "none", "--intent", "rules", *extra])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and not (tmp_path / "o").exists()


def test_eval_retrieval_over_a_store_of_none_of_the_conversations_exits_2(sample_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(SAMPLE.read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{**data[0], "sample_id": "conv-unbuilt"}]))
    code = main(["eval", "retrieval", "--dataset", "locomo", "--input", str(other), "--store", str(sample_store), "--out", str(tmp_path / "o"),
                 "--reranker", "none", "--intent", "rules"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds none of the input's conversations (conv-unbuilt)" in err[0]


def test_eval_retrieval_missing_store_and_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["eval", "retrieval", "--dataset", "locomo", "--out", str(tmp_path / "o"), "--intent", "rules", "--reranker", "none"]
    assert main([*base, "--input", str(SAMPLE), "--store", str(tmp_path / "nostore")]) == 2
    assert "no memory store" in capsys.readouterr().err
    assert main([*base, "--input", str(tmp_path / "missing.json"), "--store", str(tmp_path)]) == 2
    assert "missing.json" in capsys.readouterr().err
