"""Attention after the cached prefix without a mask tensor, for batches without padding.

With the prefix cache the queries (the tokens after the prefix) are fewer than the keys (the prefix and them), so
transformers' SDPA path materialises a boolean mask, which rules out the Flash and cuDNN kernels. Where no row is padded,
that mask is PyTorch's bottom-right causal bias (``causal_lower_right``), which SDPA hands to the Flash or memory-efficient
kernel as a flag (on the CPU it materialises the same mask). The ``sdpa_bottom_right`` attention implementation is
transformers' SDPA attention with a mask function that returns that bias in exactly this case, transformers' SDPA mask
otherwise; the module switches a backbone that attends with SDPA to it when the prefix cache is on.

Its attention also keeps grouped-query keys and values unrepeated under a mask: transformers repeats them to every query
head whenever a mask is passed (×4 a layer at Qwen3-8B's 32 query and 8 key-value heads), since its CUDA kernels for a mask
tensor take no groups. :func:`grouped_attention` hands them to SDPA with ``enable_gqa`` where a fused kernel takes the
groups as they are (the CPU's flash kernel, with a mask or the bias; on CUDA the flash kernel, which the bottom-right bias
reaches in half precision) and leaves transformers' repetition where only the math kernel would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.backends.cuda import SDPAParams, can_use_flash_attention
from torch.nn.attention import SDPBackend
from torch.nn.attention.bias import CausalBias, causal_lower_right
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


def groups_without_copy(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, dropout: float) -> bool:
    """Whether SDPA runs this grouped-query attention in a fused kernel on keys and values of fewer heads than the queries
    (the check SDPA makes itself; for the bottom-right bias, the check of its own CUDA dispatch)."""
    if isinstance(mask, CausalBias):
        if query.device.type == "cuda":
            return bool(can_use_flash_attention(SDPAParams(query, key, value, None, dropout, False, True)))
        mask = None  # elsewhere the bias is materialised and SDPA picks its kernel as for a mask tensor
    choice = torch._fused_sdp_choice(query, key, value, mask, dropout, False, enable_gqa=True)
    return choice not in (SDPBackend.MATH.value, SDPBackend.ERROR.value)


def grouped_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, dropout: float = 0.0,
    scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' SDPA attention, except that under a mask (a tensor or the bottom-right bias) the keys and values of a
    grouped-query layer reach SDPA unrepeated (``enable_gqa``) where :func:`groups_without_copy`."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1 and attention_mask is not None
    plain = kwargs.get("softcap") is not None or kwargs.get("output_attentions") or kwargs.get("position_bias") is not None
    if not grouped or plain or not groups_without_copy(query, key, value, attention_mask, dropout):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # a mask is passed, so not is_causal, as in transformers
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(IMPLEMENTATION, grouped_attention)
AttentionMaskInterface.register(IMPLEMENTATION, bottom_right_mask)


def use_bottom_right(llm: Any) -> bool:
    """Switch a backbone that attends with SDPA to ``sdpa_bottom_right`` (same attention, the bias where it applies, grouped keys
    and values unrepeated); whether it did."""
    if llm.config._attn_implementation != "sdpa":
        return False
    llm.set_attn_implementation(IMPLEMENTATION)
    return True
