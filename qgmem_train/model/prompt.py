"""The final-answer chat of one question, shared by training, validation and the predictor."""

from __future__ import annotations

import re

from qgmem_train.graph.facts import graph_facts_text
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.llm.base import Chat
from qgmem_train.llm.prompts import FINAL_ANSWER

GRAPH_FACTS_HEADING = "Local graph facts:"
_FACT_LABEL = re.compile(r"\[F(\d+)\]")


def final_answer_chat(question: str, question_time: str | None, context: str, graph: LocalGraph, *, text_path: bool) -> Chat:
    """FINAL_ANSWER rendered over the serialized working memory ``context``.

    With ``text_path`` (API backbones, no graph token) the local graph is appended to the context as
    labelled facts under :data:`GRAPH_FACTS_HEADING`, numbered after the context's own ``[F#]`` labels
    so every label stays unique; otherwise the graph reaches the LLM only as graph tokens.
    """
    serialized = context
    if text_path and graph.num_edges:
        first = max((int(n) for n in _FACT_LABEL.findall(context)), default=0) + 1
        serialized = f"{context}\n{GRAPH_FACTS_HEADING}\n{graph_facts_text(graph, first)}"
    return FINAL_ANSWER.render(query=question, question_time=question_time or "", serialized_graph=serialized)
