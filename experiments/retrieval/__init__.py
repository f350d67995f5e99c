"""The retrieval study: how well the working memory finds the gold turns of LoCoMo questions, channel by channel, fused,
reranked, against a plain baseline, and with the project's additions to the paper's retrieval switched one by one.

    python -m experiments.retrieval --store /tmp/locomo_turns                      # every channel, fused, reranked (channels)
    python -m experiments.retrieval.paper_pure --store /tmp/locomo_turns           # paper-pure settings against ours
    python -m experiments.retrieval --report-only experiments/retrieval/results/locomo_retrieval.json   # remake a saved report

Modules: ``channels`` (the channels, fusion and LLM reranker against a BM25 + dense baseline), ``paper_pure`` (each
retrieval addition off and on). Reports and their index: ``results/INDEX.md``.
"""
