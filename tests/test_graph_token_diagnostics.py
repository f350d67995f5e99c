"""Graph-token diagnostics: a soft prompt (same tokens for every question) against tokens that vary with the question."""

from __future__ import annotations

import pytest
import torch

from qgmem_train.graph.diagnostics import graph_token_diagnostics


def test_constant_tokens_score_cosine_one_and_no_between_variance() -> None:
    token = torch.randn(2, 16)
    got = graph_token_diagnostics([token.clone() for _ in range(5)])
    assert got["cosine"] == pytest.approx(1.0, abs=1e-5) and got["between_variance_ratio"] == pytest.approx(0.0, abs=1e-6)


def test_question_specific_tokens_lower_the_cosine_and_raise_the_ratio() -> None:
    axes = torch.eye(8)
    got = graph_token_diagnostics([axes[i : i + 1] for i in range(4)] + [torch.zeros(0, 8)])
    # four orthogonal unit tokens: raw cosine 0, centred -1/3 (e_i - mean: -1/4 on the others' axes); mean 1/4 on four
    # axes, so between = 1 - 1/4, total = 1
    assert got["raw_cosine"] == pytest.approx(0.0, abs=1e-6) and got["cosine"] == pytest.approx(-1 / 3, abs=1e-6)
    assert got["between_variance_ratio"] == pytest.approx(0.75)
    assert graph_token_diagnostics([axes[:1]]) == {}, "one question: nothing to compare"


def test_a_large_shared_component_leaves_the_centred_cosine_well_below_one() -> None:
    """Tokens that differ by question beside a part every question shares: uncentred they look alike (0.99), centred they do not."""
    shared = 10.0 * torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    differ = torch.randn(12, 2, 64, generator=torch.Generator().manual_seed(1))
    got = graph_token_diagnostics([shared + d for d in differ])
    assert got["raw_cosine"] > 0.98, got
    assert got["cosine"] < 0.2, got
    assert 0.0 < got["between_variance_ratio"] < 0.01, got
    one_way = graph_token_diagnostics([shared + (1.0 if i else -7.0) * torch.ones(1, 64) for i in range(8)])
    assert one_way["cosine"] == pytest.approx(0.5, abs=1e-5), "one question apart from seven alike: ((7 - 1)² - 8) / (8 · 7)"
