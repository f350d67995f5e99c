"""CUDA-only paths of the module: bfloat16 and 4-bit NF4 frozen backbones (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize(("dtype", "quantization"), [("bfloat16", "none"), ("bfloat16", "4bit")])
def test_graph_token_trains_over_a_bf16_or_nf4_backbone(dtype: str, quantization: str) -> None:
    data = TrajectoryDataModule(str(FIXTURE), batch_size=2)
    data.setup("fit")
    model = GraphAugmentedLM(feature_dim=data.feature_dim, dtype=dtype, quantization=quantization, gnn_hidden=64, projector_hidden=64, max_context_tokens=32)
    model.load_backbone("cuda")
    model.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.example_losses(data.collate(data.splits["train"][:2])).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert model.projector.mlp[2].weight.grad is not None
    assert not any(p.grad is not None for p in model.llm.parameters())
