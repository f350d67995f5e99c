"""Where graph tokens lose the question: how much of each stage's output differs between questions, over training.

    python -m experiments.graph_token.collapse --trajectories out/graph_token/data/trajectories --readout edges --tokens 10

Trains one graph-token arm of the graph-token study (:mod:`experiments.graph_token`) (same module, learning rate, warm-up and cosine
schedule, seeded; a batch of ``--batch-size``, one by default) on the experiment's trajectories, and before training
and every ``--every`` steps measures three stages on a fixed set of test questions: the readout's vectors
(``readout``), the projector's MLP output before its layer norm (``mlp``) and the graph tokens the LLM reads
(``tokens``). For each stage: the mean pairwise cosine of the questions' mean vectors and the between-question share
of their variance (:mod:`qgmem_train.graph.diagnostics`, as training logs them), and the share of the single vectors'
energy that is not the shared mean (``token_spread``: 0 when every vector of every question is the same); and the
shuffle gap, the answer-span loss with another question's graph minus with the question's own. ``--contrast W`` trains
with the module's ``graph_contrast`` term (needs ``--batch-size`` 2 or more); ``--center reference`` with the reference-centered
projector (``model.projector.center``; its ``mlp`` stage is the MLP output before centering). Writes
``graph_token_collapse_<readout>[_contrastW][_centered].{json,md}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from qgmem_train.reports import machine_info, portable  # noqa: E402
from experiments.graph_token.arms import Variant, shuffled_graphs  # noqa: E402
from experiments.graph_token.training import WARMUP_FRACTION, build_module  # noqa: E402

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM  # noqa: E402
from qgmem_train.errors import InputError  # noqa: E402
from qgmem_train.fileio import write_report_atomic  # noqa: E402

STAGES = ("readout", "mlp", "tokens")


def token_spread(per_question: list[Any]) -> float:
    """Share of the vectors' mean squared norm that is not their common mean (all vectors of all questions pooled)."""
    import torch

    vectors = torch.cat([v for v in per_question if v.shape[0]]).float()
    total = float(vectors.pow(2).sum(-1).mean())
    return float((vectors - vectors.mean(0)).pow(2).sum(-1).mean()) / total if total > 0 else 0.0


def stage_vectors(model: Any, data: Any, examples: list[Any], batch_size: int) -> dict[str, list[Any]]:
    """Each question's real vectors at every stage, in eval mode and without gradients."""
    import torch

    out: dict[str, list[Any]] = {stage: [] for stage in STAGES}
    model.eval()
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            graph = data.collate(examples[start : start + batch_size])["graph"]
            vectors, mask = model.readout(model.encoder.node_states(graph), graph)
            hidden = model.projector.mlp(vectors.flatten(0, 1)).reshape(vectors.shape[0], -1, model.projector.llm_hidden_size)
            tokens = model.graph_embeddings(graph)
            for i in range(vectors.shape[0]):
                keep = slice(None) if mask is None else mask[i].bool()
                out["readout"].append(vectors[i][keep])
                out["mlp"].append(hidden[i][keep])
            out["tokens"] += tokens.per_example()
    return out


def measure(model: Any, data: Any, examples: list[Any], batch_size: int) -> dict[str, dict[str, float]]:
    """Cosine, between-question variance share and single-vector spread of each stage, and the shuffled-graph loss gap."""
    from qgmem_train.graph.diagnostics import graph_token_diagnostics

    stages = {
        stage: {**graph_token_diagnostics(vectors), "token_spread": token_spread(vectors)}
        for stage, vectors in stage_vectors(model, data, examples, batch_size).items()
    }
    return {**stages, "shuffle_gap": shuffle_gap(model, data, examples, batch_size)}


