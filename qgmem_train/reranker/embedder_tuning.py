"""``python -m qgmem_train fit-embedder --config configs/reranker-cpu.yaml``: fine-tune the embedder on the reranker's pairs.

The bundled MiniLM embedder is trained with sentence-transformers' multiple-negatives ranking loss on
(question, gold unit fact, hard negative fact) triples: the questions, gold units and fused candidate
pools of the reranker config's ``data`` section (the same turns-mode store and cached pools as
``fit-reranker``), one negative a triple drawn from the pool's first :data:`HARD_TOP` ranks, the other
triples' facts serving as in-batch negatives. The held-out conversations are then stored again with the
tuned embedder, and the dense channel's and the fused order's recall@10 and nDCG@10 are compared with the
base embedder's on the same questions. The folder is published atomically with ``training.json`` (the
split, the validation loss before and after, the comparison and ``improves``: whether the fused order got
better on both). A store must be built with the embedder it is searched with, and the embedder also
embeds the graph's node and edge features: the tuned model is a new ``models.embedder`` for new stores
(and graph encoders trained with it), not a drop-in for those already built.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from qgmem_train.config import ModelsConfig, PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.fileio import publish_output_folder, read_text, refuse_foreign_folder, staging_beside
from qgmem_train.logging_setup import is_quiet
from qgmem_train.memory.store_uri import shown_store
from qgmem_train.reranker.data import HARD_TOP, RerankData, ensure_turns_store
from qgmem_train.retrieval.cross_encoder import TRAINING_RECORD

if TYPE_CHECKING:
    from qgmem_train.reranker.datamodule import RerankDataModule

DEFAULT_OUT = "checkpoints/embedder-cpu/model"
K = 10
ORDERS = ("dense", "fused")
METRICS = (f"recall@{K}", f"ndcg@{K}")
Triples = dict[str, list[str]]


def training_triples(data: RerankData, store: Path, embedder_id: str, seed: int) -> Triples:
    """(question, gold fact, hard negative fact) for every gold unit of ``data`` whose pool has a negative in its first ranks."""
    from qgmem_train.memory.store import MemoryStore

    rng = np.random.default_rng(seed)
    triples: Triples = {"anchor": [], "positive": [], "negative": []}
    with MemoryStore.open(store) as memory_store:
        for cid in data.conversations:
            facts = {u.id: u.fact_text for u in memory_store.load_namespace(cid, embedder_id=embedder_id, sentences=False).units}
            for example in (e for e in data.examples if e.conversation_id == cid):
                hard = [uid for rank, uid in example.negatives() if rank < HARD_TOP]
                for positive in example.gold if hard else ():
                    triples["anchor"].append(example.question)
                    triples["positive"].append(facts[positive])
                    triples["negative"].append(facts[hard[int(rng.integers(len(hard)))]])
    return triples


def fine_tune(base: str, train: Triples, val: Triples, out: Path, *, epochs: int, batch_size: int, learning_rate: float,
              seed: int, device: str) -> dict[str, float]:
    """Train ``base`` on ``train`` with the multiple-negatives ranking loss and save it to ``out``; the loss on ``val`` before and after."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    from transformers.trainer_callback import ProgressCallback

    from qgmem_train.llm.embedder import Embedder

    model = Embedder(base, device=device).model
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out.parent / f".{out.name}.trainer"), num_train_epochs=epochs, per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size, learning_rate=learning_rate, warmup_steps=0.1, seed=seed, data_seed=seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to=[], use_cpu=device == "cpu", logging_steps=20,
        disable_tqdm=False,
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict(train), eval_dataset=Dataset.from_dict(val),
                                         loss=MultipleNegativesRankingLoss(model))
    if is_quiet():
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(_progress_without_logs())
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    model.save(str(out))
    shutil.rmtree(args.output_dir, ignore_errors=True)
    return {"val_loss_before": round(float(before), 4), "val_loss_after": round(float(after), 4)}


