"""Every command that writes a folder refuses an existing folder of the user's (its files survive) and replaces only its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from qgmem_train.fileio import OUTPUT_MARKER
from tests.test_reranker_average import trained_folder

ROOT = Path(__file__).resolve().parents[1]


def _users_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "thesis.txt").write_text("years of work")
    return path


def _average(tmp_path: Path, out: Path) -> list[str]:
    first, second = trained_folder(tmp_path / "seed0", 0), trained_folder(tmp_path / "seed1", 1)
    return ["average-rerankers", str(first), str(second), "--out", str(out)]


def _fit_reranker(tmp_path: Path, out: Path) -> list[str]:
    return ["fit-reranker", "--config", str(ROOT / "configs" / "reranker-cpu.yaml"), "--model.num_layers", "1", "--out", str(out)]


def _fit_embedder(tmp_path: Path, out: Path) -> list[str]:
    return ["fit-embedder", "--config", str(ROOT / "configs" / "reranker-cpu.yaml"), "--out", str(out)]


def _data_prep(tmp_path: Path, out: Path) -> list[str]:
    config = tmp_path / "prep.yaml"
    config.write_text(f"data_prep:\n  source: {ROOT / 'samples' / 'convomem_cases'}\n  categories: {{category_2_temporal: 1}}\n  out: {out.parent}\n")
    return ["data_prep", "--config", str(config)]


def _run(argv: list[str]) -> int:
    if argv[0] == "data_prep":
        from data_prep.__main__ import main as data_prep_main

        return data_prep_main(argv[1:])
    from qgmem_train.__main__ import main

    return main(argv)


@pytest.mark.parametrize(("command", "out_name"), [(_average, "soup"), (_fit_reranker, "model"), (_fit_embedder, "embedder"), (_data_prep, "dataset")])
def test_a_command_refuses_a_folder_of_the_users_and_leaves_it_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str], command, out_name: str) -> None:
    out = _users_folder(tmp_path / "work" / out_name)
    assert _run(command(tmp_path, out)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"error: {out}: exists and is not an output folder of QGMem (it holds no {OUTPUT_MARKER}); choose a new folder, or remove it yourself", err
    assert [p.name for p in out.iterdir()] == ["thesis.txt"] and (out / "thesis.txt").read_text() == "years of work"


def test_a_file_in_place_of_the_output_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "soup"
    out.write_text("a file of the user's")
    assert _run(_average(tmp_path, out)) == 2
    assert f"error: {out}: exists and is not an output folder" in capsys.readouterr().err
    assert out.read_text() == "a file of the user's"


def test_a_commands_own_folder_and_an_empty_one_are_replaced(tmp_path: Path) -> None:
    out = tmp_path / "soup"
    out.mkdir()
    assert _run(_average(tmp_path, out)) == 0
    assert (out / OUTPUT_MARKER).is_file() and (out / "model.safetensors").is_file()
    (out / "stale.txt").write_text("from the first run")
    assert _run(_average(tmp_path, out)) == 0
    assert not (out / "stale.txt").exists() and (out / OUTPUT_MARKER).is_file()
