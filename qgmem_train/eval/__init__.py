"""Evaluation of retrieval and answers: ``python -m qgmem_train eval TASK`` (entry: :mod:`qgmem_train.eval.cli`).

Tasks: :mod:`~qgmem_train.eval.retrieval_task` (``retrieval``), :mod:`~qgmem_train.eval.answer_tasks`
(``answers``, ``ablations``). Their parts: benchmark loaders (:mod:`~qgmem_train.eval.benchmarks`),
retrieval metrics, answer paths and judging (:mod:`~qgmem_train.eval.answers`, :mod:`~qgmem_train.eval.judge`,
:mod:`~qgmem_train.eval.beam_scoring`), reports and figures (:mod:`~qgmem_train.eval.report`,
:mod:`~qgmem_train.eval.plots`).
"""
