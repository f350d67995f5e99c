"""The embedder fine-tuned on the reranker's pairs against the bundled one, on LoCoMo conversations it never trained on.

Runs ``fit-embedder`` (qgmem_train/reranker/embedder_tuning.py) on the reranker config's data: the
held-out conversations are stored with each embedder and the dense channel's and the fused order's
recall@10 and nDCG@10 are compared on the same questions, side by side in one run; this writes the
comparison with the machine it ran on to ``experiments/reranker/results/embedder_tuning.{json,md}``.

    python -m experiments.reranker.embedder                        # configs/reranker-cpu.yaml, model in out/embedder_tuning
    python -m experiments.reranker.embedder --epochs 2 --out /tmp/results
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from qgmem_train.reports import add_report_options, machine_info, remake_reports, write_report
from qgmem_train.__main__ import main as cli
from qgmem_train.retrieval.cross_encoder import TRAINING_RECORD

ROOT = Path(__file__).resolve().parents[2]


def markdown(report: dict) -> str:
    """The side-by-side table of both embedders and the training figures."""
    m, t = report["machine"], report["training"]
    lines = [f"# Embedder fine-tuning ({m.get('cpu')}, {m.get('cores')} cores, load average {m.get('load_average_1m')} at start)", "",
             f"{t['held_out']['base']['n_questions']} questions of {', '.join(t['val_conversations'])} (never trained on), turns mode, "
             f"default retrieval settings, no reranker. The tuned embedder: {t['train_triples']} (question, gold fact, hard negative) "
             f"triples of {', '.join(t['train_conversations'])}, multiple-negatives ranking loss, {t['epochs']} epoch(s), batch "
             f"{t['batch_size']}, learning rate {t['learning_rate']}; held-out loss {t['val_loss_before']} -> {t['val_loss_after']}; "
             f"{t['seconds'] / 60:.1f} min in all (training, a store of the held-out conversations, both evaluations).", "",
             "| embedder | dense recall@10 | dense nDCG@10 | fused recall@10 | fused nDCG@10 |", "|---|---|---|---|---|"]
    for name, row in t["held_out"].items():
        lines.append(f"| {name} | {row['dense/recall@10']:.4f} | {row['dense/ndcg@10']:.4f} | {row['fused/recall@10']:.4f} | {row['fused/ndcg@10']:.4f} |")
    lines += ["", f"The fused order improves on both: **{'yes' if t['improves'] else 'no'}**."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run fit-embedder, then print and write the report (or remake saved reports: --report-only)."""
    parser = argparse.ArgumentParser(prog="python -m experiments.reranker.embedder", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "reranker-cpu.yaml")
    parser.add_argument("--model", type=Path, default=ROOT / "out" / "embedder_tuning" / "model", help="where the tuned embedder is saved")
    parser.add_argument("--epochs", type=int, default=1)
    add_report_options(parser, Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.report_only:
        return remake_reports(args.report_only, markdown, args.check)
    info = machine_info()
    cli(["fit-embedder", "--config", str(args.config), "--out", str(args.model), "--epochs", str(args.epochs), "--device", "cpu"])
    report = {"machine": info, "model": str(args.model), "training": json.loads((args.model / TRAINING_RECORD).read_text())}
    write_report(args.out / "embedder_tuning.json", report, markdown)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.chdir(ROOT)
    raise SystemExit(main())
