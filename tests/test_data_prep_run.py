"""Data prep end to end with the real CPU models: one run, kill and resume, two shards merged.

Every stage runs for real (turns-mode construction, activation); the demo config targets gold answers,
so no answer is generated or judged and the dataset does not depend on what a small judge decides. The
judge path (and the gold path's skipping of it) is checked in process with a scripted LLM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from data_prep.__main__ import main
from qgmem_train.trajectory import read_trajectory_dataset, trajectory_graph_settings

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "data_prep" / "demo-cpu.yaml"

pytestmark = pytest.mark.slow


def make_config(tmp: Path, name: str) -> Path:
    """The demo config cut to two cases of one question each, writing under ``tmp/name``."""
    raw = yaml.safe_load(DEMO.read_text())
    raw["data_prep"].update(
        source=str(ROOT / "samples" / "convomem_cases"),
        categories={"category_2_temporal": 1, "category_4_multi_session": 1},
        total_cases=2,
        max_questions_per_case=1,
        max_sessions_per_case=1,
        out=str(tmp / name),
    )
    raw["pipeline"]["generation"]["max_new_tokens"] = 64
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def data_prep(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "data_prep", *args], capture_output=True, text=True, timeout=900, cwd=ROOT)


def rows(out: Path) -> dict[str, list[dict]]:
    return {split: [ex.to_record() for ex in examples] for split, examples in read_trajectory_dataset(out / "dataset").items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("dp")
    config = make_config(tmp, "one")
    result = data_prep("--config", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp, tmp / "one"


def test_one_run_writes_a_dataset_the_data_module_loads(reference: tuple[Path, Path]) -> None:
    from qgmem_train.model.datamodule import TrajectoryDataModule

    _, out = reference
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == "gold"
    assert len(manifest["cases"]) == 2
    assert trajectory_graph_settings(out / "dataset") == manifest["config"]["pipeline"]["graph"]
    assert sum(manifest["counts"]["per_split"].values()) == 2
    assert set(manifest["seconds_per_case"]) >= {"construction", "activation", "total"}
    assert not {"answer", "judge"} & set(manifest["seconds_per_case"]) and manifest["stages"] == ["construction", "activation"]
    assert manifest["cases_per_hour"] > 0 and manifest["questions_per_hour"] > 0
    per_category = manifest["counts"]["per_category"]
    assert {c: v["questions"] for c, v in per_category.items()} == {"category_2_temporal": 1, "category_4_multi_session": 1}
    records = [json.loads(p.read_text()) for p in (out / "shards" / "0-of-1" / "cases").glob("*.json")]
    for record in records:
        (question,) = record["questions"]
        assert question["units"] and all(u["source_turn_ids"] for u in question["units"])
        assert question["context"].strip() and question["prompt_tokens"] > question["context_tokens"] > 0
        assert len(question["graph"]["edge_src"]) == len(question["units"])
        assert question["answer"] is None and question["correct"] is None and question["judgments"] == []
        assert record["stages"] == ["construction", "activation"] and not {"answer", "judge"} & set(record["seconds"])
    module = TrajectoryDataModule(str(out / "dataset"), batch_size=1)
    module.setup("validate")
    split = next(name for name, part in module.splits.items() if part)
    loaders = {"train": module.train_dataloader, "validation": module.val_dataloader, "test": module.test_dataloader}
    batch = next(iter(loaders[split]()))
    assert batch["graph"].num_graphs == 1
    assert batch["examples"][0].answer in {q["gold_answer"] for r in records for q in r["questions"]}


def test_kill_and_resume_equals_one_run(reference: tuple[Path, Path]) -> None:
    tmp, one = reference
    config = make_config(tmp, "killed")
    process = subprocess.Popen([sys.executable, "-m", "data_prep", "--config", str(config)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    cases = tmp / "killed" / "shards" / "0-of-1" / "cases"
    deadline = time.monotonic() + 600
    while not any(cases.glob("*.json")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert len(list(cases.glob("*.json"))) == 1, "the kill should land after the first of two cases"
    assert not (tmp / "killed" / "manifest.json").exists()
    assert main(["--config", str(config)]) == 0  # the resume runs in this process: the reference came from a process of its own
    assert rows(tmp / "killed") == rows(one)


def test_two_shards_merged_equal_one_run(reference: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Shards and merges run in this process (the CLI's ``main``), so no run here imports the libraries again; the
    reference they must equal came from a process of its own."""
    tmp, one = reference
    config = str(make_config(tmp, "sharded"))
    assert main(["--config", config, "--shard", "1/2"]) == 0
    capsys.readouterr()
    assert main(["merge", "--config", config]) == 2
    assert "shard 0/2 is missing" in capsys.readouterr().err
    assert main(["--config", config, "--shard", "0/2"]) == 0
    assert main(["merge", "--config", config]) == 0
    assert rows(tmp / "sharded") == rows(one)


