"""The alignment stage end to end with the real CPU models: its data (never a test conversation), its fit from
configs/align-cpu.yaml, and a task fit started from its checkpoint (``model.init_from``), or refused in one line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from data_prep.__main__ import main as data_prep_main
from data_prep.align import case_splits
from data_prep.config import DataPrepConfig, load_data_prep_config
from data_prep.run import draw
from export.__main__ import main as export_main
from qgmem_train.__main__ import main
from qgmem_train.graph.facts import graph_facts_text
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.llm.prompts import ALIGNMENT_INSTRUCTION
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.trajectory import TrajectoryExample, read_trajectory_dataset, split_of_case, trajectory_graph_settings, write_trajectory_dataset

ROOT = Path(__file__).resolve().parents[1]
DEMO_PREP = ROOT / "configs" / "data_prep" / "demo-cpu.yaml"
ALIGN = ROOT / "configs" / "align-cpu.yaml"
TASK = ROOT / "configs" / "demo-cpu.yaml"


def data_prep(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "data_prep", *args], capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.fixture(scope="module")
def align_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Alignment data over all six sample cases (one session and one question each, three pseudo-queries): the config and the output."""
    tmp = tmp_path_factory.mktemp("align")
    raw = yaml.safe_load(DEMO_PREP.read_text())
    raw["data_prep"].update(
        source=str(ROOT / "samples" / "convomem_cases"),
        categories={"category_1_basic_facts": 1, "category_2_temporal": 1, "category_4_multi_session": 1},
        total_cases=6, max_questions_per_case=1, max_sessions_per_case=1, validation_fraction=0.25, test_fraction=0.25, out=str(tmp / "prep"),
    )  # fmt: skip
    config = tmp / "prep.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = data_prep("align", "--config", str(config), "--pseudo-queries", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    return config, tmp / "prep" / "align"


@pytest.mark.slow
def test_alignment_data_never_holds_a_test_conversation(align_data: tuple[Path, Path], capfd: pytest.CaptureFixture[str]) -> None:
    config, out = align_data
    cfg, pipeline = load_data_prep_config(config)
    drawn = {ref.case_id: split_of_case(ref.case_id, cfg.validation_fraction, cfg.test_fraction) for ref in draw(cfg, pipeline)[1]}
    assert "test" in drawn.values(), "the sample draw holds a test case, so leaving it out is checked"
    splits = read_trajectory_dataset(out / "dataset")
    assert set(splits) == {"train", "validation"}
    assert trajectory_graph_settings(out / "dataset") == pipeline.to_dict()["graph"]
    cases = {name: {ex.case_id for ex in examples} for name, examples in splits.items()}
    assert cases["train"] and cases["validation"] and not cases["train"] & cases["validation"]
    for name, examples in splits.items():
        for ex in examples:
            assert drawn[ex.case_id] == name, f"{ex.case_id} is a {drawn[ex.case_id]} case, found in {name}"
            assert ex.question == ALIGNMENT_INSTRUCTION and ex.context == "" and ex.graph.num_edges > 0
            assert ex.answer == graph_facts_text(ex.graph)
    for case in cases["train"] | cases["validation"]:
        facts = [ex.answer for examples in splits.values() for ex in examples if ex.case_id == case]
        assert len(facts) == len(set(facts)), f"{case}: a graph is kept once per case"
    assert sum(map(len, splits.values())) > len(cases["train"]) + len(cases["validation"]), "pseudo-queries add graphs beyond the questions"

    # The rerun and the refused one in this process: the fixture's run and the bad-input test go through the CLI's own process.
    before = {name: [ex.to_record() for ex in examples] for name, examples in splits.items()}
    rerun = data_prep_main(["align", "--config", str(config), "--pseudo-queries", "3"])
    assert rerun == 0, capfd.readouterr().err[-3000:]
    capfd.readouterr()  # the rerun's own lines: the refused run below must print one
    assert {name: [ex.to_record() for ex in examples] for name, examples in read_trajectory_dataset(out / "dataset").items()} == before
    assert data_prep_main(["align", "--config", str(config), "--pseudo-queries", "4"]) == 2
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "align.json" in err, err


