"""End-to-end seconds a question of ``activate`` with the ONNX Runtime cross-encoder: how its threads are used.

Each question of a stored LoCoMo conversation is activated by every variant in turn (the order rotating per
question), in one process, so the variants meet the same load, all in int8: one batch at a time on all of
torch's threads as intra-op threads (before batches ran side by side), the pipeline's reranker (batches side by
side, one intra-op thread each) with ONNX Runtime's default spinning threads, and the pipeline's reranker
(threads sleep between operators). The report gives the mean and median wall and CPU seconds a question, the
share of ``activate``'s time spent in the reranker, whether every variant ranked every question the same, and the
load average before and after.

    python bench/bench_rerank_question.py --store STORE --model checkpoints/reranker-cpu-small/model --conversation conv-30 --limit 40
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from qgmem_train.reports import machine_info

from qgmem_train.benchmarks.loaders import last_session_time, load_locomo_questions, spread_subset
from qgmem_train.config import PipelineConfig
from qgmem_train.llm.factory import build_embedder
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.store import MemoryStore
from qgmem_train.retrieval.activation import ActivationIndex, activate
from qgmem_train.retrieval.onnx_rerank import OnnxCrossEncoderReranker, cpu_session, onnx_graph

DEFAULT_INPUT = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo_dev.json"


def with_session(reranker: OnnxCrossEncoderReranker, folder: Path, *, spinning: bool = False, one_batch_at_a_time: bool = False) -> OnnxCrossEncoderReranker:
    """The same int8 reranker with another session: threads that spin between operators (ONNX Runtime's default), or
    one batch at a time on all of torch's threads (the schedule before batches ran side by side)."""
    import torch

    variant = OnnxCrossEncoderReranker.__new__(OnnxCrossEncoderReranker)
    variant.__dict__.update(reranker.__dict__)
    if one_batch_at_a_time:
        variant.workers, variant.batch_threads = 1, None
    variant.session = cpu_session(onnx_graph(reranker.cross_encoder, folder, "int8", None),
                                  intra_op_threads=torch.get_num_threads() if one_batch_at_a_time else 1, spinning=spinning)
    return variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="turns-mode store holding the conversation")
    parser.add_argument("--model", type=Path, required=True, help="CrossEncoder folder (e.g. checkpoints/reranker-cpu/model)")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--conversation", default="conv-30")
    parser.add_argument("--limit", type=int, default=12, help="evenly spaced questions")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rerank_batch_threads.json")
    args = parser.parse_args()

    cfg = PipelineConfig()
    cfg.retrieval.rerank_mode = "blend"
    load_before = os.getloadavg()
    embedder = build_embedder(cfg)
    int8 = OnnxCrossEncoderReranker(str(args.model), quantization="int8")
    variants = {"one batch at a time (before)": with_session(int8, args.model, one_batch_at_a_time=True),
                "batches side by side, spinning threads": with_session(int8, args.model, spinning=True), "batches side by side (after)": int8}
    [conversation] = load_conversations("locomo", args.input, [args.conversation])
    questions = spread_subset(load_locomo_questions(args.input, [args.conversation]), args.limit)
    when = last_session_time(conversation)
    with MemoryStore.open(args.store) as store:
        memory = store.load_namespace(args.conversation, embedder_id=embedder.model_id)
    index = ActivationIndex(memory, cfg.retrieval, embedder)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    rankings: dict[str, list[list[str]]] = {name: [] for name in variants}
    names = list(variants)
    for i, q in enumerate(questions):
        for name in names[i % len(names):] + names[: i % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            wm = activate(q.question, when, memory, cfg=cfg.retrieval, llm=None, embedder=embedder, reranker=variants[name], index=index)
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu, wm.timings["rerank"]))
            rankings[name].append([unit.id for unit in wm.units])
    summary = {name: {"wall_s": round(float(np.mean([t[0] for t in values])), 3), "wall_p50_s": round(float(np.median([t[0] for t in values])), 3),
                      "cpu_s": round(float(np.mean([t[1] for t in values])), 3),
                      "rerank_share": round(float(np.sum([t[2] for t in values]) / np.sum([t[0] for t in values])), 3)}
               for name, values in times.items()}
    before = summary[names[0]]
    for values in summary.values():
        values["wall_ratio_to_before"] = round(values["wall_s"] / before["wall_s"], 3)
        values["wall_p50_ratio_to_before"] = round(values["wall_p50_s"] / before["wall_p50_s"], 3)
    report = {"machine": machine_info(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "model": str(args.model), "conversation": args.conversation, "questions": len(questions), "pool": cfg.retrieval.n,
              "rerank_mode": cfg.retrieval.rerank_mode, "same_rankings": all(rankings[name] == rankings[names[0]] for name in names),
              "variants": summary}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