def test_merge_refuses_shards_of_another_config(reference: tuple[Path, Path]) -> None:
    tmp, one = reference
    raw = yaml.safe_load(make_config(tmp, "one").read_text())
    raw["data_prep"]["seed"] = 99
    other = tmp / "other.yaml"
    other.write_text(yaml.safe_dump(raw))
    result = data_prep("merge", "--config", str(other))
    assert result.returncode == 2
    assert "made with another config" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_merge_refuses_a_case_run_before_graph_edges_carried_their_units_labels(reference: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, one = reference
    copy = shutil.copytree(one, tmp_path / "one")
    raw = yaml.safe_load(make_config(tmp, "one").read_text())
    raw["data_prep"]["out"] = str(copy)
    config = tmp_path / "copy.yaml"
    config.write_text(yaml.safe_dump(raw))
    case = sorted(copy.glob("shards/*/cases/*.json"))[0]
    record = json.loads(case.read_text())
    for question in record["questions"]:
        del question["graph"]["edge_unit_labels"]
    case.write_text(json.dumps(record))
    result = data_prep("merge", "--config", str(config))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr[-2000:]
    assert case.name in result.stderr and "trajectory schema 2" in result.stderr


def _scripted_reply(chat: list[dict[str, str]]) -> str:
    """A valid answer to every final-answer prompt; the judge accepts answers to temporal questions only."""
    text = chat[-1]["content"]
    if "Reference answer" in text:
        verdict = "correct" if "When" in text or "when" in text else "incorrect"
        return json.dumps({"judgment": verdict, "reason": "scripted"})
    return json.dumps({"reasoning_path": "F1", "answer": "scripted answer"})


def _in_process_run(tmp: Path, name: str, target: str, monkeypatch: pytest.MonkeyPatch):
    """Run and merge the two-case config in this process with a scripted LLM; returns (llm, out, manifest).

    Traces are off: their trajectories are memory, written by the LLM in every target mode.
    """
    import data_prep.run as run_module
    from data_prep.config import load_data_prep_config
    from data_prep.merge import merge
    from qgmem_train.llm import factory
    from tests.fakes import ScriptedLLM

    raw = yaml.safe_load(make_config(tmp, name).read_text())
    raw["data_prep"].update(target=target, max_questions_per_case=2)
    raw["pipeline"]["construction"]["traces"] = False
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump(raw))
    llm = ScriptedLLM(_scripted_reply)
    monkeypatch.setattr(factory, "build_llm", lambda pipeline: llm)
    cfg, pipeline = load_data_prep_config(config)
    run_module.run_shard(cfg, pipeline)
    return llm, tmp / name, merge(cfg, pipeline)


