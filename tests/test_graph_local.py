"""Local memory graph: one edge per unit, deduplicated nodes, embedder features, batching, text path."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch

from qgmem_train.errors import InputError
from qgmem_train.answer.prompt import GRAPH_FACTS_HEADING, final_answer_chat
from qgmem_train.graph.facts import graph_facts_text
from qgmem_train.graph.local_graph import LocalGraph, graph_to_data, local_graph_from_units, normalize_label
from qgmem_train.memory.timeparse import month_span, spoken_span, year_span
from qgmem_train.memory.types import MemoryUnit, TimeSpan


def unit(i: int, subject: str, predicate: str, obj: str) -> MemoryUnit:
    return MemoryUnit(
        id=f"u{i}", session_id="S1", fact_text=f"{subject} {predicate} {obj}", subject=subject, predicate=predicate,
        object=obj, source_turn_ids=[f"D1:{i}"], source_text="", utterance_time="2023-05-01", serial=i,
    )


UNITS = [
    unit(0, "Alice", "moved to", "Paris"),
    unit(1, "alice ", "works at", "The Bakery."),
    unit(2, "Bob", "visited", "paris"),
    unit(3, "Bob", "likes", ""),
]


def test_one_edge_per_unit_with_deduplicated_nodes() -> None:
    graph = local_graph_from_units(UNITS)
    assert graph.node_labels == ["Alice", "Paris", "The Bakery.", "Bob"]
    assert graph.triples() == [("Alice", "moved to", "Paris"), ("Alice", "works at", "The Bakery."), ("Bob", "visited", "Paris")]
    assert normalize_label("  The  Bakery. ") == "the bakery"


def test_budget_bounds_edges_and_nodes() -> None:
    units = [unit(i, f"s{i}", "p", f"o{i}") for i in range(30)]
    graph = local_graph_from_units(units, max_edges=10)
    assert graph.num_edges == 10 and graph.num_nodes == 20


def test_features_come_from_the_embedder_and_batch(minilm) -> None:
    graph = local_graph_from_units(UNITS)
    data = graph_to_data(graph, minilm.encode, minilm.dim)
    assert data.x.shape == (4, minilm.dim) and data.edge_attr.shape == (3, minilm.dim)
    assert torch.allclose(data.x[1], torch.from_numpy(minilm.encode(["Paris"])[0]), atol=1e-5)
    assert torch.allclose(data.edge_attr[2], torch.from_numpy(minilm.encode(["visited"])[0]), atol=1e-5)
    empty = graph_to_data(LocalGraph(), minilm.encode, minilm.dim)
    batch = Batch.from_data_list([data, empty, data])
    assert batch.num_graphs == 3 and batch.x.shape[0] == 8
    assert batch.edge_index.max().item() == 7 and batch.edge_labels[0] == graph.edge_labels


def test_text_path_appends_facts_labelled_as_the_context_labels_their_units() -> None:
    graph = local_graph_from_units(UNITS, labels={"u0": "F2", "u1": "MU1", "u2": "F1", "u3": "F3"})
    context = "Facts:\n[F1] Bob | visited | paris (utterance_time: 2023-05-01) Bob visited paris\n[F2] Alice | moved to | Paris"
    assert graph_facts_text(graph).splitlines()[0] == "[F2] Alice | moved to | Paris"
    chat = final_answer_chat("Where is Alice?", "2023-06-01", context, graph, text_path=True)
    user = chat[-1]["content"]
    assert f"{GRAPH_FACTS_HEADING}\n[F2] Alice | moved to | Paris\n[MU1] Alice | works at | The Bakery.\n[F1] Bob | visited | Paris" in user
    assert graph_facts_text(local_graph_from_units(UNITS)).splitlines()[-1] == "[F3] Bob | visited | Paris", (
        "without labels, every unit is numbered in working-memory order, as a memory context without clusters numbers it")
    plain = final_answer_chat("Where is Alice?", "2023-06-01", context, graph, text_path=False)[-1]["content"]
    assert GRAPH_FACTS_HEADING not in plain and context in plain



def attributed(i: int, subject: str, obj: str, entities: list[str], locations: list[str]) -> MemoryUnit:
    u = unit(i, subject, "says", obj)
    u.entities, u.locations = entities, locations
    return u


def test_attribute_edges_join_two_units_that_share_an_entity() -> None:
    units = [
        attributed(0, "Melanie", "I took Biscuit to Lisbon", ["Biscuit"], ["Lisbon"]),
        attributed(1, "Caroline", "Is biscuit your dog?", ["biscuit", "Caroline"], []),
    ]
    plain = local_graph_from_units(units)
    assert plain.num_edges == 2 and plain.num_nodes == 4, "without the switch: one edge per unit, two stars"
    graph = local_graph_from_units(units, attribute_edges=True)
    assert graph.triples() == [
        ("Melanie", "says", "I took Biscuit to Lisbon"),
        ("Melanie", "mentions", "Biscuit"),
        ("Melanie", "at", "Lisbon"),
        ("Caroline", "says", "Is biscuit your dog?"),
        ("Caroline", "mentions", "Biscuit"),
    ], "the subject's own name is no attribute edge; 'biscuit' meets 'Biscuit' in one node"
    biscuit = graph.node_labels.index("Biscuit")
    assert {graph.node_labels[s] for s, d in zip(graph.edge_src, graph.edge_dst) if d == biscuit} == {"Melanie", "Caroline"}


def test_attribute_edges_keep_the_unit_budget_and_name_each_edges_unit() -> None:
    units = [attributed(i, f"s{i}", f"o{i}", ["Biscuit"], []) for i in range(5)]
    graph = local_graph_from_units(units, max_edges=3, attribute_edges=True)
    assert graph.num_edges == 6 and {s for s, _, _ in graph.triples()} == {"s0", "s1", "s2"}
    assert graph.edge_unit_labels == ["F1", "F1", "F2", "F2", "F3", "F3"]
    assert local_graph_from_units(units, max_edges=3).edge_unit_labels == ["F1", "F2", "F3"]


def test_the_object_switch_keeps_a_units_whole_fact_or_turn_cut_to_its_words() -> None:
    u = attributed(0, "Caroline", "I went to a support group", [], [])
    u.fact_text, u.source_text = "Caroline went to an LGBTQ support group yesterday and it was powerful.", "Caroline: I went to an LGBTQ support group yesterday and it was so powerful."
    assert local_graph_from_units([u]).triples() == [("Caroline", "says", "I went to a support group")], "gist: the paper's object"
    assert local_graph_from_units([u], object_kind="fact").triples()[0][2] == u.fact_text
    assert local_graph_from_units([u], object_kind="turn").triples()[0][2] == u.source_text, "the whole turn kept"
    assert local_graph_from_units([u], object_kind="turn", object_words=4).triples()[0][2] == "Caroline: I went to"


def test_attribute_edges_go_to_no_stop_word_nor_a_target_most_units_name_and_keep_their_cap() -> None:
    units = [attributed(i, "Assistant", f"turn {i}", ["Since", "Caroline", f"Thing{i}", f"Place{i}"], []) for i in range(4)]
    graph = local_graph_from_units(units, attribute_edges=True)
    targets = [o for _, p, o in graph.triples() if p == "mentions"]
    assert "Since" not in targets, "no edge to a stop word"
    assert "Caroline" not in targets and targets[:2] == ["Thing0", "Place0"], "every unit names Caroline: no edge to her"
    assert "Caroline" in [o for _, p, o in local_graph_from_units(units[:3], attribute_edges=True).triples() if p == "mentions"], "fewer than 4 units: kept"
    capped = local_graph_from_units(units, attribute_edges=True, attribute_cap=1)
    assert [o for _, p, o in capped.triples() if p == "mentions"] == ["Thing0", "Thing1", "Thing2", "Thing3"]


def test_graph_options_carry_every_graph_setting_of_the_config() -> None:
    from qgmem_train.config import pipeline_from_dict
    from qgmem_train.graph.local_graph import graph_options

    settings = pipeline_from_dict({"graph": {"attribute_edges": True, "object": "turn", "object_words": 30, "attribute_cap": 2}}).graph
    assert graph_options(settings) == {"attribute_edges": True, "time_edges": False, "object_kind": "turn", "object_words": 30, "attribute_cap": 2}
    with pytest.raises(InputError, match="graph.object_words"):
        pipeline_from_dict({"graph": {"object_words": 0}})
    with pytest.raises(InputError, match="graph.object"):
        pipeline_from_dict({"graph": {"object": "sentence"}})


def test_graph_settings_read_the_attribute_edges_switch() -> None:
    from qgmem_train.config import pipeline_from_dict

    assert pipeline_from_dict({}).graph.attribute_edges is False
    assert pipeline_from_dict({"graph": {"attribute_edges": True}}).graph.attribute_edges is True


def dated(i: int, subject: str, obj: str, said: str | None, about: list[TimeSpan]) -> MemoryUnit:
    u = unit(i, subject, "says", obj)
    u.utterance_time, u.fact_time = said, about
    return u


def test_time_edges_link_each_unit_to_its_day_and_the_times_it_names_in_words() -> None:
    units = [
        dated(0, "Caroline", "I went to a support group yesterday", "2023-05-08T13:56:00", [TimeSpan("2023-05-07", "2023-05-07")]),
        dated(1, "Melanie", "I painted that last year, in May", "2023-05-08", [year_span(2022), month_span(2023, 5), TimeSpan("2023-05-08", "2023-05-08")]),
        dated(2, "Caroline", "no date here", None, []),
    ]
    assert local_graph_from_units(units).triples() == local_graph_from_units(units, attribute_edges=True).triples()
    assert [p for _, p, _ in local_graph_from_units(units).triples()] == ["says"] * 3, "off: no time edges"
    graph = local_graph_from_units(units, time_edges=True)
    assert graph.triples() == [
        ("Caroline", "says", "I went to a support group yesterday"),
        ("Caroline", "on", "8 May 2023"),
        ("Caroline", "about", "7 May 2023"),
        ("Melanie", "says", "I painted that last year, in May"),
        ("Melanie", "on", "8 May 2023"),
        ("Melanie", "about", "2022"),
        ("Melanie", "about", "May 2023"),
        ("Caroline", "says", "no date here"),
    ], "the day it was said, then each fact time in words; a fact time on the day it was said adds no edge"
    assert graph.node_labels.count("8 May 2023") == 1, "units said on one day meet in its node"


def test_time_edges_keep_the_unit_budget_and_name_each_edges_unit() -> None:
    units = [dated(i, f"s{i}", f"o{i}", "2023-05-08", [TimeSpan("2023-05-01", "2023-05-07", "week")]) for i in range(4)]
    graph = local_graph_from_units(units, max_edges=2, time_edges=True)
    assert graph.num_edges == 6 and ("s0", "about", "the week of 1 May 2023") in graph.triples()
    assert graph.edge_unit_labels == ["F1"] * 3 + ["F2"] * 3


def test_spoken_span_writes_a_span_as_dated_answers_do() -> None:
    assert spoken_span(TimeSpan("2023-05-07", "2023-05-07")) == "7 May 2023"
    assert spoken_span(TimeSpan("2023-05-06", "2023-05-07")) == "6 May 2023..7 May 2023"
    assert spoken_span(month_span(2023, 5)) == "May 2023" and spoken_span(year_span(2022)) == "2022"
    assert spoken_span(TimeSpan("2023-05-01", "2023-05-14", "week")) == "the week of 1 May 2023..the week of 8 May 2023"


def test_graph_settings_read_the_time_edges_switch() -> None:
    from qgmem_train.config import pipeline_from_dict

    assert pipeline_from_dict({}).graph.time_edges is False
    assert pipeline_from_dict({"graph": {"time_edges": True}}).graph.time_edges is True


def test_a_dated_answer_reaches_the_graph_of_a_built_namespace_only_with_time_edges(tmp_path, minilm) -> None:
    """A hand-built dated conversation in turns mode: the answer "7 May 2023" (said "yesterday" on 8 May) is in the
    graph's labels with ``graph.time_edges`` and not without it."""
    from qgmem_train.answer.evidence import answer_evidence
    from qgmem_train.config import PipelineConfig
    from qgmem_train.memory.construct import build_conversation
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.memory.types import Conversation, Session, Turn
    from qgmem_train.metrics.answers import normalize_answer

    turns = [Turn("D1:1", "Caroline", "I went to a LGBTQ support group yesterday and it was so powerful."),
             Turn("D1:2", "Melanie", "Wow, that's cool! What happened that was so awesome?")]
    conversation = Conversation("dated", [Session("session_1", "2023-05-08T13:56:00", turns)])
    cfg = PipelineConfig()
    cfg.construction.units = "turns"
    with MemoryStore.open(tmp_path / "store", create=True) as store:
        build_conversation(store, conversation, cfg, minilm)
        memory = store.load_namespace("dated")
    answer = set(normalize_answer("7 May 2023").split())

    def label_words(time_edges: bool) -> set[str]:
        graph = answer_evidence(memory.units, memory, None, max_edges=10, time_edges=time_edges).graph
        return {w for label in graph.node_labels + graph.edge_labels for w in normalize_answer(label).split()}

    assert not answer <= label_words(False)
    assert answer <= label_words(True)
    from qgmem_train.graph.local_graph import graph_options

    cfg.graph.object = "turn"
    evidence = answer_evidence(memory.units, memory, None, max_edges=10, **graph_options(cfg.graph))
    assert [o for _, p, o in evidence.graph.triples() if p not in ("on", "about")] == [f"{t.speaker}: {t.text}" for t in turns], (
        "graph.object reaches the graph the data prep, evaluation and predictor build (answer_evidence): the whole turn")
