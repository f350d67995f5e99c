"""Centered projector (``model.graph_projector: centered``): a learned prompt plus a graph part that averages to zero.

Trained against a frozen LLM, the MLP projector's tokens drift to one shared direction within a few steps (the
loss gradient that every question shares moves biases and the encoder's common component fastest, and the layer
norm then squeezes what differs per question; ``bench/results/graph_token.md``): the graph module turns into a
soft prompt. Here the shared part is a learned prompt of its own, and the graph part is a bias-free linear map of
the readout vector standardised by running statistics, so its mean over the training questions is (up to the
running estimate) zero: what it adds can only be what differs between questions. Empty graphs (readout vectors of zeros,
statistics of zeros) give the prompt alone, the same-size soft-prompt control.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class CenteredGraphProjector(nn.Module):
    """``tokens`` learned prompt vectors plus ``W · (v − mean) / std`` per readout vector, scaled to the LLM's embedding norm."""

    def __init__(self, in_dim: int, llm_hidden_size: int, tokens: int, momentum: float = 0.05, eps: float = 1e-5) -> None:
        super().__init__()
        self.tokens = tokens
        self.llm_hidden_size = llm_hidden_size
        self.momentum = momentum
        self.eps = eps
        self.prompt = nn.Parameter(nn.functional.normalize(torch.randn(tokens, llm_hidden_size), dim=-1))
        self.graph = nn.Linear(in_dim, llm_hidden_size * tokens, bias=False)
        nn.init.normal_(self.graph.weight, std=1.0 / math.sqrt(in_dim * llm_hidden_size))
        self.register_buffer("running_mean", torch.zeros(in_dim))
        self.register_buffer("running_var", torch.zeros(in_dim))
        self.register_buffer("observed", torch.zeros((), dtype=torch.long))
        self.register_buffer("scale", torch.ones(()))

    def set_scale(self, norm: float) -> None:
        """Scale both parts to ``norm`` (the LLM's mean input-embedding norm): a fresh prompt vector and a fresh graph part of a
        unit-variance input then each have about that norm."""
        self.scale.fill_(norm)

    def observe(self, vectors: torch.Tensor) -> None:
        """Fold a batch's real ``(n, in_dim)`` readout vectors into the running mean and variance (the first batch sets them)."""
        if vectors.shape[0] == 0:
            return
        vectors = vectors.detach().float()
        mean = vectors.mean(0)
        var = vectors.var(0, unbiased=False) if vectors.shape[0] > 1 else (vectors[0] - self.running_mean).pow(2)
        rate = 1.0 if int(self.observed) == 0 else self.momentum
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), rate)
        self.running_var.lerp_(var.to(self.running_var.dtype), rate)
        self.observed += 1

    def forward(self, vectors: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        """``(n, tokens, llm_hidden_size)`` graph tokens of ``(n, in_dim)`` readout vectors.

        In training the running statistics first take in the rows ``real`` marks (all rows when ``None``; padding rows of
        a per-edge readout are not vectors of any graph).
        """
        if self.training:
            self.observe(vectors if real is None else vectors[real.bool()])
        standardized = (vectors - self.running_mean) / torch.sqrt(self.running_var + self.eps)
        graph = self.graph(standardized.to(self.graph.weight.dtype)).view(vectors.shape[0], self.tokens, self.llm_hidden_size)
        return self.scale * (self.prompt + graph)
