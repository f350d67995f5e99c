"""``python -m experiments.reranker``: trained rerankers compared on held-out conversations (:mod:`experiments.reranker.compare`)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from experiments.reranker.compare import main  # noqa: E402

raise SystemExit(main())
