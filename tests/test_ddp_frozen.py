"""DDP leaves the frozen backbone alone: wrapping the module broadcasts and all-reduces only the trainable graph
path and LoRA, not the LLM's frozen weights and buffers (16 GB per rank for an 8B model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.module import GraphAugmentedLM
from tests.tiny_decoder import FIXTURE, tiny_module_kwargs


@pytest.mark.parametrize("lora_r", [0, 2])
def test_ddp_syncs_only_the_trainable_parameters(llm_dir: Path, tmp_path: Path, lora_r: int) -> None:
    data = TrajectoryDataModule(str(FIXTURE), batch_size=1, max_examples=1)
    data.setup("fit")
    model = GraphAugmentedLM(**tiny_module_kwargs(llm_dir, data.feature_dim, lora={"r": lora_r}))
    model.load_backbone("cpu")
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert any(name.startswith("encoder.") for name in trainable) and any("lora_" in name for name in trainable) == (lora_r > 0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
        synced = {id(p) for p in ddp._module_parameters}
        assert {name for name, p in model.named_parameters() if id(p) in synced} == trainable
        assert not [name for name, b in model.named_buffers() if name.startswith("llm.") and any(b is s for s in ddp.modules_buffers)]
    finally:
        dist.destroy_process_group()
