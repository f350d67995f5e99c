"""Typed configuration: the paper's values are the defaults, and bad keys are one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from qgmem_train.config import PipelineConfig, load_pipeline_config
from qgmem_train.errors import InputError


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
