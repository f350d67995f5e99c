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
    # four orthogonal unit tokens: cosine 0; mean 1/4 on four axes, so between = 1 - 1/4, total = 1
    assert got["cosine"] == pytest.approx(0.0, abs=1e-6) and got["between_variance_ratio"] == pytest.approx(0.75)
    shared = torch.ones(1, 8)
    mixed = graph_token_diagnostics([shared + 0.1 * axes[i : i + 1] for i in range(4)])
    assert 0.9 < mixed["cosine"] < 1.0 and 0.0 < mixed["between_variance_ratio"] < 0.01
    assert graph_token_diagnostics([axes[:1]]) == {}, "one question: nothing to compare"
