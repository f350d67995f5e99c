"""The GPU check's ``prefix_timing`` part: the frozen-prefix cache timed on a random Qwen3-8B-shaped decoder, checked in fp32.

A fit's step time on a 135M model is mostly host work, and two fits of one configuration differed by 40% on an H200,
so this part times the decoder's own step (forward, loss, backward) and nothing else: the variants (cache off; cache on
with the explicit mask transformers' SDPA builds after a cache; cache on with PyTorch's bottom-right causal bias, which
the module uses for padding-free batches) alternate for ``rounds`` rounds in one process, each step's device work is
timed with CUDA events and its host preparation (inputs, padding, the cache's mask) with the wall clock, apart. The
decoder has Qwen3-8B's shape in bf16 with random weights (step time does not depend on them), at ``tokens`` per
sequence with the prompt prefix of the chat template's length, for each batch size. Correctness: the first step's
logits at the labelled positions of each cached variant against those without the cache, in fp32 on a decoder of the
same widths and ``logit_layers`` layers, within 1e-4 relative. The attention call alone is timed for the same three
cases, with repeated keys where a mask is passed (as transformers does).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.gpu_timing import DeviceClock, alternate, autocast, compare

from qgmem_train.model.prefix_attention import IMPLEMENTATION

QWEN3_8B = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)  # fmt: skip
"""Qwen3-8B's config.json (the architecture's sizes; weights are random)."""

SMOKE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=4096, tie_word_embeddings=False,
)  # fmt: skip
"""A decoder of the same kind small enough for the CPU smoke run."""

LOGITS_TOLERANCE = 1e-4
"""Largest relative difference (to the largest logit) allowed between the cache's first-step logits and the plain ones, in fp32."""

TARGET_TOKENS = 40
"""Labelled tokens at the end of each sequence (a target JSON's length)."""


def random_decoder(shape: dict[str, Any], layers: int | None, dtype: Any, device: str) -> Any:
    """A Qwen3 causal LM of ``shape`` (``layers`` decoder layers when given) with random weights, built on ``device``, frozen."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(**{**shape, **({"num_hidden_layers": layers} if layers else {})})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):  # built in ``dtype`` on the device: Qwen3-8B in fp32 first would take 33 GB more
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.requires_grad_(False).eval()


def step_inputs(llm: Any, batch: int, tokens: int, prefix: tuple[tuple[int, ...], Any], cached: bool, seed: int) -> dict[str, Any]:
    """Host preparation of one step: the prefix's ids then random ones, embedded (a leaf that takes gradients, as graph tokens
    do), labels on the last :data:`TARGET_TOKENS`; ``cached``: only the ids after the prefix, made to attend to it
    (:func:`attend_to_prefix`)."""
    import torch

    from qgmem_train.model.fusion import IGNORE_INDEX
    from qgmem_train.model.prefix_cache import attend_to_prefix

    device = llm.get_input_embeddings().weight.device
    prefix_ids, kv = prefix
    generator = torch.Generator().manual_seed(seed)
    rest = torch.randint(0, llm.config.vocab_size, (batch, tokens - len(prefix_ids)), generator=generator)
    ids = (rest if cached else torch.cat([torch.tensor(prefix_ids).expand(batch, -1), rest], dim=1)).to(device)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, -TARGET_TOKENS:] = ids[:, -TARGET_TOKENS:]
    embeds = llm.get_input_embeddings()(ids).detach().requires_grad_(True)
    positions = torch.arange(ids.shape[1], device=device).expand(batch, -1)
    inputs = {"inputs_embeds": embeds, "attention_mask": torch.ones_like(ids), "position_ids": positions, "labels": labels}
    return attend_to_prefix(inputs, kv) if cached else inputs


def decoder_step(llm: Any, inputs: dict[str, Any], backward: bool = True) -> Any:
    """The training step's device work: the decoder over ``inputs``, the loss at labelled positions, backward into the embeddings."""
    from qgmem_train.model.fusion import per_example_loss

    hidden = llm.get_decoder()(
        inputs_embeds=inputs["inputs_embeds"], attention_mask=inputs["attention_mask"], position_ids=inputs["position_ids"],
        cache=inputs.get("cache"), use_cache=False,
    ).last_hidden_state  # fmt: skip
    loss = per_example_loss(hidden, inputs["labels"], llm.get_output_embeddings()).mean()
    if backward:
        loss.backward()
    return hidden


def the_prefix(llm: Any, length: int) -> tuple[tuple[int, ...], Any]:
    """``length`` random prompt-prefix ids and the cache's :class:`PrefixKV` over them, computed once as the module does."""
    import torch

    from qgmem_train.model.prefix_cache import cache_key, compute_prefix

    ids = tuple(torch.randint(0, llm.config.vocab_size, (length,), generator=torch.Generator().manual_seed(1)).tolist())
    return ids, compute_prefix(llm, ids, cache_key(llm, ids))


VARIANTS = {"cache off": (False, "sdpa"), "cache on, explicit mask": (True, "sdpa"), "cache on, bottom-right": (True, IMPLEMENTATION)}
"""Each timed variant: whether the prefix cache serves the prefix, and the backbone's attention implementation (transformers'
SDPA builds an explicit mask after a cache; ``sdpa_bottom_right`` passes PyTorch's bottom-right causal bias instead)."""

COMPARISONS = (("cache off", "cache on, explicit mask"), ("cache off", "cache on, bottom-right"), ("cache on, explicit mask", "cache on, bottom-right"))


