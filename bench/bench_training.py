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
4. Gradient checkpointing of the frozen LLM: training-step time, bytes of activations kept for
   backward (saved tensors outside checkpoints, one step), and the process's peak resident memory
   above the loaded model, with vs without; each setting in its own process, alternated twice.
5. Validation loss after the same training with and without reverse edges (``reverse_edges``) and with
   and without the projector's normalisation (``projector_norm``).

    python bench/bench_training.py --data tests/data/trajectories
    python tests/data/make_trajectory_fixture.py --questions 40 --k 10 --held-out 6 --out /tmp/traj && \\
        python bench/bench_training.py --data /tmp/traj --train-steps 28 --max-context-tokens 1024
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from qgmem_train.reports import cpu_model

import lightning as L
import torch

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM
from qgmem_train.fileio import write_report_atomic
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.model.checkpoint import save_adapter, trainable_state_dict
from qgmem_train.model.datamodule import TrajectoryDataModule
from qgmem_train.model.fusion import per_example_loss
from qgmem_train.model.module import GraphAugmentedLM
from qgmem_train.model.settings import merge_settings

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("timing", "checkpointing", "validation", "ablations")
ABLATIONS: dict[str, dict[str, dict[str, bool]]] = {
    "reverse edges + projector norm (default)": {},
    "without reverse edges": {"encoder": {"reverse_edges": False}},
    "without projector norm": {"projector": {"norm": False}},
}
"""Graph-path settings compared in section 5, each trained the same way."""


def build(args: argparse.Namespace, data: TrajectoryDataModule, graph_tokens: int, load: bool = True, **overrides: Any) -> GraphAugmentedLM:
    """The module under test with the benchmark's settings (seeded, so every variant starts alike)."""
    torch.manual_seed(args.seed)
    settings = {
        "feature_dim": data.feature_dim, "llm": args.llm, "dtype": "float32", "readout": {"tokens": graph_tokens},
        "encoder": {"hidden_dim": args.gnn_hidden, "layers": 2, "heads": 4}, "projector": {"hidden_dim": 2 * args.gnn_hidden},
        "optim": {"learning_rate": args.lr, "weight_decay": 0.0, "warmup_fraction": 0.1},
        "prompt": {"max_context_tokens": args.max_context_tokens}, "generation": {"val_generate": False},
    }  # fmt: skip
    model = GraphAugmentedLM(**merge_settings(settings, overrides))
    if load:
        model.load_backbone("cpu")
    return model


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


def checkpointing_child(args: argparse.Namespace) -> dict[str, float]:
    """In this process only: one setting's median step time, saved-activation bytes and peak memory above the model."""
    data = TrajectoryDataModule(str(args.data), embedder=args.embedder, batch_size=args.batch_size)
    data.setup("fit")
    model = build(args, data, 1, gradient_checkpointing=args.child_checkpointing)
    model.train()
    batch = data.collate(data.splits["train"][: args.batch_size])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    loaded_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    times = []
    for repeat in range(args.timing_steps + 1):
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model.example_losses(batch).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if repeat:  # the first step warms up
            times.append(time.perf_counter() - start)
    tokens = int(model.training_inputs(batch)["attention_mask"].sum(-1).float().mean())
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "step_s": statistics.median(times),
        "saved_activation_bytes": saved[0] // (args.timing_steps + 1),
        "peak_rss_above_model_bytes": (peak_kb - loaded_kb) * 1024,
        "sequence_tokens": tokens,
    }