def test_gold_run_generates_nothing_and_merge_keeps_every_question(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm, out, manifest = _in_process_run(tmp_path, "gold", "gold", monkeypatch)
    assert llm.calls == []
    records = [json.loads(p.read_text()) for p in (out / "shards" / "0-of-1" / "cases").glob("*.json")]
    questions = [q for r in records for q in r["questions"]]
    assert len(questions) == 4 and all(q["answer"] is None and q["correct"] is None and q["judgments"] == [] for q in questions)
    assert all(r["stages"] == ["construction", "activation"] and set(r["seconds"]) == {"construction", "activation", "total"} for r in records)
    assert manifest["stages"] == ["construction", "activation"] and manifest["cases_per_hour"] > 0 and manifest["questions_per_hour"] > 0
    assert manifest["questions_per_hour"] == pytest.approx(2 * manifest["cases_per_hour"], rel=1e-3)
    per_category = manifest["counts"]["per_category"].values()
    assert sum(c["questions"] for c in per_category) == 4 and sum(c.get("dropped", 0) for c in per_category) == 0
    assert all(c["not_judged"] == c["questions"] and c.get("judge_correct", 0) == 0 for c in per_category)
    kept = [row for split in rows(out).values() for row in split]
    assert sorted(r["answer"] for r in kept) == sorted(q["gold_answer"] for q in questions)
    assert all(r["reasoning_path"] and r["context"] for r in kept)


def test_judge_run_answers_judges_and_merge_keeps_only_judge_correct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm, out, manifest = _in_process_run(tmp_path, "judged", "judge_correct", monkeypatch)
    records = [json.loads(p.read_text()) for p in (out / "shards" / "0-of-1" / "cases").glob("*.json")]
    questions = [q for r in records for q in r["questions"]]
    assert len(llm.calls) == 2 * len(questions)  # one answer and one judgment each
    assert all(q["answer"] == "scripted answer" and isinstance(q["correct"], bool) for q in questions)
    assert all(r["stages"] == ["construction", "activation", "answer", "judge"] and {"answer", "judge"} <= set(r["seconds"]) for r in records)
    correct = [q for q in questions if q["correct"]]
    assert 0 < len(correct) < len(questions)
    assert sum(manifest["counts"]["per_split"].values()) == len(correct) and manifest["cases_per_hour"] > 0
    assert all(r["answer"] == "scripted answer" for split in rows(out).values() for r in split)


def test_an_empty_or_partial_case_record_is_computed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _, out, _ = _in_process_run(tmp_path, "partial", "gold", monkeypatch)
    before = rows(out)
    empty, cut = sorted((out / "shards" / "0-of-1" / "cases").glob("*.json"))
    whole = cut.read_text()
    empty.write_text("")
    cut.write_text(whole[: len(whole) // 2])
    config = str(tmp_path / "partial.yaml")
    capsys.readouterr()
    assert main(["merge", "--config", config]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith((f"error: {empty}: the record of case", f"error: {cut}: the record of case")) and "\n" not in err
    assert err.endswith("is empty or partial; rerun the shard to compute it again")
    assert main(["--config", config]) == 0
    assert rows(out) == before
    assert json.loads(cut.read_text())["questions"] == json.loads(whole)["questions"] and json.loads(empty.read_text())["questions"]


@pytest.mark.parametrize("stage", ["data prep", "alignment"])
def test_data_prep_and_alignment_rerank_with_the_configured_reranker_not_the_answering_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                                        stage: str) -> None:  # fmt: skip
    """``reranker: llm`` with ``reranker_model`` set (the paper's Qwen3-Reranker-8B beside Qwen3-8B): the pools are scored
    by the reranker model, as ``ask`` and ``eval`` score them, and the answering LLM scores none."""
    from data_prep.align import build_alignment_data
    from data_prep.config import load_data_prep_config
    from data_prep.run import run_shard
    from qgmem_train.llm import factory
    from tests.fakes import ScriptedLLM

    class Scoring(ScriptedLLM):
        def __init__(self, model_id: str) -> None:
            super().__init__(_scripted_reply)
            self.model_id, self.scored = model_id, 0

        def score_yes_no(self, chats):
            self.scored += len(chats)
            return super().score_yes_no(chats)

    raw = yaml.safe_load(make_config(tmp_path, "reranked").read_text())
    raw["data_prep"]["target"] = "gold"
    raw["pipeline"]["models"].update(reranker="llm", reranker_model="reranker-model")
    raw["pipeline"]["construction"]["traces"] = False
    raw["data_prep"].update(test_fraction=0.0, validation_fraction=0.0)  # every case trains: alignment builds them all
    config = tmp_path / "reranked.yaml"
    config.write_text(yaml.safe_dump(raw))
    answering, reranking = Scoring("answering-model"), Scoring("reranker-model")
    monkeypatch.setattr(factory, "build_llm", lambda pipeline: answering)
    monkeypatch.setattr(factory, "build_reranker_llm", lambda pipeline: reranking)
    cfg, pipeline = load_data_prep_config(config)
    if stage == "data prep":
        run_shard(cfg, pipeline)
    else:
        build_alignment_data(cfg, pipeline, tmp_path / "align", pseudo_queries=1)
    assert reranking.scored > 0 and answering.scored == 0
