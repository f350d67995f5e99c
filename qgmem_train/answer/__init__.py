"""Answering a question from its working memory: the final-answer chat, the text path, parsing and citations.

Above retrieval and graph, below the entry points (ask, eval, the predictor, data prep, training's prompt);
data flows one way: conversation → memory → working memory → local graph + MEMORY_CONTEXT → answer.

Modules: :mod:`~qgmem_train.answer.prompt` (the one final-answer chat), :mod:`~qgmem_train.answer.evidence`
(a working memory as MEMORY_CONTEXT plus its local graph), :mod:`~qgmem_train.answer.memory_context` (the
MEMORY_CONTEXT text and its labels), :mod:`~qgmem_train.answer.text_path` (a frozen
LLM answers the chat), :mod:`~qgmem_train.answer.capped` (the string cap both paths decode under),
:mod:`~qgmem_train.answer.parsing` (the answer JSON) and
:mod:`~qgmem_train.answer.citations` (the labels a reasoning path cites, as unit ids).
"""
