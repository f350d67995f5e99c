"""Attention after the cached prefix without a mask tensor, for batches without padding.

With the prefix cache the queries (the tokens after the prefix) are fewer than the keys (the prefix and them), so
transformers' SDPA path materialises a boolean mask, which rules out the Flash and cuDNN kernels. Where no row is padded,
that mask is PyTorch's bottom-right causal bias (``causal_lower_right``), which SDPA hands to the Flash or memory-efficient
kernel as a flag (on the CPU it materialises the same mask). The ``sdpa_bottom_right`` attention implementation is
transformers' SDPA attention with a mask function that returns that bias in exactly this case, transformers' SDPA mask
otherwise; the module switches a backbone that attends with SDPA to it when the prefix cache is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask

IMPLEMENTATION = "sdpa_bottom_right"


def bottom_right_applies(
    q_length: int, kv_length: int, q_offset: Any, kv_offset: Any, mask_function: Callable, attention_mask: torch.Tensor | None,
    local_size: int | None,
) -> bool:  # fmt: skip
    """Whether the mask asked for is the bottom-right causal one: plain causal attention of several queries that follow all
    earlier keys (a cache), no sliding window, no padded column."""
    if mask_function is not causal_mask_function or local_size is not None or not isinstance(q_offset, int):
        return False
    if not 1 < q_length < kv_length or kv_offset != 0 or q_offset != kv_length - q_length:
        return False
    return attention_mask is None or (attention_mask.shape[-1] == kv_length and bool(attention_mask.all()))


def bottom_right_mask(
    batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0, mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None, local_size: int | None = None, **kwargs: Any,
) -> Any:  # fmt: skip
    """transformers' SDPA mask, or PyTorch's bottom-right causal bias where :func:`bottom_right_applies`."""
    if bottom_right_applies(q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, local_size):
        return causal_lower_right(q_length, kv_length)
    return sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
        attention_mask=attention_mask, local_size=local_size, **kwargs,
    )  # fmt: skip


AttentionInterface.register(IMPLEMENTATION, sdpa_attention_forward)
AttentionMaskInterface.register(IMPLEMENTATION, bottom_right_mask)


def use_bottom_right(llm: Any) -> bool:
    """Switch a backbone that attends with SDPA to ``sdpa_bottom_right`` (same attention, the bias where it applies); whether it did."""
    if llm.config._attn_implementation != "sdpa":
        return False
    llm.set_attn_implementation(IMPLEMENTATION)
    return True