def _progress_without_logs() -> Any:
    """The trainer's progress bars without its log lines (shown with ``-v``): the command prints its own summary."""
    from transformers.trainer_callback import ProgressCallback

    class ProgressWithoutLogs(ProgressCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            return None

    return ProgressWithoutLogs()


def held_out_store(input_path: Path, conversations: list[str], embedder: str, store: Path) -> None:
    """A turns-mode store of the ``conversations`` of the LoCoMo file ``input_path`` only, embedded with ``embedder``.

    A scratch store of the run: its build's summary line stays out of the command's output (its progress bar shows).
    """
    with contextlib.redirect_stdout(io.StringIO()):
        ensure_turns_store(input_path, store, embedder=embedder, conversations=conversations)


def retrieval_metrics(input_path: Path, store: Path, embedder_name: str, conversations: list[str]) -> dict[str, float]:
    """Mean recall@10 and nDCG@10 of the dense channel's order and of the fused order over the questions of ``conversations``."""
    from qgmem_train.benchmarks.question_batches import locomo_question_batches
    from qgmem_train.llm.factory import build_embedder
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.metrics.retrieval import aggregate, ranking_metrics
    from qgmem_train.retrieval.activation import activate

    cfg = PipelineConfig(models=ModelsConfig(embedder=embedder_name, device="cpu"))
    embedder = build_embedder(cfg)
    records = []
    with MemoryStore.open(store) as memory_store:
        for batch in locomo_question_batches(input_path, memory_store, embedder, cfg.retrieval, conversations):
            sources = {u.id: u.source_turn_ids for u in batch.memory.units}
            for q, intent, vectors in batch.items():
                wm = activate(q.question, batch.question_time, batch.memory, cfg=cfg.retrieval, llm=None, embedder=embedder, reranker=None,
                              index=batch.index, intent=intent, query_vectors=vectors)
                orders = {"dense": wm.channels["dense"], "fused": wm.fused}
                records.append({"category": q.category, **ranking_metrics(orders, sources, set(q.evidence), K)})
    keys = [f"{order}/{key}" for order in ORDERS for key in METRICS]
    means = aggregate(records, keys)
    return {"n_questions": len(records), **{key: round(means[key], 4) for key in keys}}


def improves(comparison: dict[str, dict[str, float]]) -> bool:
    """Whether the tuned embedder's fused order beats the base's on both recall@10 and nDCG@10."""
    return all(comparison["tuned"][f"fused/{key}"] > comparison["base"][f"fused/{key}"] for key in METRICS)


def rerank_data_module(config: Path) -> RerankDataModule:
    """The reranker data of a reranker config's ``data`` section, with ``fit-reranker``'s defaults and checks."""
    import inspect

    from qgmem_train.reranker.datamodule import RerankDataModule

    try:
        data = (yaml.safe_load(read_text(config, kind="reranker config")) or {}).get("data")
    except yaml.YAMLError as exc:
        raise InputError(str(config), f"not YAML ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise InputError(str(config), "no data section (input, store, cache, val_conversations)")
    settings = [name for name in inspect.signature(RerankDataModule).parameters if name != "device"]
    for name in data:
        if name not in settings:
            raise InputError(f"data.{name}", f"not a setting of the reranker data (known: {', '.join(settings)})")
    return RerankDataModule(**data)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: the reranker config, where to save, and the training settings."""
    parser = argparse.ArgumentParser(prog="python -m qgmem_train fit-embedder", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--config", type=Path, required=True, help="reranker config (configs/reranker-cpu.yaml): its data section names the pairs")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="folder for the tuned embedder: new, empty or an earlier output (replaced atomically)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32, help="triples a step; the other triples' facts are in-batch negatives")
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="torch device of the training (auto, cpu, cuda)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Build the triples, fine-tune, compare on the held-out conversations, publish the folder and print one summary line."""
    args = parse_args(argv)
    refuse_foreign_folder(args.out)
    started = time.perf_counter()
    data_module = rerank_data_module(args.config)
    data_module.setup()
    input_path, store, held_out = data_module.input, data_module.store, [str(c) for c in data_module.val_conversations]
    base = data_module.pipeline.models.embedder
    train_data, val_data = data_module.train_data, data_module.val_data
    train = training_triples(train_data, store, base, args.seed)
    val = training_triples(val_data, store, base, args.seed)
    if not train["anchor"] or not val["anchor"]:
        raise InputError(str(args.config), "no (question, gold, hard negative) triples in the training or the held-out conversations")
    with staging_beside(args.out) as staging:
        losses = fine_tune(base, train, val, staging / "model", epochs=args.epochs, batch_size=args.batch_size,
                           learning_rate=args.learning_rate, seed=args.seed, device=args.device)
        held_out_store(input_path, held_out, str(staging / "model"), staging / "held_out_store")
        comparison = {"base": retrieval_metrics(input_path, store, base, held_out),
                      "tuned": retrieval_metrics(input_path, staging / "held_out_store", str(staging / "model"), held_out)}
        record = {
            "base_model": base, "loss": "MultipleNegativesRankingLoss", "epochs": args.epochs, "batch_size": args.batch_size,
            "learning_rate": args.learning_rate, "seed": args.seed, "input": str(input_path),
            "input_sha256": hashlib.sha256(input_path.read_bytes()).hexdigest()[:16], "store": shown_store(store),
            "train_conversations": train_data.conversations, "val_conversations": val_data.conversations,
            "train_triples": len(train["anchor"]), "val_triples": len(val["anchor"]), **losses,
            "held_out": comparison, "improves": improves(comparison), "seconds": round(time.perf_counter() - started, 1),
        }
        (staging / "model" / TRAINING_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        publish_output_folder(staging / "model", args.out, "fit-embedder")
    base_row, tuned_row = comparison["base"], comparison["tuned"]
    print(f"fit-embedder: {len(train['anchor'])} triples in {record['seconds'] / 60:.1f} min, val loss {losses['val_loss_before']} -> "
          f"{losses['val_loss_after']}; held out: dense recall@10 {base_row['dense/recall@10']} -> {tuned_row['dense/recall@10']}, "
          f"fused recall@10 {base_row['fused/recall@10']} -> {tuned_row['fused/recall@10']}, fused nDCG@10 {base_row['fused/ndcg@10']} -> "
          f"{tuned_row['fused/ndcg@10']} ({'better' if record['improves'] else 'not better: keep the base embedder'}); saved {args.out}")
    return 0
