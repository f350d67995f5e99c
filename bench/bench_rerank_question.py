"""End-to-end seconds a question of ``activate`` with the ONNX Runtime cross-encoder: where they go, and spinning threads or not.

Each question of a stored LoCoMo conversation is activated by every variant in turn (the order rotating per
question), in one process, so the variants meet the same load: the reranker's session with ONNX Runtime's
default spinning threads, the pipeline's session (threads sleep between operators), and the same in int8.
The report gives the mean wall and CPU seconds a question, the share of ``activate``'s time spent in the
reranker, and the load average before and after.

    python bench/bench_rerank_question.py --store STORE --model checkpoints/reranker-cpu/model --conversation conv-30 --limit 12
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from machine import machine_info

from qgmem_train.config import PipelineConfig
from qgmem_train.eval.benchmarks import last_session_time, load_locomo_questions, spread_subset
from qgmem_train.llm.factory import build_embedder
from qgmem_train.memory.loaders import load_conversations
from qgmem_train.memory.store import MemoryStore
from qgmem_train.retrieval.activation import ActivationIndex, activate
from qgmem_train.retrieval.onnx_rerank import OnnxCrossEncoderReranker, onnx_graph

DEFAULT_INPUT = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo_dev.json"


def spinning(reranker: OnnxCrossEncoderReranker, folder: Path, quantization: str) -> OnnxCrossEncoderReranker:
    """The same reranker with a session whose threads spin between operators (ONNX Runtime's default)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = reranker.session.get_session_options().intra_op_num_threads
    options.inter_op_num_threads = 1
    spun = OnnxCrossEncoderReranker.__new__(OnnxCrossEncoderReranker)
    spun.__dict__.update(reranker.__dict__)
    spun.session = onnxruntime.InferenceSession(onnx_graph(reranker.cross_encoder, folder, quantization, None), options,
                                                providers=["CPUExecutionProvider"])
    return spun


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="turns-mode store holding the conversation")
    parser.add_argument("--model", type=Path, required=True, help="CrossEncoder folder (e.g. checkpoints/reranker-cpu/model)")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--conversation", default="conv-30")
    parser.add_argument("--limit", type=int, default=12, help="evenly spaced questions")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rerank_question_time.json")
    args = parser.parse_args()

    cfg = PipelineConfig()
    cfg.retrieval.rerank_mode = "blend"
    load_before = os.getloadavg()
    embedder = build_embedder(cfg)
    fp32 = OnnxCrossEncoderReranker(str(args.model))
    int8 = OnnxCrossEncoderReranker(str(args.model), quantization="int8")
    variants = {"fp32, spinning threads (before)": spinning(fp32, args.model, "none"), "fp32 (after)": fp32,
                "int8, spinning threads": spinning(int8, args.model, "int8"), "int8": int8}
    [conversation] = load_conversations("locomo", args.input, [args.conversation])
    questions = spread_subset(load_locomo_questions(args.input, [args.conversation]), args.limit)
    when = last_session_time(conversation)
    with MemoryStore.open(args.store) as store:
        memory = store.load_namespace(args.conversation, embedder_id=embedder.model_id)
    index = ActivationIndex(memory, cfg.retrieval, embedder)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    names = list(variants)
    for i, q in enumerate(questions):
        for name in names[i % len(names):] + names[: i % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            wm = activate(q.question, when, memory, cfg=cfg.retrieval, llm=None, embedder=embedder, reranker=variants[name], index=index)
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu, wm.timings["rerank"]))
    summary = {name: {"wall_s": round(float(np.mean([t[0] for t in values])), 3), "cpu_s": round(float(np.mean([t[1] for t in values])), 3),
                      "rerank_share": round(float(np.sum([t[2] for t in values]) / np.sum([t[0] for t in values])), 3)}
               for name, values in times.items()}
    before = summary["fp32, spinning threads (before)"]["wall_s"]
    for values in summary.values():
        values["wall_ratio_to_before"] = round(values["wall_s"] / before, 3)
    report = {"machine": machine_info(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "model": str(args.model), "conversation": args.conversation, "questions": len(questions), "pool": cfg.retrieval.n,
              "rerank_mode": cfg.retrieval.rerank_mode, "variants": summary}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
