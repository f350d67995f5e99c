"""Each study remakes its committed reports from their saved JSON (``python -m experiments.<study> --report-only JSON
--check``): the tables, the reports' numbers, come out as committed. A report whose JSON disagrees with its markdown,
and a file that is not a saved report, are one line and an exit code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.answer_quality import cli as answer_quality
from experiments.reranker import compare, embedder, prior
from experiments.retrieval import channels, paper_pure

REPO = Path(__file__).resolve().parents[1]
SAVED = [
    (answer_quality, "experiments/answer_quality/results/answer_quality.json"),
    (channels, "experiments/retrieval/results/locomo_retrieval.json"),
    (paper_pure, "experiments/retrieval/results/paper_pure_retrieval.json"),
    (embedder, "experiments/reranker/results/embedder_tuning.json"),
    (prior, "experiments/reranker/results/rerank_prior_two_epochs.json"),
    (compare, "experiments/reranker/results/reranker_small_top.json"),
    (compare, "experiments/reranker/results/reranker_context_selection.json"),
]
"""A current report of every study's script (the reranker comparisons whose JSON today's code reads)."""


@pytest.mark.parametrize(("study", "report"), SAVED, ids=[report for _, report in SAVED])
def test_a_committed_report_is_remade_from_its_json(study, report: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert study.main(["--report-only", str(REPO / report), "--check"]) == 0, capsys.readouterr().err


def test_remade_reports_are_written_beside_their_json_and_a_disagreeing_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = REPO / "experiments/answer_quality/results/answer_quality.json"
    report = json.loads(saved.read_text())
    copy = tmp_path / "answer_quality.json"
    copy.write_text(json.dumps(report))
    assert answer_quality.main(["--report-only", str(copy)]) == 0
    assert [line for line in copy.with_suffix(".md").read_text().splitlines() if line.startswith("|")] == [
        line for line in saved.with_suffix(".md").read_text().splitlines() if line.startswith("|")
    ]

    shutil.copy(saved.with_suffix(".md"), copy.with_suffix(".md"))
    name = next(iter(report["benchmarks"]))
    report["benchmarks"][name]["judge_accuracy"] += 0.25
    copy.write_text(json.dumps(report))
    capsys.readouterr()
    assert answer_quality.main(["--report-only", str(copy), "--check"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "table row 3 differs from its JSON's" in lines[0] and f"| {name} |" in lines[0], lines

    (tmp_path / "other.json").write_text(json.dumps({"unrelated": 1}))
    assert answer_quality.main(["--report-only", str(tmp_path / "other.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "not a saved report of this study" in lines[0]
