"""The GPU check's ``bf16``, ``nf4`` and ``lora_nf4`` parts: training steps of module variants, alternated in one process.

Each variant is a ``GraphAugmentedLM`` with the check's settings and its own overrides (checkpointing, 4-bit, LoRA)
over the check's timed backbone (a random decoder of Qwen3-8B's widths and a few layers: on a 135M model a step is mostly
host work, so its ratios would speak of the host), built once on the device beside the others, with AdamW over its
trainable parameters. A step's host preparation (``training_inputs``: embeddings of the batch's prompt ids, which were tokenised beforehand as the loader workers do,
graph tokens, padding, the prefix cache's mask) is timed with the wall clock; its device work (decoder, loss, backward,
gradient clipping, optimizer step) with CUDA events. Variants alternate for ``rounds`` rounds (:mod:`gpu_timing`);
peak memory is read per variant round, decoder-layer passes are counted (a recomputation runs a layer again).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.gpu_timing import DeviceClock, alternate, autocast, compare

GIB = 1024**3


def recompute_probe(llm: Any) -> Any:
    """A module that runs once per decoder-layer pass, recomputation included: the first child of the first decoder layer.

    Transformers (5.x) checkpoints a layer's ``forward`` and keeps the layer's own hooks outside the checkpoint,
    so a hook on the layer fires once a step either way; its children run again when backward recomputes it.
    """
    layer = next((m for m in llm.modules() if type(m).__name__.endswith("DecoderLayer")), None)
    return None if layer is None else next(layer.children(), layer)


@dataclass
class Variant:
    """One built variant: its module, optimizer, batches and what its steps recorded."""

    model: Any
    optimizer: Any
    batches: list[dict[str, Any]]
    load_s: float
    sequence_tokens: float
    losses: list[Any] = field(default_factory=list)
    layer_calls: int = 0
    peak: int = 0
    above_resident: int = 0
    _resident: int = 0

    def count(self, *_: Any) -> None:
        self.layer_calls += 1


def build_variant(bench: Any, overrides: dict[str, Any]) -> Variant:
    """A fresh module with the check's settings and ``overrides``, loaded on the device, in training mode, and its batches."""
    import lightning as L
    import torch

    from qgmem_train.model.module import GraphAugmentedLM

    data, size = bench.data(), bench.args.batch_size  # set up (models resolved, labels embedded) before the load is timed
    backbone = bench.timed_backbone()  # built once, before the load is timed
    L.seed_everything(bench.args.seed, verbose=False)
    started = time.perf_counter()
    model = GraphAugmentedLM(**bench.module_settings(**{"llm": backbone, **overrides}))
    model.load_backbone("cuda" if bench.cuda else "cpu")
    model.train()
    if bench.cuda:
        torch.cuda.synchronize()
    load_s = time.perf_counter() - started
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=model.optim_args.learning_rate, weight_decay=model.optim_args.weight_decay)
    data.prompt_tokens = model.prompt_tokens
    train = data.splits["train"]
    batches = [data.collate(train[i : i + size]) for i in range(0, max(len(train) - size + 1, 1), size)][:4]
    with autocast(bench.cuda), torch.no_grad():  # computes the prefix cache, as fit's start does, before the probe counts
        tokens = float(model.training_inputs(batches[0])["attention_mask"].sum(-1).float().mean())
    variant = Variant(model, optimizer, batches, load_s, tokens)
    probe = recompute_probe(model.llm)
    if probe is not None:
        probe.register_forward_hook(variant.count)
    return variant


def variant_step(variant: Variant, cuda: bool, clock: DeviceClock) -> Callable[[int], tuple[float, float]]:
    """``step(seed)``: host preparation of batch ``seed`` (wall clock), then the device work of a training step (``clock``)."""
    import torch

    from qgmem_train.model.fusion import per_example_loss

    model = variant.model
    trainable = [p for group in variant.optimizer.param_groups for p in group["params"]]

    def run(seed: int) -> tuple[float, float]:
        started = time.perf_counter()
        with autocast(cuda):
            inputs = model.training_inputs(variant.batches[seed % len(variant.batches)])
        host = (time.perf_counter() - started) * 1000
        clock.start()
        with autocast(cuda):
            loss = per_example_loss(model.hidden_states(inputs), inputs["labels"], model.llm.get_output_embeddings()).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        variant.optimizer.step()
        variant.optimizer.zero_grad(set_to_none=True)
        device = clock.stop()
        variant.losses.append(loss.detach())
        return host, device

    return run


def time_module_variants(
    bench: Any, variants: dict[str, dict[str, Any]], after: Callable[[Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Build every variant, alternate their training steps for ``--rounds`` rounds, and compare the second with the first.

    Per variant: device and host milliseconds (overall and per-round medians), load seconds, peak and above-resident
    CUDA memory (the largest over its rounds), decoder-layer passes a step, losses, and ``after(model)``'s result.
    """
    import torch

    args, cuda = bench.args, bench.cuda
    built = {name: build_variant(bench, overrides) for name, overrides in variants.items()}
    clock = DeviceClock(cuda)

    def before_round(name: str) -> None:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            built[name]._resident = torch.cuda.memory_allocated()

    def after_round(name: str) -> None:
        if cuda:
            variant = built[name]
            peak = torch.cuda.max_memory_allocated()
            variant.peak, variant.above_resident = max(variant.peak, peak), max(variant.above_resident, peak - variant._resident)

    steps = {name: variant_step(variant, cuda, clock) for name, variant in built.items()}
    summary = alternate(steps, args.rounds, args.steps, args.warmup_steps, before_round, after_round)
    records: dict[str, Any] = {}
    for name, variant in built.items():
        losses = [float(loss) for loss in variant.losses]
        record = {
            **summary[name],
            "steps": len(losses),
            "load_s": variant.load_s,
            "sequence_tokens": variant.sequence_tokens,
            "decoder_layer_calls_per_step": variant.layer_calls / len(losses) if losses else None,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "losses_finite": all(math.isfinite(x) for x in losses),
        }
        if cuda:
            record.update(peak_gib=variant.peak / GIB, above_resident_gib=variant.above_resident / GIB)
        if after is not None:
            record.update(after(variant.model))
        records[name] = record
    base, other = list(variants)[:2]
    return {
        "backbone": bench.backbone_record(), "rounds": args.rounds, "steps": args.steps, "warmup_steps": args.warmup_steps, "variants": records,
        "comparison": compare(summary, base, other),
    }  # fmt: skip
