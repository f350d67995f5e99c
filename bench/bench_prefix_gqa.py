"""Grouped-query attention after the cached prefix: transformers' ×4 copy of keys and values against none, at Qwen3-8B shapes.

With a mask (the padded batch's tensor, or the bottom-right bias of a padding-free one), transformers' SDPA attention
repeats each layer's keys and values to every query head (8 → 32 at Qwen3-8B) before calling the kernel; the prefix
cache's attention (``sdpa_bottom_right``, :mod:`qgmem_train.model.prefix_attention`) hands them to SDPA unrepeated
where a fused kernel takes the groups. On one 8B-shaped decoder layer (hidden 4096, 32 query heads, 8 key-value heads,
head dim 128, MLP 12288; random weights, float32, CPU) with a prefix cache of ``--prefix`` tokens and ``--after`` tokens
after it, side by side in one process, alternated, medians:

1. the attention call alone (the copy's own cost, and the bytes it allocates, counted from ``repeat_kv``'s outputs);
2. the whole layer's forward (the copy's share of a layer's work).

Each comparison checks that both paths give the same outputs (within float32 rounding).

    python bench/bench_prefix_gqa.py            # writes bench/results/prefix_gqa.{json,md}
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qgmem_train.reports import machine_info

import torch
import transformers.integrations.sdpa_attention as hf_sdpa
from transformers import AttentionInterface, Qwen3Config, Qwen3ForCausalLM
from transformers.masking_utils import AttentionMaskInterface

from bench.gpu_prefix_timing import QWEN3_8B
from qgmem_train.fileio import write_report_atomic
from qgmem_train.model.prefix_attention import IMPLEMENTATION, bottom_right_mask, grouped_attention
from qgmem_train.model.prefix_cache import PrefixKV, compute_prefix

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.prefix_gqa")
REPEATING = "sdpa_bottom_right_repeating"
"""The prefix cache's attention as it was: the bottom-right mask, transformers' SDPA attention (which repeats)."""

AttentionInterface.register(REPEATING, hf_sdpa.sdpa_attention_forward)
AttentionMaskInterface.register(REPEATING, bottom_right_mask)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=int, default=400, help="tokens in the cached prefix")
    parser.add_argument("--after", type=int, default=512, help="tokens after the prefix (graph tokens, context, target)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of each path after a warm-up round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prefix_gqa.json")
    args = parser.parse_args(argv)
    for name in ("prefix", "after", "batch_size", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def eight_b_layer() -> Any:
    """A Qwen3 causal LM of one decoder layer at Qwen3-8B's widths and a vocabulary of 16 (random weights, float32)."""
    torch.manual_seed(0)
    config = Qwen3Config(**{**QWEN3_8B, "vocab_size": 16, "num_hidden_layers": 1, "max_position_embeddings": 8192})
    return Qwen3ForCausalLM(config).eval().requires_grad_(False)


class CopyBytes:
    """Counts the bytes of the keys and values transformers repeats (``repeat_kv``'s outputs that are new tensors)."""

    def __init__(self) -> None:
        self.bytes = 0
        self._repeat = hf_sdpa.repeat_kv

    def __enter__(self) -> CopyBytes:
        def counted(states: torch.Tensor, n_rep: int) -> torch.Tensor:
            out = self._repeat(states, n_rep)
            self.bytes += out.numel() * out.element_size() if out is not states else 0
            return out

        hf_sdpa.repeat_kv = counted
        return self

    def __exit__(self, *exc: object) -> None:
        hf_sdpa.repeat_kv = self._repeat


def alternate(runs: dict[str, Callable[[], torch.Tensor]], rounds: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Median seconds of each run over ``rounds`` rounds after a warm-up one, the order reversed every other round; last outputs."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, torch.Tensor] = {}
    for r in range(rounds + 1):
        for name in list(runs)[:: 1 if r % 2 else -1]:
            start = time.perf_counter()
            outputs[name] = runs[name]()
            if r:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}, outputs