def shuffle_gap(model: Any, data: Any, examples: list[Any], batch_size: int) -> float:
    """Mean answer-span loss with another question's graph minus with the question's own (> 0: the graph carries the question)."""
    import torch

    model.eval()
    answer_losses = []
    with torch.no_grad():
        for graphs_given in (examples, shuffled_graphs(examples, 0)):
            batches = (data.collate(graphs_given[i : i + batch_size]) for i in range(0, len(examples), batch_size))
            answer_losses.append(torch.cat([model.evaluation_losses(batch)[1] for batch in batches]))
    own, shuffled = answer_losses
    return float((shuffled - own).mean())


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train the arm for ``--steps`` steps, measuring every ``--every``."""
    import lightning as L
    import torch

    from qgmem_train.model.datamodule import TrajectoryDataModule
    from qgmem_train.model.module import reference_graphs
    from qgmem_train.schedule import warmup_cosine

    if not args.trajectories.is_dir():
        raise InputError(str(args.trajectories), "not a folder of trajectories (the experiment's out/<run>/data/trajectories)")
    if args.contrast and args.batch_size < 2:
        raise InputError("--contrast", "compares each question with another in its batch: needs --batch-size 2 or more")
    torch.set_num_threads(args.threads)
    machine = machine_info()
    L.seed_everything(args.seed, verbose=False)
    data = TrajectoryDataModule(str(args.trajectories), embedder=args.embedder, batch_size=args.batch_size, eval_batch_size=8, shuffle_seed=args.seed)
    data.setup()
    examples = data.splits["test"][: args.questions]
    if len(examples) < 2:
        raise InputError(str(args.trajectories), "fewer than two test questions to compare")
    variant = Variant("collapse", args.readout, graph_tokens=args.tokens, graph_readout=args.readout, graph_center=args.center)
    torch.manual_seed(args.seed)
    model = build_module(args, variant, data.feature_dim, optim={"contrast": args.contrast, "contrast_margin": args.margin})
    model.load_backbone("cpu")
    if args.center == "reference":
        model.set_reference_graphs(reference_graphs(data, model.projector_args.reference_graphs))
        model.train()
        with torch.no_grad():
            model.graph_embeddings(data.collate(examples[:1])["graph"])  # the statistics the first measurement evaluates with
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.steps, WARMUP_FRACTION, model.optim_args.min_lr_ratio))
    points = [{"step": 0, "train_loss": None, **measure(model, data, examples, 8)}]
    print(f"step 0: {json.dumps(points[-1])}", flush=True)
    batches = itertools.cycle(data.train_dataloader())
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        model.train()
        batch = next(batches)
        loss = model.training_step(batch, step)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if step % args.every == 0 or step == args.steps:
            points.append({"step": step, "train_loss": float(loss), **measure(model, data, examples, 8)})
            print(f"step {step} ({time.perf_counter() - started:.0f} s): {json.dumps(points[-1])}", flush=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}
    return {"settings": settings, "machine": machine, "questions": len(examples), "points": points}


def markdown(result: dict[str, Any]) -> str:
    """The report: one row per measured step, one column group per stage."""
    s = result["settings"]
    lines = [
        f"# Graph-token collapse: {s['readout']} readout, T={s['tokens']}, learning rate {s['lr']}, contrast {s['contrast']},"
        f" projector centering {s.get('center', 'none')}",
        "",
        f"`python -m experiments.graph_token.collapse --trajectories {s['trajectories']} --readout {s['readout']} --tokens {s['tokens']} "
        f"--steps {s['steps']} --every {s['every']} --lr {s['lr']} --batch-size {s['batch_size']} --contrast {s['contrast']} "
        f"--margin {s['margin']} --center {s.get('center', 'none')}` on {result['questions']} test questions; machine: "
        f"{result['machine'].get('cpu')}, {result['machine'].get('cores')} cores, load {result['machine'].get('load_average_1m')}.",
        "",
        "Per stage: mean pairwise cosine of the questions' mean vectors / between-question share of their variance / share of the"
        " single vectors' energy off their common mean. Shuffle gap: the test questions' mean answer-span loss with another"
        " question's graph of their conversation minus with their own (nats; above 0 when the graph carries the question).",
        "",
        "| step | train loss | " + " | ".join(STAGES) + " | shuffle gap |",
        "|---|---|" + "---|" * (len(STAGES) + 1),
    ]
    for point in result["points"]:
        loss = "" if point["train_loss"] is None else f"{point['train_loss']:.3f}"
        cells = [f"{point[k]['cosine']:.5f} / {point[k]['between_variance_ratio']:.2e} / {point[k]['token_spread']:.4f}" for k in STAGES]
        lines.append(f"| {point['step']} | {loss} | " + " | ".join(cells) + f" | {point['shuffle_gap']:+.5f} |")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trajectories", type=Path, required=True, help="the experiment's data/trajectories folder")
    p.add_argument("--readout", choices=("mean", "edges", "query"), default="edges")
    p.add_argument("--tokens", type=int, default=10, help="T (the edges readout: at most T)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=10, help="measure every N steps")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (the experiment's default)")
    p.add_argument("--batch-size", type=int, default=1, help="training examples per step")
    p.add_argument("--contrast", type=float, default=0.0, help="weight of the own-against-another-graph hinge (model.optim.contrast)")
    p.add_argument("--margin", type=float, default=0.1, help="its margin in nats (model.optim.contrast_margin)")
    p.add_argument("--center", choices=("none", "reference"), default="none", help="the projector's centering (model.projector.center)")
    p.add_argument("--questions", type=int, default=64, help="test questions measured")
    p.add_argument("--gnn-hidden", type=int, default=256)
    p.add_argument("--max-context-tokens", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--llm", default=BUNDLED_LLM)
    p.add_argument("--embedder", default=BUNDLED_EMBEDDER)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run and write the report; bad input is one line on stderr and exit 2."""
    args = parser().parse_args(argv)
    try:
        result = run(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stem = f"graph_token_collapse_{args.readout}" + (f"_contrast{args.contrast:g}" if args.contrast else "") + ("_centered" if args.center == "reference" else "")
    result = portable(result, args.out)
    write_report_atomic(args.out / f"{stem}.json", result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
