"""How ``rerank_mode: blend`` weighs the fused rank: the prior β chosen where no evaluation looks.

``blend`` ranks a pool by the cross-encoder's scores standardized over the pool minus β·ln(1 + fused
rank). β is chosen where no evaluation looks: the pools of the conversations the reranker trained on
(``make reranker``'s cached pools, ``out/reranker/pools.json``), each scored once, every β of the grid
applied to the same scores. Relevance is by gold unit (one unit a turn in a turns-mode store). The
reranker has seen these questions, so it looks stronger here than on new conversations and a β chosen
here errs towards the reranker; ``python -m experiments.reranker`` then measures the chosen β on the held-out ones.
``--conversation`` sweeps other cached conversations instead, such as those a model trained with
another split never saw, so β is chosen on held-out questions that are not the benchmark's.

    python -m experiments.reranker.prior                       # checkpoints/reranker-cpu/model, every training question
    python -m experiments.reranker.prior --stride 2 --quantization int8
    python -m experiments.reranker.prior --model checkpoints/reranker-cpu-small/model --runtime onnxruntime --quantization int8
    python -m experiments.reranker.prior --model MODEL_TRAINED_WITHOUT_THEM --conversation conv-26 conv-41
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from qgmem_train.reports import add_report_options, machine_info, remake_reports, write_report
from experiments.reranker.compare import cross_encoder, read_training

from qgmem_train.metrics.retrieval import aggregate, ranking_metrics
from qgmem_train.reranker.data import RerankData
from qgmem_train.retrieval.activation import blend_with_fused_rank
from qgmem_train.retrieval.rerank import Reranker

ROOT = Path(__file__).resolve().parents[2]
K = 10
KEYS = (f"recall@{K}", f"ndcg@{K}")
PRIORS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def sweep(data: RerankData, reranker: Reranker, priors: tuple[float, ...], stride: int) -> list[dict]:
    """Per-question metrics of the fused order and of ``blend`` at each prior, over every ``stride``-th question of ``data``."""
    records = []
    for example in data.examples[::stride]:
        scores = reranker.score(example.question, [data.document(example, uid) for uid in example.pool])
        orders = {"fused": example.pool}
        for prior in priors:
            blended = blend_with_fused_rank(scores, prior)
            orders[f"blend {prior:g}"] = [example.pool[i] for i in np.argsort(-blended, kind="stable")]
        sources = {uid: [uid] for uid in (*example.pool, *example.gold)}
        records.append({"category": example.category, **ranking_metrics(orders, sources, set(example.gold), K)})
    return records


def markdown(report: dict) -> str:
    """The sweep's table and the chosen prior."""
    m = report["machine"]
    lines = [f"# The prior of `rerank_mode: blend`, chosen on {report.get('split', 'training')} conversations of the reranker ({', '.join(report['conversations'])})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m.get('torch_threads')}, load average at start {m.get('load_average_1m')}. "
             f"Reranker `{report['model']}` (quantization {report['quantization']}, runtime {report.get('runtime', 'torch')}), {report['n_questions']} questions (every {report['stride']}), "
             f"cached fused pools of `{report['pools']}`, relevance by gold unit.", "",
             "| ranking | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{row[k]:.4f}" for k in KEYS) + " |" for name, row in report["rankings"].items()]
    lines += ["", f"Chosen (best recall@{K}, then nDCG@{K}): β = {report['chosen']:g}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Score the chosen conversations' pools once, sweep β, print and write experiments/reranker/results/<report>.{json,md}
    (or remake saved reports: --report-only)."""
    parser = argparse.ArgumentParser(prog="python -m experiments.reranker.prior", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "reranker-cpu" / "model", help="trained CrossEncoder folder")
    parser.add_argument("--pools", type=Path, default=ROOT / "out" / "reranker" / "pools.json", help="the reranker's cached pools (make reranker)")
    parser.add_argument("--conversation", nargs="+", help="cached conversations to sweep (default: the model's training conversations)")
    parser.add_argument("--stride", type=int, default=1, help="every this-many-th question")
    parser.add_argument("--quantization", choices=("none", "int8"), default="none", help="models.reranker_quantization (default: none)")
    parser.add_argument("--runtime", choices=("torch", "onnxruntime"), default="torch", help="models.reranker_runtime (default: torch)")
    add_report_options(parser, Path(__file__).parent / "results", "rerank_prior")
    args = parser.parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown, args.check)
    training = read_training(args.model)
    if not args.pools.exists():
        raise SystemExit(f"{args.pools} not found: train the reranker first (make reranker)")
    conversations = args.conversation or training["train_conversations"]
    pools = RerankData.load(args.pools)
    missing = sorted(set(conversations) - set(pools.documents))
    if missing:
        raise SystemExit(f"{args.pools} has no pools of {', '.join(missing)} (it has {', '.join(sorted(pools.documents))})")
    data = pools.subset(conversations)
    trained = set(conversations) & set(training["train_conversations"])
    split = "training" if trained == set(conversations) else "held-out" if not trained else "training and held-out"
    info = machine_info()
    started = time.perf_counter()
    reranker = cross_encoder(args.model, args.quantization, args.runtime, batch_size=8)
    records = sweep(data, reranker, PRIORS, args.stride)
    names = ["fused"] + [f"blend {p:g}" for p in PRIORS]
    means = aggregate(records, [f"{name}/{key}" for name in names for key in KEYS])
    rankings = {name: {key: round(means[f"{name}/{key}"], 4) for key in KEYS} for name in names}
    chosen = max(PRIORS, key=lambda p: (rankings[f"blend {p:g}"][f"recall@{K}"], rankings[f"blend {p:g}"][f"ndcg@{K}"]))
    report = {"machine": info, "model": str(args.model), "quantization": args.quantization, "runtime": args.runtime, "pools": str(args.pools),
              "split": split, "conversations": data.conversations, "stride": args.stride, "n_questions": len(records), "rankings": rankings,
              "chosen": chosen, "seconds": round(time.perf_counter() - started, 1)}
    write_report(args.out / f"{args.report}.json", report, markdown)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    raise SystemExit(main())
