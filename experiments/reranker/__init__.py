"""The reranker study: which trained cross-encoder, in which mode, runtime and precision, reorders the fused pool best on
LoCoMo conversations it never trained on.

    python -m experiments.reranker --model DIR [DIR ...]          # held-out comparison side by side (compare)
    python -m experiments.reranker.prior                          # the prior β of rerank_mode: blend
    python -m experiments.reranker.embedder                       # the embedder tuned on the reranker's pairs
    python -m experiments.reranker --report-only experiments/reranker/results/reranker_compact.json   # remake a saved report

Modules: ``compare`` (models and modes against the fused order, with latency), ``prior`` (the ``blend`` prior sweep),
``embedder`` (the tuned embedder against the bundled one). Reports and their index: ``results/INDEX.md``.
"""
