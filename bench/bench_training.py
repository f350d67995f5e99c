"""Training benchmark of the graph token on CPU: step-time overhead, trainable size, and graph vs no-graph loss.

Measured side by side in one run on the same batches:

1. Step time with the graph token vs the same frozen LLM without it (``graph_tokens: 0``): the forward
   pass, and a training step (forward + backward + AdamW) against a no-graph step that backpropagates
   through the same frozen LLM to its input embeddings (the cost any input-side trainable module pays).
   A and B alternate, medians reported.
2. Trainable parameter count and the size of the trainable-only adapter file (safetensors, fp32).
3. After a short CPU training on pipeline trajectories, validation loss with the graph token vs
   ``graph_tokens: 0`` (nothing to train: the frozen LLM) and vs a graph token trained on empty graphs
   (a learned soft prompt with no graph information), all trained the same way.

    python bench/bench_training.py --data tests/data/trajectories
    python tests/data/make_trajectory_fixture.py --questions 40 --held-out 6 --out /tmp/traj && \\
        python bench/bench_training.py --data /tmp/traj --train-steps 28
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from machine import cpu_model

import lightning as L
import torch

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM
from qgmem_train.fileio import atomic_output, write_json_atomic
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.model.checkpoint import save_adapter, trainable_state_dict
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.fusion import per_example_loss
from qgmem_train.model.module import GraphAugmentedLM

ROOT = Path(__file__).resolve().parents[1]


def build(args: argparse.Namespace, data: TrajectoryDataModule, graph_tokens: int) -> GraphAugmentedLM:
    """The module under test with the benchmark's settings (seeded, so every variant starts alike)."""
    torch.manual_seed(args.seed)
    return GraphAugmentedLM(
        feature_dim=data.feature_dim, llm=args.llm, dtype="float32", graph_tokens=graph_tokens, gnn_hidden=args.gnn_hidden,
        gnn_layers=2, gnn_heads=4, projector_hidden=2 * args.gnn_hidden, learning_rate=args.lr, weight_decay=0.0,
        warmup_steps=2, max_context_tokens=args.max_context_tokens, val_generate=False,
    )


def time_steps(args: argparse.Namespace, data: TrajectoryDataModule) -> dict[str, float]:
    """Median forward and training-step seconds with and without the graph token on one batch."""
    batch = data.collate(data.splits["train"][: args.batch_size])
    with_graph, without = build(args, data, 1), build(args, data, 0)
    optimizer = torch.optim.AdamW([p for p in with_graph.parameters() if p.requires_grad], lr=args.lr)

    def forward(model: GraphAugmentedLM) -> None:
        with torch.no_grad():
            model.example_losses(batch)

    def graph_step() -> None:
        with_graph.example_losses(batch).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    def plain_step() -> None:
        inputs = without.training_inputs(batch)
        inputs["inputs_embeds"] = inputs["inputs_embeds"].detach().requires_grad_(True)
        per_example_loss(without.hidden_states(inputs), inputs["labels"], without.llm.get_output_embeddings()).mean().backward()

    timings: dict[str, list[float]] = {"forward_graph": [], "forward_plain": [], "step_graph": [], "step_plain": []}
    for model in (with_graph, without):
        model.train()
    for repeat in range(args.timing_steps + 1):
        for name, run in (
            ("forward_graph", lambda: forward(with_graph)),
            ("forward_plain", lambda: forward(without)),
            ("step_graph", graph_step),
            ("step_plain", plain_step),
        ):
            start = time.perf_counter()
            run()
            if repeat:  # the first round warms up
                timings[name].append(time.perf_counter() - start)
    medians = {f"{k}_s": statistics.median(v) for k, v in timings.items()}
    medians["forward_ratio"] = medians["forward_graph_s"] / medians["forward_plain_s"]
    medians["step_ratio"] = medians["step_graph_s"] / medians["step_plain_s"]
    medians["sequence_tokens"] = int(with_graph.training_inputs(batch)["attention_mask"].sum(-1).float().mean())
    medians["trainable_params"] = sum(p.numel() for p in with_graph.parameters() if p.requires_grad)
    with tempfile.TemporaryDirectory() as tmp:
        file = save_adapter(trainable_state_dict(with_graph), with_graph.checkpoint_metadata(), tmp)
        medians["adapter_bytes"] = file.stat().st_size
    return medians


