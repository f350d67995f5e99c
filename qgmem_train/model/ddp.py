"""What DDP must leave alone: the frozen LLM's weights and buffers, which every rank loads itself.

DDP broadcasts every parameter and buffer of the module it wraps from rank 0 when it starts (16 GB of frozen
weights per rank for an 8B backbone) and keeps buffers in sync on forward; it skips the names a module lists
in ``_ddp_params_and_buffers_to_ignore``.
"""

from __future__ import annotations

import torch

BACKBONE_PREFIX = "llm."


def frozen_backbone_names(module: torch.nn.Module) -> list[str]:
    """Names of the backbone's parameters that do not train (LoRA's do) and of all its buffers."""
    frozen = [name for name, p in module.named_parameters() if name.startswith(BACKBONE_PREFIX) and not p.requires_grad]
    return frozen + [name for name, _ in module.named_buffers() if name.startswith(BACKBONE_PREFIX)]
