"""The question pipeline every caller shares: the models of a config, a namespace's search, the text-path answer, the results.

:class:`PipelineModels` builds a config's embedder, reranker, intent parser and answering LLM, each once and only when a
stage needs it; :class:`NamespaceIndex` keeps a namespace's search index as long as the namespace lives, grown by its adds; :func:`search`
walks one question to its working memory and MEMORY_CONTEXT; :func:`answer_text_path` answers on the text path;
:class:`AskResult` and :class:`SearchResult` are what callers get back (:func:`ask_record`: as JSON).
"""

from qgmem_train.pipeline.answer import TextAnswer, answer_text_path
from qgmem_train.pipeline.models import IntentMode, PipelineModels
from qgmem_train.pipeline.results import AskResult, EvidenceUnit, SearchResult, SourceTurn, ask_record
from qgmem_train.pipeline.search import NamespaceIndex, Retrieval, activate_question, question_intents, search

__all__ = [
    "AskResult", "EvidenceUnit", "IntentMode", "NamespaceIndex", "PipelineModels", "Retrieval", "SearchResult", "SourceTurn",
    "TextAnswer", "activate_question", "answer_text_path", "ask_record", "question_intents", "search",
]  # fmt: skip
