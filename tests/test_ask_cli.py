"""``ask`` end to end with SmolLM2 over a small turns-mode store, its ``--json`` object, and its bad-input paths."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from qgmem_train.__main__ import main
from tests.fakes import ScriptedLLM


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory, locomo_turns_store) -> tuple[Path, Path]:
    """The sample's first session in turns mode, and a config with a short generation budget."""
    root = tmp_path_factory.mktemp("ask")
    config = root / "ask.yaml"
    config.write_text("pipeline:\n  construction:\n    units: turns\n    traces: false\n  generation:\n    max_new_tokens: 48\n")
    return locomo_turns_store(root / "store", sessions=1), config


@pytest.mark.slow
def test_ask_prints_answer_and_cited_turns(small_store: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    store, config = small_store
    code = main(["ask", "--store", str(store), "--config", str(config), "--reranker", "none", "--time", "2023-05-09",
                 "What did Caroline go to yesterday?"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("answer: ") and re.search(r"\n(cited units|working memory \(nothing cited\)) \(\d+ of \d+ units", out)
    assert "    D1:" in out and "(2023-05-08" in out


def test_ask_json_prints_one_object_with_the_cited_units(small_store: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The answering LLM is scripted to cite F1 and F2: the JSON must carry exactly those units with their source turns."""
    from qgmem_train.llm import factory

    store, small = small_store
    config = small.parent / "ask-budget.yaml"  # room for the scripted answer: a longer string would be cut at the schema's cap
    config.write_text(small.read_text().replace("max_new_tokens: 48", "max_new_tokens: 96"))
    reply = json.dumps({"reasoning_path": "F1 and F2 say where Caroline went.", "answer": "an LGBTQ support group"})
    monkeypatch.setattr(factory, "build_llm", lambda cfg: ScriptedLLM(lambda chat: reply))
    code = main(["ask", "--store", str(store), "--config", str(config), "--reranker", "none", "--intent", "rules", "--time", "2023-05-09",
                 "--json", "What did Caroline go to yesterday?"])  # fmt: skip
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["answer"] == "an LGBTQ support group" and record["reasoning_path"].startswith("F1 and F2")
    assert [unit["label"] for unit in record["cited"]] == ["F1", "F2"]
    assert record["cited"] == [unit for unit in record["units"] if unit["cited"]]
    for unit in record["cited"]:
        assert unit["fact_text"] and unit["source_turns"]
        assert all(turn["id"].startswith("D1:") and turn["speaker"] and turn["text"] and turn["time"].startswith("2023-05-08") for turn in unit["source_turns"])
    assert record["tokens"]["context"] > 0 and record["tokens"]["generated"] > 0 and record["seconds"]["total"] > 0


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--namespace", "nobody", "q?"], "nobody"),
        (["--time", "next-ish", "q?"], "--time"),
        (["   "], "empty question"),
    ],
)
def test_ask_bad_input_exits_2(small_store: tuple[Path, Path], capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    store, config = small_store
    assert main(["ask", "--store", str(store), "--config", str(config), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_ask_for_a_missing_namespace_names_no_other(small_store: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A store holds many users' namespaces: asking for one it lacks must not reveal the ids of the others."""
    from qgmem_train.memory.store import MemoryStore

    store, config = small_store
    with MemoryStore.open(store) as opened:
        held = opened.namespaces()
    assert held
    assert main(["ask", "--store", str(store), "--config", str(config), "--namespace", "nobody", "q?"]) == 2
    err = capsys.readouterr().err
    assert "nobody" in err and not any(name in err for name in held)


def test_ask_missing_store_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ask", "--store", str(tmp_path / "none"), "q?"]) == 2
    assert "no memory store" in capsys.readouterr().err
