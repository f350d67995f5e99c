"""The reranker study's comparison of models (``python -m experiments.reranker``): paired per question, in the same
rerank mode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from experiments.reranker import compare


def test_a_later_model_is_compared_with_the_first_one_per_question_in_the_same_mode() -> None:
    """Model b finds the gold on one more question of four than a in blend mode only, and ranks it lower in rrf mode."""
    records = []
    for q in range(4):
        row = {"conversation": "c", "qa_index": q, "fused/recall@10": 0.0, "fused/ndcg@10": 0.0}
        for mode in compare.MODES:
            row |= {f"a, {mode}/recall@10": 0.5, f"a, {mode}/ndcg@10": 0.5, f"b, {mode}/recall@10": 0.5, f"b, {mode}/ndcg@10": 0.5}
        records.append(row)
    records[0] |= {"b, blend/recall@10": 1.0, "b, rrf/ndcg@10": 0.1}
    gains = compare.gains_over_first_model(records, ["a", "b"])
    assert set(gains) == {f"b, {mode}" for mode in compare.MODES}
    assert gains["b, blend"]["recall@10"]["mean_difference"] == pytest.approx(0.5 / 4)
    assert gains["b, blend"]["ndcg@10"]["mean_difference"] == 0.0 and gains["b, replace"]["recall@10"]["mean_difference"] == 0.0
    assert gains["b, rrf"]["ndcg@10"]["mean_difference"] == pytest.approx(-0.4 / 4)
    assert gains["b, blend"]["recall@10"]["questions"] == 4 and compare.gains_over_first_model(records, ["a"]) == {}


def test_each_category_reports_how_much_of_its_gold_the_pool_holds() -> None:
    """What a reranker can reach in a category is its pool's recall: a miss outside the pool is the fused channels' miss."""
    records = [{"conversation": "c", "qa_index": q, "category": category, "pool_recall@100": pool,
                **{f"{name}/{key}": 0.0 for name in compare.rankings(["a"]) for key in compare.KEYS}}
               for q, (category, pool) in enumerate([(1, 1.0), (1, 0.5), (3, 0.0)])]
    summary = compare.summarise(records, {"a": SimpleNamespace(calls=[])})
    assert summary["per_category"]["cat1 multi-hop"]["pool_recall@100"] == pytest.approx(0.75)
    assert summary["per_category"]["cat3 open-domain"]["pool_recall@100"] == 0.0
    model = {"folder": "m", "runtime": "torch", "quantization": "none", "layers": 6, "max_length": None, "document_layout": "compact",
             "training": {}}
    report = {"summary": summary, "machine": {"cpu": "x", "cores": 2}, "conversations": ["c"], "embedder": "e", "models": {"a": model},
              "batch_size": 8, "targets": {}, "met": {}}
    assert "| cat1 multi-hop | 2 | 0.750 | fused |" in compare.markdown(report)
