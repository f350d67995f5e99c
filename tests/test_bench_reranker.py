"""bench/bench_reranker.py's comparison of two models: paired per question, in the same rerank mode."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("bench_reranker")


def test_a_later_model_is_compared_with_the_first_one_per_question_in_the_same_mode(bench: ModuleType) -> None:
    """Model b finds the gold on one more question of four than a in blend mode only, and ranks it lower in rrf mode."""
    records = []
    for q in range(4):
        row = {"conversation": "c", "qa_index": q, "fused/recall@10": 0.0, "fused/ndcg@10": 0.0}
        for mode in bench.MODES:
            row |= {f"a, {mode}/recall@10": 0.5, f"a, {mode}/ndcg@10": 0.5, f"b, {mode}/recall@10": 0.5, f"b, {mode}/ndcg@10": 0.5}
        records.append(row)
    records[0] |= {"b, blend/recall@10": 1.0, "b, rrf/ndcg@10": 0.1}
    gains = bench.gains_over_first_model(records, ["a", "b"])
    assert set(gains) == {f"b, {mode}" for mode in bench.MODES}
    assert gains["b, blend"]["recall@10"]["mean_difference"] == pytest.approx(0.5 / 4)
    assert gains["b, blend"]["ndcg@10"]["mean_difference"] == 0.0 and gains["b, replace"]["recall@10"]["mean_difference"] == 0.0
    assert gains["b, rrf"]["ndcg@10"]["mean_difference"] == pytest.approx(-0.4 / 4)
    assert gains["b, blend"]["recall@10"]["questions"] == 4 and bench.gains_over_first_model(records, ["a"]) == {}
