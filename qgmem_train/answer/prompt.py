"""The final-answer chat of one question: the only place the paper's FINAL_ANSWER prompt is assembled."""

from __future__ import annotations

from qgmem_train.graph.facts import graph_facts_text
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.llm.base import Chat
from qgmem_train.llm.prompts import FINAL_ANSWER

GRAPH_FACTS_HEADING = "Local graph facts:"


def final_answer_chat(question: str, question_time: str | None, context: str, graph: LocalGraph, *, text_path: bool) -> Chat:
    """FINAL_ANSWER rendered over the serialized working memory ``context`` (MEMORY_CONTEXT).

    MEMORY_CONTEXT shows each unit once: units of an evidence cluster by their fact text under the
    cluster's trajectory, every other unit under Facts as its subject | predicate | object triple.
    With ``text_path`` the local graph's edges, one per activated unit, clustered ones included, follow
    under :data:`GRAPH_FACTS_HEADING` as facts labelled with their units' MEMORY_CONTEXT labels (a label names one unit
    with the context or without it: :func:`~qgmem_train.graph.facts.graph_facts_text`): the paper serializes "the
    activated working memory and local graph" as text for a backbone without embedding access (III-D1). Every frozen LLM answers this way (ask, eval answers, the
    predictor without an exported model, data prep: :func:`~qgmem_train.answer.text_path.frozen_answer_chat`);
    without ``text_path`` (the trained graph-token model) the graph reaches the LLM only as graph tokens.
    """
    serialized = context
    if text_path and graph.num_edges:
        serialized = f"{context}\n{GRAPH_FACTS_HEADING}\n{graph_facts_text(graph)}"
    return FINAL_ANSWER.render(query=question, question_time=question_time or "", serialized_graph=serialized)
