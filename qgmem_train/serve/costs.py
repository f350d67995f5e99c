"""What a search costs on a CPU server when an LLM runs in it: the intent parser and the LLM reranker, measured at start.

On a CPU, a search with rule intents and no reranker (or the int8 cross-encoder over a short pool) takes milliseconds;
an LLM intent parse takes seconds and an LLM reranker over the pool minutes. ``serve`` prints :func:`cpu_llm_warning`'s
line at start, so that a server configured so is a choice made knowingly.
"""

from __future__ import annotations

import time

from qgmem_train.predictor.base import Predictor
from qgmem_train.retrieval.intent import parse_intents
from qgmem_train.retrieval.rerank import LLMReranker

PROBE_QUESTION = "What did Caroline do at the support group last week?"
PROBE_DOCUMENT = "Caroline: I went to the LGBTQ support group yesterday and it was so powerful."


def _on_cpu(llm: object) -> bool:
    device = getattr(llm, "device", None)
    return device is not None and getattr(device, "type", str(device)) == "cpu"


def cpu_llm_warning(predictor: Predictor) -> str | None:
    """One line naming each LLM stage a search runs on a CPU with its measured seconds a search; None when none runs."""
    costs = []
    if predictor.intent == "llm" and _on_cpu(predictor.llm):
        start = time.perf_counter()
        with predictor.frozen_pipeline():
            parse_intents([(PROBE_QUESTION, None)], predictor.llm)
        costs.append(f"the LLM intent parser ({time.perf_counter() - start:.1f} s)")
    reranker = predictor.reranker
    if isinstance(reranker, LLMReranker) and _on_cpu(reranker.llm):
        retrieval = predictor.pipeline.retrieval
        pairs = retrieval.rerank_top or retrieval.n
        start = time.perf_counter()
        with predictor.frozen_pipeline():
            reranker.score(PROBE_QUESTION, [PROBE_DOCUMENT])
        pair = time.perf_counter() - start
        costs.append(f"the LLM reranker (about {pair * pairs:.0f} s: {pairs} pairs at {pair:.2f} s)")
    if not costs:
        return None
    return (f"serve: warning: on a CPU every search runs {' and '.join(costs)}, measured now; "
            "--intent rules with --reranker none or cross answer a search in milliseconds")  # fmt: skip
