"""Scores shared by training, evaluation and the studies, below all of them: answers against their references
(:mod:`~qgmem_train.metrics.answers`) and rankings against gold evidence (:mod:`~qgmem_train.metrics.retrieval`)."""
