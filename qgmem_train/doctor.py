"""``python -m qgmem_train doctor``: resolve the configured models and exercise each once.

A quick setup check before long jobs: the LLM writes one schema-valid JSON record (constrained to the
final-answer schema) and the embedder embeds a few turns; sizes come from the loaded models. A last line
says which reranker retrieval will use (and how to build a cross-encoder folder that is missing).
"""

from __future__ import annotations

import argparse
import json
import time

from qgmem_train.config import load_pipeline_config
from qgmem_train.llm.factory import build_embedder, build_llm
from qgmem_train.llm.prompts import FINAL_ANSWER
from qgmem_train.llm.schemas import AnswerOutput
from qgmem_train.llm.structured import ParseStats, generate_structured
from qgmem_train.retrieval.rerank import reranker_line

SAMPLE_TURNS = [
    "Caroline: I went to an LGBTQ support group yesterday and it was so powerful.",
    "Melanie: That's great! I painted a sunrise over the lake last year.",
    "Caroline: I'm thinking of studying counseling next year.",
]


def main(argv: list[str]) -> int:
    """Parse flags, load both models, print one JSON line per check and one naming the reranker."""
    parser = argparse.ArgumentParser(prog="python -m qgmem_train doctor", description=__doc__)
    parser.add_argument("--config", help="YAML with a pipeline: section (default: bundled CPU models)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens for the sample generation")
    args = parser.parse_args(argv)
    cfg = load_pipeline_config(args.config)

    started = time.perf_counter()
    llm = build_llm(cfg)
    stats = ParseStats()
    chat = FINAL_ANSWER.render(
        query="What did Caroline attend?",
        question_time="2023-05-08",
        serialized_graph="Facts:\n" + "\n".join(f"F{i + 1}: {t}" for i, t in enumerate(SAMPLE_TURNS)),
    )
    (record,) = generate_structured(llm, [chat], AnswerOutput, max_new_tokens=args.max_new_tokens, stats=stats)
    print(json.dumps({"check": "llm", "model": llm.model_id, "record": record.model_dump() if record else None, "parse": stats.as_dict()}))

    embedder = build_embedder(cfg)
    vectors = embedder.encode(SAMPLE_TURNS)
    print(json.dumps({"check": "embedder", "model": embedder.model_id, "shape": list(vectors.shape), "dim": embedder.dim}))
    print(json.dumps({"check": "reranker", "uses": reranker_line(cfg)}))
    print(json.dumps({"check": "done", "seconds": round(time.perf_counter() - started, 1)}))
    return 0 if record is not None else 1