def test_a_split_folder_decides_the_split_and_its_test_cases_never_count(tmp_path: Path) -> None:
    graph = LocalGraph(["a", "b"], [0], [1], ["likes"], ["F1"])

    def example(case_id: str) -> TrajectoryExample:
        return TrajectoryExample(case_id, f"{case_id}/q0", "convomem/x", "ns", "q?", "", "", "an answer", "", graph)

    folder = write_trajectory_dataset({"train": [example("A"), example("B")], "validation": [example("C")], "test": [example("B")]}, tmp_path / "t")
    assert case_splits(DataPrepConfig(), ["A", "B", "C", "D"], str(folder)) == {"A": "train", "B": "test", "C": "validation"}


def test_alignment_bad_input_is_one_line(tmp_path: Path) -> None:
    missing = data_prep("align", "--config", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1 and "missing.yaml" in missing.stderr
    negative = data_prep("align", "--config", str(DEMO_PREP), "--pseudo-queries", "-1")
    assert negative.returncode == 2 and "--pseudo-queries" in negative.stderr


def _fit(config: Path, root: Path, *args: str) -> int:
    return main([
        "fit", "--config", str(config),
        "--trainer.default_root_dir", str(root), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--checkpoint.dirpath", str(root / "ckpt"), *args,
    ])  # fmt: skip


@pytest.mark.slow
def test_an_aligned_checkpoint_starts_a_task_fit_that_names_it(align_data: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = align_data
    # Four examples a split: one batch to train on twice, one validation batch that still measures the graph reading.
    align = ["--data.path", str(out / "dataset"), "--data.max_examples", "4", "--trainer.max_steps", "2", "--trainer.val_check_interval", "2"]
    assert _fit(ALIGN, tmp_path / "align", *align) == 0
    assert "graph reading:" in capsys.readouterr().out
    aligned = tmp_path / "align" / "ckpt" / "last.ckpt"

    # Learning rate 0: the task fit's graph path stays what it started from, so its checkpoint shows what was loaded.
    task = ["--data.max_examples", "2", "--model.prompt.max_context_tokens", "24", "--model.generation.val_generate", "false",
            "--trainer.max_steps", "1", "--trainer.val_check_interval", "1", "--model.optim.learning_rate", "0.0"]  # fmt: skip
    assert _fit(TASK, tmp_path / "task", "--model.init_from", str(aligned), *task) == 0
    started = torch.load(tmp_path / "task" / "ckpt" / "last.ckpt", weights_only=True)
    source = torch.load(aligned, weights_only=True)
    record = started["qgmem"]["init_from"]
    assert record["path"] == str(aligned) and record["sha256"] == hashlib.sha256(aligned.read_bytes()).hexdigest()
    assert record["graph_reading"] == source["qgmem"]["graph_reading"]
    assert set(started["state_dict"]) == set(source["state_dict"])
    for name, tensor in source["state_dict"].items():
        assert torch.equal(started["state_dict"][name], tensor), name
    loaded = GraphAugmentedLM.load_from_checkpoint(tmp_path / "task" / "ckpt" / "last.ckpt")
    assert loaded.hparams.init_from is None and loaded.init_record == record, "a loaded model keeps its own weights and the record"

    exported = tmp_path / "export"
    assert export_main(["--checkpoint", str(tmp_path / "task" / "ckpt" / "last.ckpt"), "--config", str(TASK), "--out", str(exported)]) == 0
    training = json.loads((exported / "config.json").read_text())["training"]
    assert training["init_from"]["name"] == "last.ckpt" and training["init_from"]["sha256"] == record["sha256"]
    assert str(tmp_path) not in (exported / "graph_adapter.safetensors").read_bytes().decode("latin-1"), "no path of this machine"
    assert f"started from `last.ckpt` (SHA-256 `{record['sha256']}`)" in (exported / "README.md").read_text()

    capsys.readouterr()
    refused = _fit(TASK, tmp_path / "refused", "--model.init_from", str(aligned), "--model.encoder.hidden_dim", "128", *task)
    err = capsys.readouterr().err.strip().splitlines()
    assert refused == 2 and len(err) == 1 and "model.init_from" in err[0] and "config_hash" in err[0]
