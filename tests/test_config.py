"""Typed configuration: the paper's values are the defaults, and bad keys or values are one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from qgmem_train.config import PipelineConfig, load_pipeline_config, pipeline_from_dict
from qgmem_train.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_the_papers_values() -> None:
    cfg = PipelineConfig()
    c, r, g = cfg.construction, cfg.retrieval, cfg.generation
    assert (c.window, c.overlap, c.neighbours, c.relation_threshold, c.min_cluster_size) == (6, 2, 20, 0.80, 2)
    assert (r.n, r.kappa, r.k, r.sem_threshold) == (100, 60, 10, 0.60)
    assert g.temperature == 0.0
    assert cfg.models.trust_remote_code is False


def test_pipeline_section_is_read_from_a_lightning_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("trainer: {max_steps: 3}\npipeline:\n  retrieval: {k: 5}\n  models: {llm: Qwen/Qwen3-8B}\n")
    cfg = load_pipeline_config(path)
    assert cfg.retrieval.k == 5 and cfg.retrieval.n == 100
    assert cfg.models.llm == "Qwen/Qwen3-8B"


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("retrieval:\n  kapa: 3\n")
    with pytest.raises(InputError, match=r"c\.yaml: pipeline\.retrieval\.kapa: unknown setting"):
        load_pipeline_config(path)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="config file not found"):
        load_pipeline_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("retrieval: [1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_pipeline_config(bad)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"retrieval": {"rerank_mode": "bogus"}}, "retrieval.rerank_mode: expected one of replace, rrf, blend, got 'bogus'"),
        ({"retrieval": {"k": "10"}}, "retrieval.k: expected an integer, got '10'"),
        ({"retrieval": {"lexical_context_turns": -1}}, "retrieval.lexical_context_turns: must be at least 0, got -1"),
        ({"retrieval": {"sem_threshold": 1.5}}, r"retrieval.sem_threshold: must lie in \[0, 1\], got 1.5"),
        ({"retrieval": {"channels": "bm25"}}, "retrieval.channels: expected a list of strings, got 'bm25'"),
        ({"construction": {"traces": "yes"}}, "construction.traces: expected true or false, got 'yes'"),
        ({"models": {"llm_revision": 3}}, "models.llm_revision: expected a string or null, got 3"),
        ({"models": {"deadline_s": 0}}, "models.deadline_s: must be above 0, got 0"),
        ({"retrieval": {"rerank_prior": -0.5}}, "retrieval.rerank_prior: must be at least 0, got -0.5"),
        ({"models": {"reranker_quantization": "int4"}}, "models.reranker_quantization: expected one of none, int8, got 'int4'"),
        ({"models": {"reranker_runtime": "tensorrt"}}, "models.reranker_runtime: expected one of torch, onnxruntime, got 'tensorrt'"),
        ({"retrieval": {"rerank_top": 0}}, "retrieval.rerank_top: must be at least 1, got 0"),
        ({"models": {"reranker_max_length": 4}}, "models.reranker_max_length: must be at least 16, got 4"),
        ({"construction": {"window": 4, "overlap": 4}}, r"construction.overlap: must be less than construction.window \(4\), got 4"),
        ({"construction": {"overlap": 7}}, r"construction.overlap: must be less than construction.window \(6\), got 7"),
    ],
)
def test_a_wrong_type_or_range_names_the_setting(tmp_path: Path, section: dict, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"pipeline": section}))
    with pytest.raises(InputError, match=message):
        load_pipeline_config(path)


def test_every_default_passes_its_own_checks() -> None:
    assert pipeline_from_dict(PipelineConfig().to_dict()) == PipelineConfig()
    assert load_pipeline_config(ROOT / "configs" / "qwen3-8b.yaml").retrieval.kappa == 60



SAMPLES = ROOT / "samples"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("pipeline:\n  construction: {window: 3, overlap: 3}\n", "cfg.yaml: pipeline.construction.overlap: must be less than construction.window (3), got 3"),
        ("pipeline:\n  retrieval: [1, 2\n", "cfg.yaml: not valid YAML: while parsing a flow sequence"),
        ("pipeline:\n  models: {llm: caf\xe9}\n".encode("latin-1"), "cfg.yaml: line 2: not valid UTF-8"),
    ],
)
def test_a_bad_config_through_the_cli_is_one_line_and_writes_nothing(tmp_path: Path, capsys, content: str | bytes, message: str) -> None:
    from qgmem_train.__main__ import main

    config = tmp_path / "cfg.yaml"
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    store = tmp_path / "store"
    args = ["build", "--dataset", "jsonl", "--input", str(SAMPLES / "plain_chat.jsonl"), "--store", str(store), "--units", "turns", "--config", str(config)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not store.exists()
