"""Step 0's rebuilt graphs: the local graphs of the study's test questions rebuilt with the session dates ConvoMem drops,
or built around the question's gold evidence turns instead of its working memory.

ConvoMem re-packs LoCoMo's conversations without their session dates (``locomo_<i>_session_<n>`` has no time), so a
dated answer ("7 May 2023") cannot be in any graph built from it. With LoCoMo's own file, each session gets its
``session_<n>_date_time`` back; each test question's units are read from the data prep's store (the same units in the
same order as its trajectory), dated as the turns mode dates them (utterance time: the session's; fact times: the
turn's time expressions resolved against it), and their local graph is built again with ``graph.time_edges`` as asked.
The memory context is left as prepared, so only the prompts that read the graph change. A graph built around the
evidence is made of the store's units that cite one of the question's evidence turns (:func:`citing_units`): does a
graph of the units that hold the answer's evidence keep what the answer needs?
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from qgmem_train.errors import InputError
from qgmem_train.graph.local_graph import local_graph_from_units
from qgmem_train.memory.loaders import load_locomo
from qgmem_train.memory.timeparse import resolve_time_expressions
from qgmem_train.memory.types import MemoryUnit

def session_dates(locomo: Path) -> dict[str, str | None]:
    """ConvoMem session id → the session's ISO time from LoCoMo's file (``locomo10.json`` or the project's first 7)."""
    return {f"locomo_{i}_{s.id}": s.time for i, conversation in enumerate(load_locomo(locomo)) for s in conversation.sessions}


def dated_unit(unit: MemoryUnit, time: str | None, turn_text: str) -> MemoryUnit:
    """``unit`` said at ``time``: its utterance time, and its fact times resolved from ``turn_text`` against it."""
    return replace(unit, utterance_time=time, fact_time=resolve_time_expressions(turn_text, time).spans)


def citing_units(units: list[MemoryUnit], evidence_texts: list[str]) -> list[MemoryUnit]:
    """The units whose source dialogue holds one of ``evidence_texts`` (as the data prep's gold targets cite them), in
    store order."""
    from data_prep.targets import cites

    return [unit for unit in units if cites(unit.source_text, evidence_texts)]


def dated_graphs(
    examples: list[Any], store_path: Path, dates: dict[str, str | None] | None, *, max_edges: int, attribute_edges: bool, time_edges: bool,
    evidence: dict[str, list[str]] | None = None,
) -> list[Any]:
    """``examples`` with their local graphs rebuilt from the store at ``store_path``, each unit dated from ``dates`` (as
    stored when None); with ``evidence`` (question id → its gold evidence turns), each graph is built from the units that
    cite them (:func:`citing_units`) instead of the question's working memory.

    A unit of a session ``dates`` does not know is an :class:`InputError` (the dates are not this data's).
    """
    from qgmem_train.memory.store import MemoryStore

    rebuilt = []
    with MemoryStore.open(store_path) as store:
        memories: dict[str, tuple[Any, dict[str, MemoryUnit]]] = {}
        for ex in examples:
            if ex.namespace not in memories:
                memory = store.load_namespace(ex.namespace, sentences=False)
                memories[ex.namespace] = memory, {u.id: u for u in memory.units}
            memory, by_id = memories[ex.namespace]
            units = citing_units(memory.units, evidence[ex.question_id]) if evidence is not None else [by_id[unit_id] for unit_id in ex.unit_ids]
            if dates is not None:
                units = [redated(unit, dates, memory) for unit in units]
            graph = local_graph_from_units(units, max_edges=max_edges, attribute_edges=attribute_edges, time_edges=time_edges)
            rebuilt.append(replace(ex, graph=graph))
    return rebuilt


def redated(unit: MemoryUnit, dates: dict[str, str | None], memory: Any) -> MemoryUnit:
    """``unit`` dated from its session's date in ``dates`` and its turn's text in ``memory``."""
    if unit.session_id not in dates:
        raise InputError(f"--session-dates: session {unit.session_id}", "not a LoCoMo session of that file (the dates are not this data's)")
    return dated_unit(unit, dates[unit.session_id], memory.turns[unit.source_turn_ids[0]].text)


def prep_store(out: Path) -> Path:
    """The data prep's one store below ``<out>/data/prep`` (the study's data prep runs one shard)."""
    stores = sorted((out / "data" / "prep" / "shards").glob("*/store"))
    if len(stores) != 1:
        raise InputError(str(out / "data" / "prep" / "shards"), f"expected the data prep's one store, found {len(stores)}")
    return stores[0]
