"""The graph channel (``graph`` in ``retrieval.channels``): a walk from the question's entities and the fused top units.

A hand-built conversation where the answer (u05) shares no word and no entity with the question, only a location
with the question's best unit (u00); an unrelated unit (u03) is closer to the question in the dense space. The walk
must reach u05 and rank it above u03, in memory and from a store written in schema version 2, before the channel
existed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qgmem_train.config import RetrievalConfig, pipeline_from_dict
from qgmem_train.errors import InputError
from qgmem_train.memory.store import AttributeIndex, EmbeddedUnit, MemoryStore, NamespaceMemory
from qgmem_train.memory.types import MemoryUnit, Turn
from qgmem_train.memory.unit_table import ENTITY, LOCATION, SUBJECT
from qgmem_train.retrieval.activation import activate
from qgmem_train.retrieval.intent import QueryIntent
from tests import store_v2
from tests.test_fused_order import NoEmbedder, vector

QUESTION = "Where is Biscuit walked?"
DIM = 6
# (speaker, text, fact vector as (axis, weight) pairs, entities, locations). Axis 0 is the question's direction.
TURNS = [
    ("Alex", "I walk Biscuit at Riverside Park.", [(0, 0.9), (1, 0.44)], ["Biscuit"], ["Riverside Park"]),  # the question's best unit
    ("Sam", "Lovely. How was your week?", [(2, 1.0)], [], []),
    ("Alex", "Busy with the new job.", [(3, 1.0)], ["job"], []),
    ("Sam", "The bakery sells rye bread now.", [(0, 0.3), (4, 0.95)], ["bakery"], []),  # unrelated, yet nearer the question
    ("Alex", "I tried it on Sunday.", [(5, 1.0)], ["bakery"], []),
    ("Sam", "Riverside Park closes at dusk these days.", [(0, 0.1), (2, 0.99)], [], ["Riverside Park"]),  # the answer
    ("Alex", "Good to know.", [(3, 0.5), (5, 0.87)], [], []),
]
TEXT_VECTORS = {"Biscuit": [(1, 1.0)], "Riverside Park": [(2, 1.0)], "job": [(3, 1.0)], "bakery": [(4, 1.0)],
                "Alex": [(5, 1.0)], "Sam": [(3, 0.6), (5, 0.8)]}  # fmt: skip
GRAPH = {"channels": ["bm25", "dense", "attr", "graph"], "graph_seeds": 1}
"""The channel on, seeded by the fused order's best unit only (this namespace is too small for more to mean anything)."""


def units_and_turns() -> tuple[list[MemoryUnit], list[tuple[str, str, str, str, str]]]:
    """The units (one a turn) and the turn rows (id, session, speaker, text, time) of the conversation."""
    units, turns = [], []
    for row, (speaker, text, _, entities, locations) in enumerate(TURNS):
        tid = f"D1:{row + 1}"
        turns.append((tid, "s1", speaker, text, "2024-05-01"))
        units.append(MemoryUnit(id=f"u{row:02d}", session_id="s1", fact_text=f"{speaker}: {text}", subject=speaker, predicate="says",
                                object=text, source_turn_ids=[tid], source_text=f"{speaker}: {text}", utterance_time="2024-05-01",
                                serial=row, entities=entities, locations=locations))
    return units, turns


def hand_built_memory() -> NamespaceMemory:
    """The conversation as a namespace held in memory, with hand-set vectors."""
    units, turns = units_and_turns()
    texts = list(TEXT_VECTORS)
    rows = [(row, kind, texts.index(value)) for row, u in enumerate(units)
            for kind, value in [(SUBJECT, u.subject)] + [(ENTITY, e) for e in u.entities] + [(LOCATION, p) for p in u.locations]]
    owner, kind, text_id = (np.array(column) for column in zip(*rows))
    attributes = AttributeIndex(owner.astype(np.int64), kind.astype(np.int8), texts,
                                np.stack([vector(TEXT_VECTORS[t]) for t in texts]), text_id.astype(np.int64))
    return NamespaceMemory(namespace="walk", units=units, fact_embeddings=np.stack([vector(t[2]) for t in TURNS]), attributes=attributes,
                           traces=[], trace_of={}, turns={t[0]: Turn(t[0], t[2], t[3]) for t in turns},
                           turn_time={t[0]: t[4] for t in turns}, embedder_id="hand-set",
                           previous_turn={later[0]: earlier[0] for earlier, later in zip(turns, turns[1:])})


def ask(memory: NamespaceMemory, **settings: object):
    """The working memory of the question over ``memory``, every vector given."""
    query = np.stack([vector([(0, 1.0)]), vector(TEXT_VECTORS["Biscuit"])])
    return activate(QUESTION, "2024-05-02", memory, cfg=RetrievalConfig(**settings), llm=None, embedder=NoEmbedder(), reranker=None,
                    intent=QueryIntent(entities=["Biscuit"]), query_vectors=query)


def test_the_walk_reaches_a_unit_that_shares_only_a_place_with_the_best_unit_and_ranks_it_above_an_unrelated_one() -> None:
    memory = hand_built_memory()
    without, with_graph = ask(memory), ask(memory, **GRAPH)
    assert without.fused[0] == with_graph.fused[0] == "u00"
    assert "u05" not in without.channels["bm25"] + without.channels["attr"]  # no word, no entity of the question
    walked = with_graph.channels["graph"]
    assert walked[0] == "u00" and "u05" in walked  # the seed first: the walk returns to it
    assert "u03" not in walked or walked.index("u05") < walked.index("u03")
    assert without.fused.index("u03") < without.fused.index("u05")
    assert with_graph.fused.index("u05") < with_graph.fused.index("u03")


def test_the_channel_at_weight_zero_leaves_the_fused_order() -> None:
    memory = hand_built_memory()
    assert ask(memory, **GRAPH, graph_weight=0.0).fused == ask(memory).fused


def test_a_store_written_before_the_channel_existed_answers_with_it(tmp_path: Path) -> None:
    units, turns = units_and_turns()
    attribute_vectors = lambda u: np.array([vector(TEXT_VECTORS[a]) for a in u.entities + u.locations], np.float32).reshape(-1, DIM)  # noqa: E731
    items = [EmbeddedUnit(u, vector(t[2]), vector(t[2]), attribute_vectors(u)) for u, t in zip(units, TURNS)]
    db = store_v2.create_store(tmp_path, "hand-set", DIM)
    store_v2.add_namespace(db, "walk", "turns")
    store_v2.add_units(db, "walk", items, [0] * len(items))
    store_v2.add_turns(db, "walk", turns)
    db.close()
    with MemoryStore.open(tmp_path) as store:
        memory = store.load_namespace("walk", embedder_id="hand-set")
    # version 2 stored no subject vectors: the subjects are embedded when the index is built; these settings leave them out
    walked = ask(memory, **GRAPH, subject_entities=False)
    assert walked.channels["graph"][:2] == ["u00", "u05"]
    assert walked.fused.index("u05") < walked.fused.index("u03")


@pytest.mark.parametrize(("key", "value"), [("graph_links", ["attribute", "friends"]), ("graph_restart", 1.5), ("graph_iterations", 1)])
def test_bad_walk_settings_are_refused_naming_the_setting(key: str, value: object) -> None:
    with pytest.raises(InputError, match=f"retrieval.{key}"):
        pipeline_from_dict({"retrieval": {key: value}})
