"""Working-memory activation (paper III-B): a namespace's channels (BM25, dense, attributes, graph), RRF and reranking.

Public names: :class:`~qgmem_train.retrieval.activation.ActivationIndex` (a namespace's search structures) and
:func:`~qgmem_train.retrieval.activation.activate` (one question's :class:`~qgmem_train.retrieval.activation.WorkingMemory`),
query intents (:mod:`~qgmem_train.retrieval.intent`), the rerankers (:func:`~qgmem_train.retrieval.rerank.build_reranker`,
:func:`~qgmem_train.retrieval.rerank.rerank_document`) and the channels' indexes (``BM25Index``, ``DenseIndex``,
``AttributeScorer``, ``GraphChannel``). Below the answering layer and the model; callers walk a question through
:mod:`qgmem_train.pipeline`.
"""
