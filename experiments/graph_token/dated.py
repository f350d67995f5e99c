"""Step 0's rebuilt graphs: the local graphs of the study's test questions rebuilt with the session dates ConvoMem drops,
or built around the question's gold evidence turns instead of its working memory.

ConvoMem re-packs LoCoMo's conversations without their session dates (``locomo_<i>_session_<n>`` has no time), so a
dated answer ("7 May 2023") cannot be in any graph built from it. With LoCoMo's own file, each session gets its
``session_<n>_date_time`` back; each test question's units are read from the data prep's store (the same units in the
same order as its trajectory), dated as the turns mode dates them (utterance time: the session's; fact times: the
turn's time expressions resolved against it), and their local graph is built again with ``graph.time_edges`` as asked.
The memory context is left as prepared, so only the prompts that read the graph change; a graph of other units (the
evidence's, the oracle's) brings their memory context and reasoning path along, labelled alike. A graph built around the
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


def oracle_units(retrieved: list[MemoryUnit], citing: list[MemoryUnit], k: int) -> list[MemoryUnit]:
    """The oracle working memory: the units citing the gold evidence first (store order), then the retrieved ones in
    their order, each once, ``k`` in all: retrieval made perfect at the same budget."""
    return list({unit.id: unit for unit in [*citing, *retrieved]}.values())[:k]


MEMORIES = ("retrieved", "evidence", "oracle")
"""Which units a rebuilt example's graph is made of: its working memory as retrieved, the units citing its gold evidence,
or the oracle working memory (:func:`oracle_units`, whose memory context is rebuilt too)."""


def speaker_names(source: Path, locomo: Path) -> dict[str, str]:
    """Turn id → its speaker's name, for the study's staged ConvoMem cases (``<out>/data/source``) whose sessions LoCoMo's
    own file restores (:func:`~qgmem_train.memory.loaders.restore_locomo`); a session it cannot restore is one clear error."""
    from qgmem_train.memory.loaders import load_convomem, restore_locomo

    conversations, found = restore_locomo(load_convomem(source), load_locomo(locomo))
    if found["not_locomo"] or found["turns_differ"]:
        raise InputError(f"--speaker-names: {locomo.name}", f"restores {found['restored']} sessions; {found['not_locomo']} are not LoCoMo's "
                         f"and {found['turns_differ']} hold other turns than that file's")  # fmt: skip
    return {turn.id: turn.speaker for c in conversations for s in c.sessions for turn in s.turns}


def renamed(unit: MemoryUnit, speakers: dict[str, str], memory: Any) -> MemoryUnit:
    """``unit`` with its turn's speaker (as ConvoMem names it, ``User`` or ``Assistant``) called by name (``speakers``):
    in its subject when the subject is the speaker, and where its fact and source text begin with the speaker."""
    turn = memory.turns[unit.source_turn_ids[0]]
    name, old = speakers.get(turn.id, turn.speaker), turn.speaker
    if name == old:
        return unit
    again = lambda text: f"{name}{text[len(old):]}" if text.startswith(f"{old}:") else text  # noqa: E731
    return replace(unit, subject=name if unit.subject == old else unit.subject, fact_text=again(unit.fact_text), source_text=again(unit.source_text))


def dated_graphs(
    examples: list[Any], store_path: Path, dates: dict[str, str | None] | None, *, max_edges: int, graph: dict[str, Any],
    evidence: dict[str, list[str]] | None = None, memory: str = "retrieved", speakers: dict[str, str] | None = None,
) -> list[Any]:
    """``examples`` with their local graphs rebuilt from the store at ``store_path`` with the graph options ``graph``
    (:func:`~qgmem_train.graph.local_graph.graph_options`), each unit dated from ``dates`` (as stored when None) and its
    speaker named from ``speakers`` (:func:`speaker_names`; as stored when None); with ``memory`` ``evidence`` each graph is
    built from the units that cite the question's gold evidence turns (``evidence``: question id → its turns;
    :func:`citing_units`), with ``oracle`` from the oracle working memory (:func:`oracle_units`, ``max_edges`` units).
    Each edge carries its unit's MEMORY_CONTEXT label; a graph of other units than the retrieved ones brings their memory
    context, unit ids and gold reasoning path (citing the evidence units by those labels) along, so a label names one
    unit in the context, the triples and the target.

    A unit of a session ``dates`` does not know is an :class:`InputError` (the dates are not this data's).
    """
    from data_prep.targets import gold_reasoning_path
    from qgmem_train.answer.memory_context import serialize_working_memory
    from qgmem_train.memory.store import MemoryStore

    rebuilt = []
    with MemoryStore.open(store_path) as store:
        memories: dict[str, tuple[Any, dict[str, MemoryUnit]]] = {}
        for ex in examples:
            if ex.namespace not in memories:
                loaded = store.load_namespace(ex.namespace, sentences=False)
                memories[ex.namespace] = loaded, {u.id: u for u in loaded.units}
            namespace, by_id = memories[ex.namespace]
            units = [by_id[unit_id] for unit_id in ex.unit_ids]
            if memory != "retrieved":
                citing = citing_units(namespace.units, evidence[ex.question_id])
                units = citing if memory == "evidence" else oracle_units(units, citing, max_edges)
            if dates is not None:
                units = [redated(unit, dates, namespace) for unit in units]
            if speakers is not None:
                units = [renamed(unit, speakers, namespace) for unit in units]
            serialized = serialize_working_memory(units, namespace)
            example = replace(ex, graph=local_graph_from_units(units, max_edges, labels=serialized.label_of, **graph))
            if memory != "retrieved":
                example = replace(example, context=serialized.text, unit_ids=[u.id for u in units],
                                  reasoning_path=gold_reasoning_path(serialized.labels, {u.id for u in citing}))  # fmt: skip
            rebuilt.append(example)
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
