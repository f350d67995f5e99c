"""No committed result holds an absolute path of the machine it ran on, and the study writers write relative ones."""

from __future__ import annotations

import json
from pathlib import Path

from qgmem_train.reports import ROOT, files_with_machine_paths, machine_paths, portable


def test_the_scan_finds_a_path_planted_in_any_results_folder(tmp_path: Path) -> None:
    for folder in ("experiments/study/results/run", "bench/results"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "experiments/study/results/run/results.json").write_text(json.dumps({"out": "runs/a", "tool": "/usr/bin/time"}))
    (tmp_path / "bench/results/plot.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert files_with_machine_paths(tmp_path) == {}
    (tmp_path / "bench/results/report.md").write_text("Data: `/tmp/traj32` (see ../shared/data), before: ../../tmp/before34\n")
    (tmp_path / "experiments/study/results/run/results.json").write_text(json.dumps({"checkpoint": f"{ROOT}/out/run/best.ckpt"}))
    assert files_with_machine_paths(tmp_path) == {
        "bench/results/report.md": ["/tmp/traj32", "../../tmp/before34"], "experiments/study/results/run/results.json": [f"{ROOT}/out/run/best.ckpt"],
    }


def test_no_committed_result_holds_an_absolute_path_of_the_machine() -> None:
    found = files_with_machine_paths()
    assert not found, f"{len(found)} result files hold absolute paths, e.g. " + "; ".join(f"{f}: {p[0]}" for f, p in list(found.items())[:5])


def test_a_record_is_made_portable_relative_to_its_run_folder_else_to_the_repository() -> None:
    record = {"out": "/work/r3", "runs": [{"checkpoint_best": "/work/r3/runs/edges-seed0/checkpoints/best.ckpt"}],
              "data": "/work/shared/data/convomem", "command": "bench --data /tmp/traj32 --tool /usr/bin/time", "steps": 60}
    made = portable(record, "/work/r3", "/work/main")
    assert made == {"out": ".", "runs": [{"checkpoint_best": "runs/edges-seed0/checkpoints/best.ckpt"}], "data": "../shared/data/convomem",
                    "command": "bench --data [machine]/traj32 --tool /usr/bin/time", "steps": 60}
    assert not machine_paths(json.dumps(made))
