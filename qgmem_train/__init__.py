"""QGMem: long-term memory for conversational agents, trained and served with PyTorch Lightning (``python -m qgmem_train``).

Layers, lowest first: :mod:`~qgmem_train.memory` (building and storing memory), :mod:`~qgmem_train.retrieval`
(activating a working memory), :mod:`~qgmem_train.answer` and :mod:`~qgmem_train.graph` (what the answerer reads),
:mod:`~qgmem_train.pipeline` (one question's walk, shared by every caller), then the consumers: :mod:`~qgmem_train.model`
(training the graph path), :mod:`~qgmem_train.predictor`, :mod:`~qgmem_train.serve`, :mod:`~qgmem_train.eval` and
:mod:`~qgmem_train.reranker`. Model backends are in :mod:`~qgmem_train.llm`.
"""
