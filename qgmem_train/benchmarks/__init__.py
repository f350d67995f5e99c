"""Benchmark files as conversations and questions, below their readers (evaluation, the reranker's training data, the
studies): the loaders (:mod:`~qgmem_train.benchmarks.loaders`) and LoCoMo's questions made ready to activate
(:mod:`~qgmem_train.benchmarks.question_batches`)."""
