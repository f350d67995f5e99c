"""The GPU check's ``prefix_timing`` part: the frozen-prefix cache timed on a random Qwen3-8B-shaped decoder, checked in fp32.

A fit's step time on a 135M model is mostly host work, and two fits of one configuration differed by 40% on an H200,
so this part times the decoder's own step (forward, loss, backward) and nothing else: the variants (cache off / on)
alternate for ``rounds`` rounds in one process, each step's device work is timed with CUDA events and its host
preparation (inputs, padding, the cache's mask) with the wall clock, apart. The decoder has Qwen3-8B's shape in bf16
with random weights (step time does not depend on them), at ``tokens`` per sequence with the prompt prefix of the
chat template's length, for each batch size. Correctness: the first step's logits at the labelled positions, with and
without the cache, in fp32 on a decoder of the same widths and ``logit_layers`` layers, within 1e-4 relative. The
attention call alone is timed for the cases the cache makes: transformers' explicit mask with repeated keys (what
attention gets today with the cache), PyTorch's bottom-right causal bias, and the whole sequence with ``is_causal``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

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


class DeviceClock:
    """Milliseconds of device work between ``start()`` and ``stop()``: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda = cuda
        self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        self._wall = 0.0

    def start(self) -> None:
        if self._events:
            self._events[0].record()
        else:
            self._wall = time.perf_counter()

    def stop(self) -> float:
        if self._events:
            import torch

            self._events[1].record()
            torch.cuda.synchronize()
            return float(self._events[0].elapsed_time(self._events[1]))
        return (time.perf_counter() - self._wall) * 1000


def random_decoder(shape: dict[str, Any], layers: int | None, dtype: Any, device: str) -> Any:
    """A Qwen3 causal LM of ``shape`` (``layers`` decoder layers when given) with random weights, built on ``device``, frozen."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{**shape, **({"num_hidden_layers": layers} if layers else {})})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
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


def alternate(variants: dict[str, Callable[[int], tuple[float, float]]], rounds: int, steps: int, warmup: int) -> dict[str, Any]:
    """Run each variant's ``steps`` timed steps (after ``warmup`` untimed ones) in turn, ``rounds`` times.

    A variant is ``step(seed) -> (host_ms, device_ms)``. Per variant: the median device and host milliseconds over all
    rounds and the median of each round; the on / off ratio of each round shows the spread the medians hide.
    """
    times: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, step in variants.items():
            for seed in range(warmup):
                step(seed)
            times[name].append([step(warmup + seed) for seed in range(steps)])
    summary: dict[str, Any] = {}
    for name, per_round in times.items():
        flat = [t for r in per_round for t in r]
        summary[name] = {
            "device_ms_median": statistics.median(d for _, d in flat),
            "host_ms_median": statistics.median(h for h, _ in flat),
            "device_ms_round_medians": [statistics.median(d for _, d in r) for r in per_round],
        }
    return summary


def time_prefix_cache(llm: Any, batch: int, tokens: int, prefix_tokens: int, rounds: int, steps: int, warmup: int, cuda: bool) -> dict[str, Any]:
    """Cache off / on alternated: device and host milliseconds a step, and the on / off ratio overall and per round."""
    import torch

    clock = DeviceClock(cuda)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    with autocast:
        prefix = the_prefix(llm, prefix_tokens)

    def step(cached: bool) -> Callable[[int], tuple[float, float]]:
        def run(seed: int) -> tuple[float, float]:
            started = time.perf_counter()
            with autocast:
                inputs = step_inputs(llm, batch, tokens, prefix, cached, seed)
            host = (time.perf_counter() - started) * 1000
            clock.start()
            with autocast:
                decoder_step(llm, inputs)
            return host, clock.stop()

        return run

    summary = alternate({"off": step(False), "on": step(True)}, rounds, steps, warmup)
    off, on = summary["off"], summary["on"]
    summary["device_on_over_off"] = on["device_ms_median"] / off["device_ms_median"]
    summary["device_on_over_off_per_round"] = [b / a for a, b in zip(off["device_ms_round_medians"], on["device_ms_round_medians"])]
    summary.update(batch=batch, tokens=tokens, prefix_tokens=prefix_tokens)
    if cuda:
        summary["peak_gib"] = torch.cuda.max_memory_allocated() / 1024**3
    return summary


def first_step_logits_difference(llm: Any, batch: int, tokens: int, prefix_tokens: int) -> float:
    """Largest difference between the first step's logits (labelled positions) with and without the cache, over the largest logit.

    ``llm`` runs in fp32: at that precision the two paths differ only by the order of floating-point sums.
    """
    import torch

    from qgmem_train.model.fusion import IGNORE_INDEX

    with torch.no_grad():
        prefix = the_prefix(llm, prefix_tokens)
        logits = []
        for cached in (False, True):
            inputs = step_inputs(llm, batch, tokens, prefix, cached, seed=0)
            hidden = decoder_step(llm, inputs, backward=False)
            picked = inputs["labels"][:, 1:] != IGNORE_INDEX
            logits.append(llm.get_output_embeddings()(hidden[:, :-1][picked]).float())
    plain, cached_logits = logits
    return float((cached_logits - plain).abs().max() / plain.abs().max())


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
