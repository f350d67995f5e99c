"""Trajectory schema round trip, bad records, deterministic case splits, and the data module's batches."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from qgmem_train.errors import InputError
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.trajectory import TRAJECTORY_FEATURES, TrajectoryExample, read_trajectory_dataset, split_of_case, write_trajectory_dataset
from tests.tiny_decoder import FIXTURE


def example(case: str, number: int) -> TrajectoryExample:
    graph = LocalGraph(node_labels=["Alice", "Paris"], edge_src=[0], edge_dst=[1], edge_labels=["moved to"], edge_unit_labels=["F1"])
    return TrajectoryExample(
        case_id=case, question_id=f"{case}/q{number}", source_dataset="convomem/user_evidence", namespace=case,
        question="Where does Alice live?", question_time="2023-06-01", context="Facts:\n[F1] Alice | moved to | Paris",
        answer="Paris", reasoning_path="F1 says so.", graph=graph, unit_ids=["u1"],
    )


def test_record_round_trip_matches_the_features() -> None:
    original = example("c1", 0)
    record = original.to_record()
    assert set(record) == set(TRAJECTORY_FEATURES)
    assert TrajectoryExample.from_record(record) == original
    assert original.target_json() == '{"reasoning_path": "F1 says so.", "answer": "Paris"}'


@pytest.mark.parametrize(
    ("change", "field"),
    [({"edge_dst": [5]}, "edge_src"), ({"edge_labels": []}, "edge_src"), ({"edge_unit_labels": []}, "edge_src"), ({"answer": " "}, "answer"),
     ({"schema_version": 1}, "schema_version")],
)
def test_bad_records_name_the_field(change, field) -> None:
    record = {**example("c1", 0).to_record(), **change}
    with pytest.raises(InputError, match=f"rows\\[3\\].{field}"):
        TrajectoryExample.from_record(record, "rows[3]")


def test_single_split_folder_is_split_by_case_hash(tmp_path) -> None:
    examples = [example(f"case-{i}", j) for i in range(40) for j in range(2)]
    write_trajectory_dataset({"all": examples}, tmp_path / "traj")
    assert read_trajectory_dataset(tmp_path / "traj")["all"] == examples
    data = TrajectoryDataModule(str(tmp_path / "traj"), validation_fraction=0.2, test_fraction=0.2)
    data.setup("fit")
    cases = {name: {ex.case_id for ex in part} for name, part in data.splits.items()}
    assert all(cases[name] for name in cases) and not (cases["train"] & cases["validation"]) and not (cases["train"] & cases["test"])
    assert sum(len(p) for p in data.splits.values()) == 80


def test_case_splits_agree_across_processes_with_different_hash_seeds() -> None:
    """The split of a case must not depend on Python's per-process string hash (``PYTHONHASHSEED``).

    The subprocesses run the source of :func:`split_of_case` (importing its module takes
    seconds of datasets and torch); a dependency on module globals fails loudly there as a NameError.
    """
    cases = [f"locomo/conv-{i}" for i in range(200)]
    script = (
        "import hashlib, json, math, sys\n"
        f"{inspect.getsource(split_of_case)}\n"
        "print(json.dumps([split_of_case(c, 0.2, 0.2) for c in json.loads(sys.argv[1])]))"
    )
    here = [split_of_case(case, 0.2, 0.2) for case in cases]
    assert set(here) == {"train", "validation", "test"}
    for seed in ("0", "1"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == here, f"PYTHONHASHSEED={seed} splits cases differently"


def test_fixture_batches_carry_examples_and_graph_features() -> None:
    data = TrajectoryDataModule(str(FIXTURE), batch_size=3, shuffle=False)
    data.setup("fit")
    assert {name: len(part) for name, part in data.splits.items()} == {"train": 8, "validation": 2, "test": 2}
    batch = next(iter(data.train_dataloader()))
    graph = batch["graph"]
    assert len(batch["examples"]) == 3 and graph.num_graphs == 3
    assert graph.x.shape[1] == data.feature_dim == graph.edge_attr.shape[1]
    assert torch.allclose(graph.x.norm(dim=1), torch.ones(graph.num_nodes), atol=1e-4)
    first = batch["examples"][0]
    assert graph.edge_labels[0] == first.graph.edge_labels and first.graph.num_edges <= 6


def test_missing_folder_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(InputError, match="not found"):
        read_trajectory_dataset(tmp_path / "nope")