def mask_kind(llm: Any, inputs: dict[str, Any]) -> str:
    """What the first decoder layer gets as its attention mask for ``inputs``: none (SDPA's ``is_causal``), the bottom-right
    bias or an explicit mask; one forward pass without gradients."""
    import torch
    from torch.nn.attention.bias import CausalBias

    seen: list[Any] = []
    hook = llm.get_decoder().layers[0].register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True)
    try:
        with torch.no_grad():
            decoder_step(llm, inputs, backward=False)
    finally:
        hook.remove()
    mask = seen[0]
    return "none (is_causal)" if mask is None else "bottom-right bias" if isinstance(mask, CausalBias) else "explicit mask"


def time_prefix_cache(llm: Any, batch: int, tokens: int, prefix_tokens: int, rounds: int, steps: int, warmup: int, cuda: bool) -> dict[str, Any]:
    """The :data:`VARIANTS` alternated: device and host milliseconds a step, the mask attention gets, and :data:`COMPARISONS`."""
    import torch

    clock = DeviceClock(cuda)
    with autocast(cuda):
        prefix = the_prefix(llm, prefix_tokens)

    def step(cached: bool) -> Callable[[int], tuple[float, float]]:
        def run(seed: int) -> tuple[float, float]:
            started = time.perf_counter()
            with autocast(cuda):
                inputs = step_inputs(llm, batch, tokens, prefix, cached, seed)
            host = (time.perf_counter() - started) * 1000
            clock.start()
            with autocast(cuda):
                decoder_step(llm, inputs)
            return host, clock.stop()

        return run

    masks = {}
    for name, (cached, implementation) in VARIANTS.items():
        llm.set_attn_implementation(implementation)
        with autocast(cuda):
            masks[name] = mask_kind(llm, step_inputs(llm, batch, tokens, prefix, cached, seed=0))
    summary = alternate(
        {name: step(cached) for name, (cached, _) in VARIANTS.items()}, rounds, steps, warmup,
        before_round=lambda name: llm.set_attn_implementation(VARIANTS[name][1]),
    )  # fmt: skip
    llm.set_attn_implementation("sdpa")
    result: dict[str, Any] = {
        "batch": batch, "tokens": tokens, "prefix_tokens": prefix_tokens,
        "variants": {name: {**summary[name], "attention_mask": masks[name]} for name in VARIANTS},
        "comparisons": [compare(summary, base, other) for base, other in COMPARISONS],
    }  # fmt: skip
    if cuda:
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 1024**3
    return result


def first_step_logits_difference(llm: Any, batch: int, tokens: int, prefix_tokens: int) -> dict[str, float]:
    """Per cached variant, the largest difference between its first step's logits (labelled positions) and those without the
    cache, over the largest logit.

    ``llm`` runs in fp32: at that precision the paths differ only by the order of floating-point sums.
    """
    import torch

    from qgmem_train.model.fusion import IGNORE_INDEX

    logits = {}
    with torch.no_grad():
        prefix = the_prefix(llm, prefix_tokens)
        for name, (cached, implementation) in VARIANTS.items():
            llm.set_attn_implementation(implementation)
            inputs = step_inputs(llm, batch, tokens, prefix, cached, seed=0)
            hidden = decoder_step(llm, inputs, backward=False)
            picked = inputs["labels"][:, 1:] != IGNORE_INDEX
            logits[name] = llm.get_output_embeddings()(hidden[:, :-1][picked]).float()
    llm.set_attn_implementation("sdpa")
    plain = logits.pop("cache off")
    return {name: float((values - plain).abs().max() / plain.abs().max()) for name, values in logits.items()}


def time_attention(batch: int, tokens: int, prefix_tokens: int, shape: dict[str, Any], rounds: int, steps: int, cuda: bool) -> dict[str, Any]:
    """Forward + backward of one attention call, alternated: the whole sequence with ``is_causal`` (no cache), and the
    ``tokens - prefix_tokens`` queries after the prefix with transformers' explicit bottom-right mask over repeated keys
    (the cache today) or PyTorch's ``causal_lower_right`` bias (a kernel that may take it without a materialised mask)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    heads, kv_heads, dim = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    generator = torch.Generator(device=device).manual_seed(0)
    queries = tokens - prefix_tokens

    def tensor(*size: int) -> Any:
        return torch.randn(*size, device=device, dtype=dtype, generator=generator).requires_grad_(True)

    q_full, q_after = tensor(batch, heads, tokens, dim), tensor(batch, heads, queries, dim)
    k, v = tensor(batch, kv_heads, tokens, dim), tensor(batch, kv_heads, tokens, dim)
    mask = torch.ones(queries, tokens, dtype=torch.bool, device=device).tril(diagonal=prefix_tokens)
    repeat = heads // kv_heads
    clock = DeviceClock(cuda)

    def timed(call: Callable[[], Any]) -> Callable[[int], tuple[float, float]]:
        def run(seed: int) -> tuple[float, float]:
            clock.start()
            call().sum().backward()
            return 0.0, clock.stop()

        return run

    variants = {
        "whole sequence, is_causal": timed(lambda: F.scaled_dot_product_attention(q_full, k, v, is_causal=True, enable_gqa=True)),
        "after the prefix, explicit mask, repeated keys": timed(
            lambda: F.scaled_dot_product_attention(q_after, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1), attn_mask=mask)
        ),
        "after the prefix, causal_lower_right": timed(
            lambda: F.scaled_dot_product_attention(
                q_after, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1), attn_mask=causal_lower_right(queries, tokens)
            )
        ),
    }
    summary = alternate(variants, rounds, steps, warmup=1)
    return {name: {key: value for key, value in record.items() if key != "host_ms_median"} for name, record in summary.items()}
