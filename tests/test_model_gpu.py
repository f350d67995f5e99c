"""CUDA-only paths of the module: bfloat16 and 4-bit NF4 frozen backbones (skipped without a GPU).

The models are the GPU check's (``bench/gpu_check.py`` sets ``QGMEM_GPU_TEST_LLM`` / ``QGMEM_GPU_TEST_EMBEDDER`` to
the prepared stand-ins where the bundled packages are missing), else the bundled ones. Its smoke run sets
``QGMEM_GPU_TEST_DEVICE=cpu``: the bf16 test then runs on CPU, the NF4 one skips.
"""

from __future__ import annotations

import os

import pytest
import torch

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE

DEVICE = "cuda" if torch.cuda.is_available() else os.environ.get("QGMEM_GPU_TEST_DEVICE")
LLM = os.environ.get("QGMEM_GPU_TEST_LLM", BUNDLED_LLM)
EMBEDDER = os.environ.get("QGMEM_GPU_TEST_EMBEDDER", BUNDLED_EMBEDDER)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason="needs CUDA")]


@pytest.mark.parametrize(("dtype", "quantization"), [("bfloat16", "none"), ("bfloat16", "4bit")])
def test_graph_token_trains_over_a_bf16_or_nf4_backbone(dtype: str, quantization: str) -> None:
    if quantization == "4bit" and DEVICE != "cuda":
        pytest.skip("NF4 needs CUDA")
    data = TrajectoryDataModule(str(FIXTURE), embedder=EMBEDDER, batch_size=2)
    data.setup("fit")
    model = GraphAugmentedLM(
        feature_dim=data.feature_dim, llm=LLM, dtype=dtype, quantization=quantization, encoder={"hidden_dim": 64}, projector={"hidden_dim": 64},
        prompt={"max_context_tokens": 32},
    )
    model.load_backbone(DEVICE)
    model.train()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = model.example_losses(data.collate(data.splits["train"][:2])).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert model.projector.mlp[2].weight.grad is not None
    assert not any(p.grad is not None for p in model.llm.parameters())