def attention_inputs(model: Any, prefix: PrefixKV, args: argparse.Namespace, padded: bool) -> dict[str, Any]:
    """Query, keys and values of one layer after the prefix and the mask the prefix cache passes (the bias, or a padded batch's)."""
    config, rows, after = model.config, args.batch_size, args.after
    query = torch.randn(rows, config.num_attention_heads, after, config.head_dim)
    keys, values = (torch.cat([t.expand(rows, -1, -1, -1), torch.randn(rows, config.num_key_value_heads, after, config.head_dim)], dim=-2) for t in prefix.layers[0])
    columns = torch.ones(rows, prefix.length + after, dtype=torch.bool)
    if padded:
        columns[0, -after // 4 :] = False  # the first row is a quarter shorter, right padded
    kv = prefix.length + after
    mask = bottom_right_mask(rows, after, kv, q_offset=prefix.length, attention_mask=None if not padded else columns)
    return {"query": query, "key": keys, "value": values, "attention_mask": mask}


def layer_inputs(model: Any, prefix: PrefixKV, args: argparse.Namespace) -> dict[str, Any]:
    """A padding-free batch's embeddings after the prefix, laid out as the prefix cache lays them (``attend_to_prefix``)."""
    from qgmem_train.model.prefix_cache import attend_to_prefix

    rows, after = args.batch_size, args.after
    inputs = {
        "inputs_embeds": torch.randn(rows, after, model.config.hidden_size) * 0.02,
        "attention_mask": torch.ones(rows, after, dtype=torch.long),
        "position_ids": torch.arange(after).expand(rows, -1),
    }
    return attend_to_prefix(inputs, prefix)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The attention call and the layer's forward through both paths; their times, copy bytes and output differences."""
    model = eight_b_layer()
    model.set_attn_implementation(IMPLEMENTATION)
    prefix = compute_prefix(model, tuple(range(1, 16)) * (args.prefix // 15) + tuple(range(1, args.prefix % 15 + 1)), ("bench",))
    attention = model.model.layers[0].self_attn
    rows: list[dict[str, Any]] = []
    log.info("one Qwen3-8B-shaped layer built; prefix of %d tokens cached; timing %d rounds of each part", prefix.length, args.rounds)
    with torch.no_grad():
        for padded in (False, True):
            inputs = attention_inputs(model, prefix, args, padded)
            runs = {
                "repeating": lambda: hf_sdpa.sdpa_attention_forward(attention, **inputs, scaling=attention.scaling)[0],
                "grouped": lambda: grouped_attention(attention, **inputs, scaling=attention.scaling)[0],
            }
            with CopyBytes() as copied:
                runs["repeating"]()
            rows.append(part(f"attention call, {'padded batch (mask tensor)' if padded else 'padding-free batch (bottom-right bias)'}", runs, args, copied.bytes))
        inputs = layer_inputs(model, prefix, args)

        def layer(implementation: str) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                model.set_attn_implementation(implementation)
                decoder = model.get_decoder()
                return decoder(inputs_embeds=inputs["inputs_embeds"], attention_mask=inputs["attention_mask"], position_ids=inputs["position_ids"],
                               cache=inputs["cache"], use_cache=False).last_hidden_state  # fmt: skip

            return run

        with CopyBytes() as copied:
            layer(REPEATING)()
        rows.append(part("whole decoder layer forward, padding-free batch", {"repeating": layer(REPEATING), "grouped": layer(IMPLEMENTATION)}, args, copied.bytes))
    return {"parts": rows}


def part(name: str, runs: dict[str, Callable[[], torch.Tensor]], args: argparse.Namespace, copy_bytes: int) -> dict[str, Any]:
    """One comparison's medians, their ratio, the copy's bytes and the largest output difference relative to the output's scale."""
    log.info("timing: %s", name)
    seconds, outputs = alternate(runs, args.rounds)
    scale = float(outputs["repeating"].abs().max())
    difference = float((outputs["grouped"] - outputs["repeating"]).abs().max()) / scale
    if difference > 1e-5:
        raise AssertionError(f"{name}: the grouped path's output differs from the repeating one's by {difference:.2e} of its scale")
    return {"part": name, "seconds": seconds, "grouped_over_repeating": seconds["grouped"] / seconds["repeating"], "copy_bytes": copy_bytes,
            "max_relative_difference": difference}  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    """The report's table and what it measured."""
    a, m = report["args"], report["machine"]
    lines = [
        "# Grouped-query attention after the cached prefix: transformers' ×4 copy against none (one Qwen3-8B-shaped layer)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores shared with other work (load average {m.get('load_average_1m')} at the start), "
        f"torch {m.get('torch')}. Float32, {a['threads']} torch threads, batch {a['batch_size']}, prefix {a['prefix']} tokens, "
        f"{a['after']} tokens after it; medians of {a['rounds']} alternated rounds after a warm-up. `repeating`: the prefix cache's "
        "attention before (transformers' SDPA attention, keys and values repeated 8 → 32 heads); `grouped`: now (SDPA with "
        "`enable_gqa` on the 8 heads). Copy: bytes of the repeated keys and values one layer allocates, counted from `repeat_kv`.",
        "",
        "| part | repeating (s) | grouped (s) | grouped / repeating | copy a layer (MiB) | max output difference (of scale) |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["parts"]:
        s = row["seconds"]
        lines.append(f"| {row['part']} | {s['repeating']:.4f} | {s['grouped']:.4f} | {row['grouped_over_repeating']:.3f} | "
                     f"{row['copy_bytes'] / 2**20:.1f} | {row['max_relative_difference']:.1e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    machine = machine_info()
    report = {"machine": machine, "args": {k: v for k, v in vars(args).items() if k != "out"}, **measure(args)}
    text = markdown(report)
    write_report_atomic(args.out, report, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
