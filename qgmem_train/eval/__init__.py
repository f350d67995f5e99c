"""Evaluation of retrieval and answers: ``python -m qgmem_train eval TASK`` (entry: :mod:`qgmem_train.eval.cli`).

Tasks: :mod:`~qgmem_train.eval.retrieval_task` (``retrieval``), :mod:`~qgmem_train.eval.answer_tasks`
(``answers``, ``ablations``). Their parts: answering benchmark questions on either path and judging them
(:mod:`~qgmem_train.eval.answer_quality`, :mod:`~qgmem_train.eval.judge`, :mod:`~qgmem_train.eval.beam_scoring`),
reports and figures (:mod:`~qgmem_train.eval.report`, :mod:`~qgmem_train.eval.plots`). Benchmark loaders and the
metrics live below evaluation, where training and the reranker read them too (:mod:`qgmem_train.benchmarks`,
:mod:`qgmem_train.metrics`).
"""
