"""Data-prep settings: where ConvoMem comes from, what to draw, how to judge, where to write.

A data-prep YAML has a ``data_prep:`` section (this dataclass) and a ``pipeline:`` section (the frozen
pipeline's models and hyperparameters, :class:`qgmem_train.config.PipelineConfig`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from qgmem_train.config import PipelineConfig, load_pipeline_config, read_yaml, settings_from_dict
from qgmem_train.errors import InputError


@dataclass
class DataPrepConfig:
    """What to sample from ConvoMem and how to turn it into training trajectories (paper appendix B)."""

    source: str = "Salesforce/ConvoMem"
    """Hub dataset id, or a local folder in the pre_mixed_testcases or test_cases layout."""
    revision: str | None = None
    """Hub revision of the dataset."""
    categories: dict[str, float] = field(
        default_factory=lambda: {"user_evidence": 5, "assistant_facts_evidence": 3, "changing_evidence": 4}
    )
    """Category folder name → sampling weight (paper: 5:3:4)."""
    total_cases: int = 1200
    """Cases drawn over all categories."""
    seed: int = 0
    """Sampling seed; the same seed and source always draw the same cases."""
    max_questions_per_case: int | None = None
    """Questions asked per case (None: all of its evidence items)."""
    max_sessions_per_case: int | None = None
    """Sessions built per case, evidence sessions first (None: the whole haystack)."""
    intent: Literal["llm", "rules"] = "llm"
    """Query-intent parser: the paper's prompt, or rules without an LLM."""
    judge_repeats: int = 1
    """Judge calls per answer; the majority decides (greedy decoding repeats itself, so 1 unless sampling)."""
    target: Literal["judge_correct", "gold"] = "judge_correct"
    """``judge_correct``: the paper's setting, keep answers the judge accepts as targets; ``gold``: for weak
    local models, target the dataset's answer with a reasoning path over the evidence units' labels, and
    skip answering and judging (they decide nothing then), so a run is construction and activation only."""
    validation_fraction: float = 0.1
    """Share of cases in the validation split."""
    test_fraction: float = 0.1
    """Share of cases in the test split."""
    out: str = "out/data_prep"
    """Output folder: shards/, dataset/, manifest.json."""

    def fingerprint(self, pipeline: PipelineConfig) -> str:
        """Hash of every setting that changes the output (not ``out``): shards made differently never merge."""
        settings = {k: v for k, v in dataclasses.asdict(self).items() if k != "out"}
        blob = json.dumps({"data_prep": settings, "pipeline": pipeline.to_dict()}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


_AT_LEAST = {"total_cases": 1, "max_questions_per_case": 1, "max_sessions_per_case": 1, "judge_repeats": 1}
"""Smallest allowed value of each count setting."""
_UNIT_INTERVAL = frozenset({"validation_fraction", "test_fraction"})
"""Settings that are shares in [0, 1]."""


def load_data_prep_config(path: str | Path) -> tuple[DataPrepConfig, PipelineConfig]:
    """Read the ``data_prep:`` and ``pipeline:`` sections of a YAML file; an unknown key or a value of the
    wrong type or range is an :class:`InputError` naming it."""
    pipeline = load_pipeline_config(path)
    where = f"{path}: data_prep"
    cfg = settings_from_dict(DataPrepConfig, read_yaml(path).get("data_prep", {}), where, at_least=_AT_LEAST, unit_interval=_UNIT_INTERVAL)
    if any(w < 0 for w in cfg.categories.values()) or sum(cfg.categories.values()) <= 0:
        raise InputError(f"{where}.categories", "needs non-negative weights with a positive sum")
    if cfg.validation_fraction + cfg.test_fraction > 1:
        raise InputError(f"{where}.test_fraction", f"validation_fraction + test_fraction is {cfg.validation_fraction + cfg.test_fraction}, above 1")
    return cfg, pipeline
