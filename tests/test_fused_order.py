"""The fused order pinned on a hand-built namespace: every channel's whole ranking and the RRF pool, ties and ranks below 10.

A change to fusion, to a channel's scores or tie-breaks, or to what a channel passes beyond its top 10 moves one
of these lists; such a change must update them on purpose (and say why the LoCoMo figures moved).
"""

from __future__ import annotations

import numpy as np
import pytest

from qgmem_train.config import RetrievalConfig
from qgmem_train.memory.store import AttributeIndex, NamespaceMemory
from qgmem_train.memory.types import MemoryUnit, Turn
from qgmem_train.memory.unit_table import ENTITY, SUBJECT
from qgmem_train.retrieval.activation import activate
from qgmem_train.retrieval.intent import QueryIntent

QUESTION = "Where does Alex walk Biscuit?"
DIM = 6
# (speaker, text, fact vector as (axis, weight) pairs, entities). Axis 0 is the question's direction, axis 1 Biscuit's.
TURNS = [
    ("Sam", "Do you still walk Biscuit?", [(0, 0.9), (2, 0.44)], ["Biscuit"]),
    ("Alex", "Every morning, along the river.", [(0, 0.6), (3, 0.8)], []),  # the answer: the question's words are in the turn before
    ("Sam", "Biscuit is a beagle, right?", [(1, 1.0)], ["Biscuit the beagle"]),
    ("Alex", "Yes, a beagle.", [(0, 0.6), (3, 0.8)], []),  # the same vector as u01: a dense tie
    ("Sam", "I walk my cat, believe it or not.", [(0, 0.5), (4, 0.87)], []),
    ("Alex", "Biscuit would chase it.", [(0, 0.5), (4, 0.87)], ["Biscuit"]),  # equal attribute score to u00: BM25 orders them
    ("Sam", "Where do you work now?", [(5, 1.0)], []),
    ("Alex", "At the clinic near the park.", [(0, 0.2), (5, 0.98)], []),
    ("Sam", "Does Alex walk there?", [(0, 0.7), (5, 0.71)], []),
    ("Alex", "Sometimes, with Biscuit.", [(0, 0.7), (2, 0.71)], ["Biscuit"]),
    ("Sam", "The park has a pond.", [(2, 1.0)], []),
    ("Alex", "Biscuit swims in it.", [(0, 0.3), (1, 0.3), (2, 0.9)], ["Biscuit"]),
    ("Sam", "Walk, walk, walk.", [(0, 0.1), (3, 0.99)], []),
    ("Alex", "Where was I?", [(4, 1.0)], []),
]
TEXT_VECTORS = {"Biscuit": [(1, 1.0)], "Biscuit the beagle": [(1, 0.8), (2, 0.6)], "Alex": [(3, 1.0)], "Sam": [(4, 1.0)]}


def vector(pairs: list[tuple[int, float]]) -> np.ndarray:
    """A unit vector in DIM dimensions with the given coordinates."""
    v = np.zeros(DIM, np.float32)
    for axis, value in pairs:
        v[axis] = value
    return v / np.linalg.norm(v)


def hand_built_memory() -> NamespaceMemory:
    """Fourteen turns of one session as units, with hand-set fact vectors, entities and each unit's subject (its speaker)."""
    units, turns, turn_time, previous = [], {}, {}, {}
    texts = list(TEXT_VECTORS)
    unit_index, kind, text_id = [], [], []
    for row, (speaker, text, _, entities) in enumerate(TURNS):
        tid = f"D1:{row + 1}"
        turns[tid], turn_time[tid] = Turn(tid, speaker, text), "2024-05-01"
        if row:
            previous[tid] = f"D1:{row}"
        units.append(MemoryUnit(id=f"u{row:02d}", session_id="s1", fact_text=f"{speaker}: {text}", subject=speaker, predicate="says",
                                object=text, source_turn_ids=[tid], source_text=f"{speaker}: {text}", utterance_time="2024-05-01",
                                serial=row, entities=entities))
        for kind_of, value in [(SUBJECT, speaker)] + [(ENTITY, e) for e in entities]:
            unit_index.append(row)
            kind.append(kind_of)
            text_id.append(texts.index(value))
    attributes = AttributeIndex(np.array(unit_index, np.int64), np.array(kind, np.int8), texts,
                                np.stack([vector(TEXT_VECTORS[t]) for t in texts]), np.array(text_id, np.int64))
    return NamespaceMemory(namespace="pinned", units=units, fact_embeddings=np.stack([vector(t[2]) for t in TURNS]),
                           attributes=attributes, traces=[], trace_of={}, turns=turns, turn_time=turn_time, embedder_id="hand-set",
                           previous_turn=previous)


class NoEmbedder:
    """Every vector of this test is given; a channel that asks for one is a change this test should see."""

    model_id = "hand-set"

    def encode(self, texts: object) -> np.ndarray:
        raise AssertionError(f"asked to embed {texts!r}")


@pytest.fixture(scope="module")
def activated():
    query = np.stack([vector([(0, 1.0)]), vector(TEXT_VECTORS["Biscuit"])])
    return activate(QUESTION, "2024-05-02", hand_built_memory(), cfg=RetrievalConfig(), llm=None, embedder=NoEmbedder(), reranker=None,
                    intent=QueryIntent(entities=["Biscuit"]), query_vectors=query)


def test_each_channel_passes_its_whole_ranking_ties_broken_as_documented(activated) -> None:
    channels = activated.channels
    # dense: cosine with axis 0, every unit down to the zero cosines; equal cosines (u08/u09, u01/u03, u04/u05) keep unit order.
    assert channels["dense"] == ["u00", "u08", "u09", "u01", "u03", "u04", "u05", "u11", "u07", "u12", "u02", "u06", "u10", "u13"]
    # bm25: every unit scores, some only through the turn before it (retrieval.lexical_context_turns), e.g. u01.
    assert channels["bm25"] == ["u12", "u09", "u05", "u13", "u01", "u00", "u08", "u06", "u10", "u11", "u03", "u04", "u02", "u07"]
    # attr: Biscuit exactly (u00, u05, u09, u11: equal scores, ordered by BM25), then "Biscuit the beagle" (cosine 0.8 > 0.6).
    assert channels["attr"] == ["u09", "u05", "u00", "u11", "u02"]


def test_the_fused_pool_is_the_rrf_of_those_rankings_in_a_pinned_order(activated) -> None:
    # u09: 1/63 + 1/62 + 1/61. u13 enters the top 10 (1/64 + 1/74) over u04 (1/72 + 1/66) by its dense rank 14.
    assert activated.fused == ["u09", "u00", "u05", "u11", "u02", "u08", "u01", "u12", "u03", "u13", "u04", "u06", "u10", "u07"]
    np.testing.assert_allclose(activated.scores[:2], [1 / 63 + 1 / 62 + 1 / 61, 1 / 61 + 1 / 66 + 1 / 63])
    assert [u.id for u in activated.units] == activated.fused[:10] and activated.reranked == activated.fused
