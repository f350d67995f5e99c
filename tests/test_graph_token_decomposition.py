"""Step 0's decomposition across saved runs: paired differences of parts measured in different step folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.graph_token.decomposition import main


def saved_part(path: Path, prompt: str, losses: dict[str, float]) -> Path:
    path.write_text(json.dumps({"losses": {q: {"loss": v, "answer_loss": v} for q, v in losses.items()}, "wall_s": 1.0,
                                "settings": {"prompt": prompt, "retrieval": "oracle", "units": "as stored", "graph": "none"}}))  # fmt: skip
    return path


def test_parts_of_different_runs_are_compared_per_question_and_per_category(tmp_path: Path) -> None:
    question = saved_part(tmp_path / "q.json", "question", {"a": 5.0, "b": 4.0, "c": 6.0})
    context = saved_part(tmp_path / "c.json", "context-oracle", {"a": 4.0, "b": 4.0, "c": 3.0})
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"questions": {"a": {"category": "x"}, "b": {"category": "x"}, "c": {"category": "y"}}}))
    out = tmp_path / "report"
    assert main(["--out", str(out), "--part", f"question={question}", "--part", f"named={context}", "--compare", "question:named",
                 "--split", str(split), "--note", "a reading"]) == 0  # fmt: skip
    result = json.loads((out / "results.json").read_text())
    (found,) = result["comparisons"]
    assert found["mean_difference"] == pytest.approx((1.0 + 0.0 + 3.0) / 3)
    assert found["per_category"]["x"]["mean_difference"] == pytest.approx(0.5)
    assert found["per_category"]["y"]["mean_difference"] == pytest.approx(3.0)
    assert [p["mean"] for p in result["parts"]] == [pytest.approx(5.0), pytest.approx(11 / 3)]
    text = (out / "results.md").read_text()
    assert "| question | named | +1.333 |" in text and "a reading" in text
    assert main(["--report-only", str(out / "results.json"), "--check"]) == 0


def test_parts_over_other_questions_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    question = saved_part(tmp_path / "q.json", "question", {"a": 5.0, "b": 4.0})
    other = saved_part(tmp_path / "o.json", "triples-oracle", {"a": 4.0, "z": 4.0})
    assert main(["--out", str(tmp_path / "r"), "--part", f"question={question}", "--part", f"other={other}", "--compare", "question:other"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "o.json" in err and "\n" not in err
    assert not (tmp_path / "r").exists()