def checkpointing_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Run :func:`checkpointing_child` for each setting in fresh processes (A, B, A, B) and keep medians."""
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for checkpointing in (False, True, False, True):
        command = [sys.executable, __file__, "--child-checkpointing", str(checkpointing).lower()]
        for key, value in vars(args).items():
            if key not in {"child_checkpointing", "out", "sections"}:
                command += [f"--{key.replace('_', '-')}", str(value)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        runs[checkpointing].append(json.loads(output.strip().splitlines()[-1]))
    result: dict[str, Any] = {}
    for checkpointing, measured in runs.items():
        result["with" if checkpointing else "without"] = {key: statistics.median(m[key] for m in measured) for key in measured[0]}
    with_, without = result["with"], result["without"]
    result["step_ratio"] = with_["step_s"] / without["step_s"]
    result["saved_activation_ratio"] = with_["saved_activation_bytes"] / without["saved_activation_bytes"]
    result["peak_memory_ratio"] = with_["peak_rss_above_model_bytes"] / max(without["peak_rss_above_model_bytes"], 1)
    return result


def train_and_validate(args: argparse.Namespace, data: TrajectoryDataModule, graph_tokens: int, empty_graphs: bool, **overrides: Any) -> dict[str, float]:
    """Validation loss before and after ``train_steps`` of training (none when nothing is trainable)."""
    L.seed_everything(args.seed)
    original = data.splits
    if empty_graphs:
        data.splits = {name: [replace(ex, graph=LocalGraph()) for ex in part] for name, part in data.splits.items()}
    model = build(args, data, graph_tokens, load=False, **overrides)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=args.train_steps, logger=False, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=True, limit_val_batches=1.0, num_sanity_val_steps=0, check_val_every_n_epoch=None,
        val_check_interval=args.train_steps, gradient_clip_val=1.0,
    )
    try:
        before = trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"]
        if graph_tokens > 0:
            trainer.fit(model, datamodule=data)
        after = trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"]
    finally:
        data.splits = original
    return {"val_loss_before": before, "val_loss_after": after}


def markdown(result: dict[str, Any]) -> str:
    """The results as Markdown: each section that ran, in the docstring's order."""
    m = result["machine"]
    lines = [
        f"# Graph token: training cost and validation loss ({m['cpu']}, {m['cores']} cores, torch {m['torch']})", "",
        f"Data {result['settings']['data']} ({result['data']}); batch {result['settings']['batch_size']}, "
        f"context cut to {result['settings']['max_context_tokens']} tokens, {result['settings']['train_steps']} training steps.", "",
    ]  # fmt: skip
    if "timing" in result:
        t = result["timing"]
        lines += [
            f"{t['sequence_tokens']} tokens a sequence on average.", "",
            "| measure | with graph token | without | ratio |", "|---|---|---|---|",
            f"| forward (s, median) | {t['forward_graph_s']:.3f} | {t['forward_plain_s']:.3f} | {t['forward_ratio']:.3f} |",
            f"| training step (s, median) | {t['step_graph_s']:.3f} | {t['step_plain_s']:.3f} | {t['step_ratio']:.3f} |", "",
            f"Trainable parameters {t['trainable_params']:,}; adapter file {t['adapter_bytes']:,} bytes (safetensors, fp32).", "",
        ]  # fmt: skip
    if "checkpointing" in result:
        c = result["checkpointing"]
        w, wo = c["with"], c["without"]
        lines += [
            f"Gradient checkpointing of the frozen LLM ({w['sequence_tokens']} tokens a sequence, each setting in its own process, medians of two):", "",
            "| measure | with checkpointing | without | ratio |", "|---|---|---|---|",
            f"| training step (s, median) | {w['step_s']:.3f} | {wo['step_s']:.3f} | {c['step_ratio']:.3f} |",
            f"| activations kept for backward (MB) | {w['saved_activation_bytes'] / 1e6:.1f} | {wo['saved_activation_bytes'] / 1e6:.1f} | {c['saved_activation_ratio']:.3f} |",
            f"| peak resident memory above the loaded model (MB) | {w['peak_rss_above_model_bytes'] / 1e6:.1f} | {wo['peak_rss_above_model_bytes'] / 1e6:.1f} | {c['peak_memory_ratio']:.3f} |", "",
        ]  # fmt: skip
    for section, title in (("validation", "variant"), ("ablations", "graph-path setting")):
        if result.get(section):
            lines += [f"| {title} | val loss before | val loss after |", "|---|---|---|"]
            lines += [f"| {name} | {v['val_loss_before']:.4f} | {v['val_loss_after']:.4f} |" for name, v in result[section].items()]
            lines.append("")
    return "\n".join(lines)


def write(result: dict[str, Any], path: Path) -> None:
    """Write the results so far as JSON and Markdown, atomically."""
    write_report_atomic(path, result, markdown(result))


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
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}")
    parser.add_argument("--child-checkpointing", choices=["true", "false"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_checkpointing:
        args.child_checkpointing = args.child_checkpointing == "true"
        print(json.dumps(checkpointing_child(args)))
        return 0
    sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")

    data = TrajectoryDataModule(str(args.data), embedder=args.embedder, batch_size=args.batch_size, eval_batch_size=args.batch_size)
    data.setup("fit")
    result: dict[str, Any] = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
        "settings": {k: str(v) for k, v in vars(args).items() if k != "child_checkpointing"},
        "data": {name: len(part) for name, part in data.splits.items()},
    }
    if "timing" in sections:
        result["timing"] = time_steps(args, data)
        write(result, args.out)
    if "checkpointing" in sections:
        result["checkpointing"] = checkpointing_cost(args)
        write(result, args.out)
    if "validation" in sections:
        result["validation"] = {}
        variants = {"graph_token": (1, False), "no_graph (graph_tokens 0)": (0, False), "graph_token_on_empty_graphs": (1, True)}
        for name, (graph_tokens, empty) in variants.items():
            result["validation"][name] = train_and_validate(args, data, graph_tokens, empty_graphs=empty)
            write(result, args.out)
            data.setup("fit") if empty else None
    if "ablations" in sections:
        result["ablations"] = {}
        for name, overrides in ABLATIONS.items():
            result["ablations"][name] = train_and_validate(args, data, 1, empty_graphs=False, **overrides)
            write(result, args.out)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
