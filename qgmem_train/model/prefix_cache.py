"""The frozen prompt prefix, computed once: keys and values of every token before the graph slot.

With a frozen backbone and nothing trainable acting before the slot (no LoRA), the chat template's header,
the system prompt and the first user header give the same keys and values in every example, step and
generation. :class:`PrefixKV` holds them for one prefix; training and validation read them through a
:class:`ReadOnlyPrefixCache` (which never grows, so a gradient-checkpointed layer that runs again in
backward reads the same states), generation starts from a grown-as-usual ``DynamicCache`` copy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from qgmem_train.model.fusion import PromptIds


class ReadOnlyPrefixCache(DynamicCache):
    """A ``DynamicCache`` holding the prefix's keys/values ``(1, kv_heads, P, head_dim)`` themselves (no copy) that returns
    ``prefix + new`` for a batch of any size without storing ``new``.

    ``update`` expands the prefix to the batch inside its one concatenation, so each layer copies it once a step.
    Each forward pass of a decoder layer gets the same answer however often it runs, which is what gradient
    checkpointing's recomputation needs.
    """

    def __init__(self, prefix: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        layers = []
        for keys, values in prefix:
            layer = DynamicLayer()
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
            layers.append(layer)
        Cache.__init__(self, layers=layers)  # DynamicCache's own __init__ would store a concatenated copy

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        layer, rows = self.layers[layer_idx], key_states.shape[0]
        keys, values = layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)
        return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)


@dataclass(frozen=True)
class PrefixKV:
    """Keys and values ``(1, kv_heads, P, head_dim)`` of each decoder layer over one prefix, and what they depend on."""

    key: tuple[Any, ...]
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @property
    def length(self) -> int:
        """Tokens in the prefix (P)."""
        return int(self.layers[0][0].shape[-2])

    def _expanded(self, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k.expand(batch_size, -1, -1, -1), v.expand(batch_size, -1, -1, -1)) for k, v in self.layers]

    def read_only(self) -> ReadOnlyPrefixCache:
        """A cache for one training or scoring forward pass of any batch size, holding these tensors (no copy)."""
        return ReadOnlyPrefixCache(self.layers)

    def for_generation(self, batch_size: int) -> DynamicCache:
        """A cache that generation grows token by token, starting from the prefix of each of ``batch_size`` rows."""
        return DynamicCache(ddp_cache_data=[(k.contiguous(), v.contiguous()) for k, v in self._expanded(batch_size)])


def shared_prefix(prompts: Sequence[PromptIds]) -> tuple[int, ...] | None:
    """The token ids before the graph slot when every prompt of the batch has the same ones, else ``None``."""
    first = tuple(prompts[0].ids[: prompts[0].graph_slot])
    if not first or any(tuple(p.ids[: p.graph_slot]) != first for p in prompts[1:]):
        return None
    return first


def cache_key(llm: Any, prefix_ids: tuple[int, ...]) -> tuple[Any, ...]:
    """What the prefix's keys and values depend on: the ids, the backbone object, its dtype and device, autocast, the process."""
    weight = llm.get_input_embeddings().weight
    device = weight.device.type
    autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    return (prefix_ids, id(llm), weight.dtype, str(weight.device), autocast, os.getpid())


def attend_to_prefix(inputs: dict[str, torch.Tensor], prefix: PrefixKV) -> dict[str, Any]:
    """Right-padded inputs of the tokens after the prefix, made to attend to it.

    The mask gains the prefix's columns, position ids continue after it, and ``cache`` holds its keys
    and values (read-only): the same attention as the whole sequence in one pass.
    """
    mask = inputs["attention_mask"]
    covered = torch.ones(mask.shape[0], prefix.length, dtype=mask.dtype, device=mask.device)
    return {
        **inputs,
        "attention_mask": torch.cat([covered, mask], dim=1),
        "position_ids": inputs["position_ids"] + prefix.length,
        "cache": prefix.read_only(),
    }


def generate_after_prefix(inputs: dict[str, torch.Tensor], prefix: PrefixKV) -> dict[str, torch.Tensor]:
    """Left-padded prompts after the prefix, laid out as ``generate`` expects them with a cache of ``P`` tokens.

    ``generate`` takes ``inputs_embeds`` of the whole sequence and drops the first ``P`` columns (those
    the cache holds), so the prefix's columns are zeros that never reach the model; the mask is
    ``[prefix | left padding | prompt]``, from which ``generate`` counts position ids over real tokens.
    """
    embeds, mask = inputs["inputs_embeds"], inputs["attention_mask"]
    rows = embeds.shape[0]
    placeholder = embeds.new_zeros(rows, prefix.length, embeds.shape[2])
    covered = torch.ones(rows, prefix.length, dtype=mask.dtype, device=mask.device)
    return {"inputs_embeds": torch.cat([placeholder, embeds], dim=1), "attention_mask": torch.cat([covered, mask], dim=1)}


@torch.no_grad()
def compute_prefix(llm: Any, prefix_ids: tuple[int, ...], key: tuple[Any, ...]) -> PrefixKV:
    """Run the frozen decoder once over ``prefix_ids`` and keep every layer's keys and values."""
    embedding = llm.get_input_embeddings()
    ids = torch.tensor([prefix_ids], dtype=torch.long, device=embedding.weight.device)
    cache = DynamicCache()
    llm.get_decoder()(inputs_embeds=embedding(ids), cache=cache, use_cache=True)
    return PrefixKV(key=key, layers=tuple((layer.keys, layer.values) for layer in cache.layers))


def unsupported_reason(llm: Any, lora_r: int) -> str | None:
    """Why the prefix cache cannot apply to this backbone, or ``None`` when it can."""
    if lora_r > 0:
        return "LoRA changes the prefix's keys and values, so they are recomputed every step"
    config = llm.config.get_text_config(decoder=True) if hasattr(llm.config, "get_text_config") else llm.config
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or getattr(config, "use_sliding_window", False):
        return f"the backbone has {sorted(layer_types)} attention layers (sliding or linear); the cache covers full attention only"
    return None
