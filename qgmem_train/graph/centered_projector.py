"""Reference-centered projector (``model.projector.center: reference``): graph tokens that cannot turn into a soft prompt.

With the plain projector, training moves what every question's gradient shares (the MLP's biases, the encoder's
common component) fastest, and the layer norm then squeezes what differs between graphs: the tokens become one
learned prompt (experiments/graph_token/results/graph_token.md). Here a token is a learned prompt plus the graph's deviation from
the mean over a fixed set of reference graphs (training graphs, re-encoded at every step, so the mean is the
current encoder's), divided by the deviations' spread over that set. Whatever all graphs share cancels in the
deviation, and the graph part keeps a fixed share of the token's energy (``share``): how much the frozen LLM
uses it is left to the loss. Evaluation, export and prediction use the statistics of the last training step
(buffers saved with the adapter), so no reference graph is needed after training.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from qgmem_train.graph.projector import projector_mlp

SPREAD_FLOOR = 1e-6
"""Smallest deviation spread divided by, so identical reference graphs give zero deviations rather than NaN."""


class ReferenceCenteredProjector(nn.Module):
    """``tokens`` vectors of the LLM's hidden size per input vector: learned prompt + (MLP(x) − reference mean) / reference spread."""

    def __init__(self, in_dim: int, hidden_dim: int, llm_hidden_size: int, tokens: int, share: float = 1.0) -> None:
        super().__init__()
        self.tokens = tokens
        self.llm_hidden_size = llm_hidden_size
        self.share = share
        self.mlp = projector_mlp(in_dim, hidden_dim, llm_hidden_size * tokens)
        self.prompt = nn.Parameter(torch.randn(tokens, llm_hidden_size))
        self.norm = nn.LayerNorm(llm_hidden_size, elementwise_affine=False)
        self.scale = nn.Parameter(torch.ones(()))
        self.register_buffer("center", torch.zeros(tokens, llm_hidden_size))
        self.register_buffer("spread", torch.ones(()))

    def set_scale(self, norm: float) -> None:
        """Set the learned scale (the LLM's mean input-embedding norm at initialisation)."""
        with torch.no_grad():
            self.scale.fill_(norm)

    def forward(self, vectors: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
        """``(N, tokens, llm_hidden_size)`` graph tokens of ``(N, in_dim)`` readout vectors.

        ``reference``: the reference graphs' readout vectors ``(R, in_dim)``; their mean and spread are computed
        through the same MLP (gradients flow through them) and, in training mode, kept for evaluation. Without it
        the kept statistics are used.
        """
        mapped = self.mlp(vectors).view(vectors.shape[0], self.tokens, self.llm_hidden_size)
        if reference is None:
            center, spread = self.center, self.spread
        else:
            reference_mapped = self.mlp(reference).view(reference.shape[0], self.tokens, self.llm_hidden_size)
            center = reference_mapped.mean(0)
            spread = (reference_mapped - center).pow(2).mean().sqrt().clamp_min(SPREAD_FLOOR)
            if self.training:
                self.center.copy_(center.detach())
                self.spread.copy_(spread.detach())
        deviation = (mapped - center) / spread
        return self.scale * (self.norm(self.prompt) + self.share * deviation) / math.sqrt(self.llm_hidden_size)