def train_and_validate(args: argparse.Namespace, data: TrajectoryDataModule, graph_tokens: int, empty_graphs: bool) -> dict[str, float]:
    """Validation loss before and after ``train_steps`` of training (none when nothing is trainable)."""
    L.seed_everything(args.seed)
    if empty_graphs:
        data.splits = {name: [replace(ex, graph=LocalGraph()) for ex in part] for name, part in data.splits.items()}
    model = build(args, data, graph_tokens)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=args.train_steps, logger=False, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=True, limit_val_batches=1.0, num_sanity_val_steps=0, check_val_every_n_epoch=None,
        val_check_interval=args.train_steps, gradient_clip_val=1.0,
    )
    before = trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"]
    if graph_tokens > 0:
        trainer.fit(model, datamodule=data)
    after = trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"]
    return {"val_loss_before": before, "val_loss_after": after}


def markdown(result: dict[str, Any]) -> str:
    """The results as Markdown: step-time ratios and sizes, then validation loss per variant."""
    t, m = result["timing"], result["machine"]
    lines = [
        f"# Graph token: training cost and validation loss ({m['cpu']}, {m['cores']} cores, torch {m['torch']})", "",
        f"Data {result['settings']['data']} ({result['data']}); batch {result['settings']['batch_size']}, "
        f"{t['sequence_tokens']} tokens a sequence on average.", "",
        "| measure | with graph token | without | ratio |", "|---|---|---|---|",
        f"| forward (s, median) | {t['forward_graph_s']:.3f} | {t['forward_plain_s']:.3f} | {t['forward_ratio']:.3f} |",
        f"| training step (s, median) | {t['step_graph_s']:.3f} | {t['step_plain_s']:.3f} | {t['step_ratio']:.3f} |", "",
        f"Trainable parameters {t['trainable_params']:,}; adapter file {t['adapter_bytes']:,} bytes (safetensors, fp32).", "",
        "| variant | val loss before | val loss after |", "|---|---|---|",
    ]  # fmt: skip
    lines += [f"| {name} | {v['val_loss_before']:.4f} | {v['val_loss_after']:.4f} |" for name, v in result["validation"].items()]
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], path: Path) -> None:
    """Write the results so far (each phase adds to them) as JSON and Markdown, atomically."""
    write_json_atomic(path, result)
    with atomic_output(path.with_suffix(".md")) as handle:
        handle.write(markdown(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "trajectories", help="trajectory folder (datasets save_to_disk)")
    parser.add_argument("--llm", default=BUNDLED_LLM)
    parser.add_argument("--embedder", default=BUNDLED_EMBEDDER)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-context-tokens", type=int, default=128)
    parser.add_argument("--gnn-hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--timing-steps", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "training.json")
    args = parser.parse_args(argv)

    data = TrajectoryDataModule(str(args.data), embedder=args.embedder, batch_size=args.batch_size, eval_batch_size=args.batch_size)
    data.setup("fit")
    result: dict[str, Any] = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
        "settings": {k: str(v) for k, v in vars(args).items()},
        "data": {name: len(part) for name, part in data.splits.items()},
        "timing": time_steps(args, data),
        "validation": {},
    }
    write(result, args.out)
    variants = {"graph_token": (1, False), "no_graph (graph_tokens 0)": (0, False), "graph_token_on_empty_graphs": (1, True)}
    for name, (graph_tokens, empty) in variants.items():
        result["validation"][name] = train_and_validate(args, data, graph_tokens, empty_graphs=empty)
        write(result, args.out)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
