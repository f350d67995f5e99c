"""``python -m qgmem_train build``: summary line, resume, and exit code 2 with one line on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem_train.__main__ import main
from qgmem_train.memory.store import MemoryStore

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


@pytest.fixture
def no_traces_config(tmp_path: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text("pipeline:\n  construction:\n    traces: false\n    window_batch_size: 1\n")
    return path


def test_build_turns_then_rerun_resumes_with_nothing_to_do(tmp_path: Path, no_traces_config: Path, capsys) -> None:
    store = tmp_path / "store"
    args = ["build", "--dataset", "jsonl", "--input", str(SAMPLES / "plain_chat.jsonl"), "--store", str(store), "--units", "turns", "--config", str(no_traces_config)]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "[alex]: units 7 (7 new), traces 0, outputs dropped 0" in out.out
    assert "2/2" in out.err  # the progress bar counts windows
    assert main(args) == 0
    assert "units 7 (0 new)" in capsys.readouterr().out
    with MemoryStore.open(store) as s:
        assert s.namespaces() == ["alex"] and len(s.load_namespace("alex").units) == 7


def test_namespace_and_session_limit_options(tmp_path: Path, no_traces_config: Path, capsys) -> None:
    store = tmp_path / "store"
    args = ["build", "--dataset", "locomo", "--input", str(SAMPLES / "locomo_sample.json"), "--conversation", "conv-26", "--store", str(store),
            "--namespace", "user-1", "--units", "turns", "--limit-sessions", "1", "--config", str(no_traces_config)]  # fmt: skip
    assert main(args) == 0
    assert "[user-1]: units 18 (18 new)" in capsys.readouterr().out


def _bad_plain(tmp_path: Path) -> Path:
    record = json.loads((SAMPLES / "plain_chat.jsonl").read_text())
    del record["sessions"][0]["turns"][1]["text"]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (lambda p: ["--dataset", "jsonl", "--input", str(_bad_plain(p))], "bad.jsonl: line 1 (alex).sessions[0].turns[1].text: missing field"),
        (lambda p: ["--dataset", "locomo", "--input", str(p / "absent.json")], "absent.json: input not found"),
        (lambda p: ["--dataset", "beam", "--input", str(SAMPLES / "locomo_sample.json")], "locomo_sample.json: batch 0.turns: missing field"),
        (lambda p: ["--dataset", "convomem", "--input", str(SAMPLES / "beam" / "1" / "chat.json")], "chat.json: expected a test-case object"),
        (lambda p: ["--dataset", "jsonl", "--input", str(SAMPLES / "plain_chat.jsonl"), "--limit-sessions", "0"], "--limit-sessions: must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, capsys, extra, message: str) -> None:
    store = tmp_path / "store"
    assert main(["build", *extra(tmp_path), "--store", str(store), "--units", "turns"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and err.endswith(message) and "\n" not in err
    assert not store.exists()  # nothing written


def test_help_lists_the_options(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["build", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--dataset", "--input", "--conversation", "--store", "--namespace", "--units", "--config", "--limit-sessions"):
        assert option in out
