"""Memory units column by column: what one write adds to a namespace, and what a namespace loads.

A :class:`UnitTable` holds N units as text columns and integer arrays, their vectors as float32 arrays,
and four kinds of child rows, each grouped by the unit row owning it: source turn ids, fact time spans,
attributes (entities, locations and the triple subject, each pointing into a table of texts embedded
once) and sentence vectors. Tables concatenate, select rows, sort into unit order and pack into the
store's segments; :class:`UnitView` reads :class:`MemoryUnit` objects out of one, each decoded once,
when first asked for.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from qgmem_train.memory.columns import TextColumn, group_bounds, pack_arrays, take_children, unpack_arrays
from qgmem_train.memory.row_stack import RowStack, row_blocks
from qgmem_train.memory.search_terms import TermLists, unit_term_lists
from qgmem_train.memory.types import MemoryUnit, TimeSpan

ENTITY, LOCATION, SUBJECT = 0, 1, 2
"""Attribute kinds: extracted entities and locations, and the unit's triple subject (an entity for SemMatch)."""

VECTOR_PARTS = ("fact", "relation", "sentence", "text")
"""Vector arrays of a table: one per unit (fact, relation), per sentence row, and per attribute text."""


@dataclass
class EmbeddedUnit:
    """A unit ready to store: its fact, relation and attribute embeddings (attributes: entities, then locations)."""

    unit: MemoryUnit
    fact_embedding: np.ndarray
    relation_embedding: np.ndarray
    attribute_embeddings: np.ndarray
    sentence_embeddings: np.ndarray | None = None
    """One row per sentence of a multi-sentence fact (see :func:`~qgmem_train.memory.sentences.fact_sentences`)."""
    subject_embedding: np.ndarray | None = None
    """The triple subject's embedding; without it, retrieval embeds the subject when it builds its index."""


@dataclass
class AttributeIndex:
    """Entities (kind 0), locations (kind 1) and triple subjects (kind 2) of a namespace's units, one row each.

    Row i belongs to unit ``unit_index[i]`` and its text is ``texts[text_id[i]]``, embedded as
    ``embeddings[text_id[i]]``: a text shared by many rows is stored and embedded once. Without
    ``text_id``, row i has text i.
    """

    unit_index: np.ndarray
    kind: np.ndarray
    texts: Sequence[str]
    embeddings: np.ndarray
    text_id: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.text_id is None:
            self.text_id = np.arange(len(self.unit_index), dtype=np.int64)

    def row_texts(self) -> list[str]:
        """The text of every row."""
        return [self.texts[i] for i in self.text_id]

    def unit_embeddings(self, row: int) -> np.ndarray:
        """(A, d) embeddings of one unit's entities, then locations: its ``attribute_embeddings`` when it was stored."""
        rows = np.flatnonzero((self.unit_index == row) & (self.kind != SUBJECT))
        rows = rows[np.argsort(self.kind[rows], kind="stable")]
        return self.embeddings[self.text_id[rows]].reshape(len(rows), -1)


_UNIT_TEXTS = ("ids", "session_ids", "fact_texts", "subjects", "predicates", "objects", "source_texts", "utterance_times")
"""The text columns with one row per unit."""
_COLUMN_OF_FIELD = {name.removesuffix("s"): name for name in _UNIT_TEXTS}
"""The column holding each text field of a unit: ``id`` in ``ids``, ``predicate`` in ``predicates``."""
_TEXT_COLUMNS = (
    *_UNIT_TEXTS, "turn_ids", "span_starts", "span_ends", "span_granularities", "texts",
)  # fmt: skip
_INT_COLUMNS = ("serials", "subs", "turn_owner", "span_owner", "attribute_owner", "attribute_kind", "attribute_text", "sentence_owner")


@dataclass
class UnitTable:
    """Units as columns; child rows (turn ids, spans, attributes, sentences) each carry their unit row as ``*_owner``."""

    ids: TextColumn
    session_ids: TextColumn
    fact_texts: TextColumn
    subjects: TextColumn
    predicates: TextColumn
    objects: TextColumn
    source_texts: TextColumn
    utterance_times: TextColumn
    serials: np.ndarray
    """Position of each unit's first source turn in the conversation."""
    subs: np.ndarray
    """Index of each unit among its window's units: with ``serials`` and the id, the unit order."""
    turn_owner: np.ndarray
    turn_ids: TextColumn
    span_owner: np.ndarray
    span_starts: TextColumn
    span_ends: TextColumn
    span_granularities: TextColumn
    attribute_owner: np.ndarray
    attribute_kind: np.ndarray
    attribute_text: np.ndarray
    """Row of each attribute's text in ``texts`` (and in the ``text`` vectors)."""
    texts: TextColumn
    sentence_owner: np.ndarray
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    """The vector arrays read (a subset of :data:`VECTOR_PARTS`): fact and relation (N, d), sentence (S, d), text (T, d)."""
    terms: TermLists | None = None
    """BM25 terms of each unit's :func:`~qgmem_train.memory.search_terms.lexical_text` (None: not stored, see :meth:`with_terms`)."""

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_embedded(cls, items: Sequence[EmbeddedUnit], subs: Sequence[int], dim: int) -> UnitTable:
        """The table of ``items`` (``subs``: each one's index among its window's units)."""
        units = [item.unit for item in items]
        owner = lambda counts: np.repeat(np.arange(len(counts), dtype=np.int64), counts)  # noqa: E731
        text_row: dict[str, int] = {}
        text_vectors: list[np.ndarray] = []
        attribute_owner, attribute_kind, attribute_text = [], [], []
        for row, item in enumerate(items):
            u = item.unit
            named = [(ENTITY, t) for t in u.entities] + [(LOCATION, t) for t in u.locations]
            vectors = list(np.asarray(item.attribute_embeddings, np.float32).reshape(len(named), dim))
            if item.subject_embedding is not None:
                named.append((SUBJECT, u.subject))
                vectors.append(np.asarray(item.subject_embedding, np.float32))
            for (kind, text), vector in zip(named, vectors):
                if text not in text_row:
                    text_row[text] = len(text_vectors)
                    text_vectors.append(vector)
                attribute_owner.append(row)
                attribute_kind.append(kind)
                attribute_text.append(text_row[text])
        sentences = [np.asarray(i.sentence_embeddings if i.sentence_embeddings is not None else [], np.float32).reshape(-1, dim) for i in items]
        stack = lambda rows: np.asarray(rows, np.float32).reshape(len(rows), dim)  # noqa: E731
        spans = [s for u in units for s in u.fact_time]
        column = TextColumn.from_strings
        return cls(
            ids=column(u.id for u in units),
            session_ids=column(u.session_id for u in units),
            fact_texts=column(u.fact_text for u in units),
            subjects=column(u.subject for u in units),
            predicates=column(u.predicate for u in units),
            objects=column(u.object for u in units),
            source_texts=column(u.source_text for u in units),
            utterance_times=column(u.utterance_time for u in units),
            serials=np.asarray([u.serial for u in units], np.int64),
            subs=np.asarray(subs, np.int64),
            turn_owner=owner([len(u.source_turn_ids) for u in units]),
            turn_ids=column(t for u in units for t in u.source_turn_ids),
            span_owner=owner([len(u.fact_time) for u in units]),
            span_starts=column(s.start for s in spans),
            span_ends=column(s.end for s in spans),
            span_granularities=column(s.granularity for s in spans),
            attribute_owner=np.asarray(attribute_owner, np.int64),
            attribute_kind=np.asarray(attribute_kind, np.int8),
            attribute_text=np.asarray(attribute_text, np.int64),
            texts=column(text_row),
            sentence_owner=owner([len(s) for s in sentences]),
            vectors={
                "fact": stack([i.fact_embedding for i in items]),
                "relation": stack([i.relation_embedding for i in items]),
                "sentence": np.concatenate([np.zeros((0, dim), np.float32), *sentences]),
                "text": stack(text_vectors),
            },
            terms=unit_term_lists((u.fact_text, u.source_text) for u in units),
        )

    def columns_blob(self) -> bytes:
        """Everything but the vectors, packed into one blob (:func:`~qgmem_train.memory.columns.pack_arrays`)."""
        arrays: dict[str, np.ndarray] = {}
        for name in _TEXT_COLUMNS:
            arrays.update(getattr(self, name).arrays(name))
        arrays.update({name: getattr(self, name) for name in _INT_COLUMNS})
        if self.terms is not None:
            arrays.update(self.terms.arrays())
        return pack_arrays(arrays)

    @classmethod
    def from_columns_blob(cls, blob: bytes, vectors: dict[str, np.ndarray] | None = None) -> UnitTable:
        """The table packed by :meth:`columns_blob`, with ``vectors`` read separately."""
        arrays = unpack_arrays(blob)
        values: dict[str, object] = {name: TextColumn.from_arrays(arrays, name) for name in _TEXT_COLUMNS}
        values.update({name: arrays[name] for name in _INT_COLUMNS})
        return cls(**values, vectors=dict(vectors or {}), terms=TermLists.from_arrays(arrays))  # type: ignore[arg-type]

    def row_counts(self) -> dict[str, int]:
        """Rows of each vector part: units (fact, relation), sentence rows, attribute texts."""
        return {"fact": len(self.ids), "relation": len(self.ids), "sentence": len(self.sentence_owner), "text": len(self.texts)}

    @staticmethod
    def concat(tables: Sequence[UnitTable]) -> UnitTable:
        """The tables one after the other (vector parts: those every table has, each a
        :class:`~qgmem_train.memory.row_stack.RowStack` of the tables' arrays, not copied)."""
        unit_shift = np.cumsum([0] + [len(t) for t in tables[:-1]], dtype=np.int64)
        text_shift = np.cumsum([0] + [len(t.texts) for t in tables[:-1]], dtype=np.int64)
        values: dict[str, object] = {name: TextColumn.concat([getattr(t, name) for t in tables]) for name in _TEXT_COLUMNS}
        for name in _INT_COLUMNS:
            shift = unit_shift if name.endswith("_owner") else text_shift if name == "attribute_text" else None
            parts = [getattr(t, name) + (shift[k] if shift is not None else 0) for k, t in enumerate(tables)]
            values[name] = np.concatenate(parts).astype(getattr(tables[0], name).dtype)
        parts = set.intersection(*(set(t.vectors) for t in tables))
        vectors = {p: _stacked([t.vectors[p] for t in tables]) for p in VECTOR_PARTS if p in parts}
        terms = None if any(t.terms is None for t in tables) else TermLists.concat([t.terms for t in tables])  # type: ignore[misc]
        return UnitTable(**values, vectors=vectors, terms=terms)  # type: ignore[arg-type]

    def take(self, rows: np.ndarray) -> UnitTable:
        """The units at ``rows``, in that order, with their child rows (the attribute texts are kept whole)."""
        rows = np.asarray(rows, np.int64)
        n = len(self)
        values: dict[str, object] = {}
        for name in _UNIT_TEXTS:
            values[name] = getattr(self, name).take(rows)
        values["serials"], values["subs"] = self.serials[rows], self.subs[rows]
        turns, values["turn_owner"] = take_children(self.turn_owner, n, rows)
        values["turn_ids"] = self.turn_ids.take(turns)
        spans, values["span_owner"] = take_children(self.span_owner, n, rows)
        for name in ("span_starts", "span_ends", "span_granularities"):
            values[name] = getattr(self, name).take(spans)
        attributes, values["attribute_owner"] = take_children(self.attribute_owner, n, rows)
        values["attribute_kind"], values["attribute_text"] = self.attribute_kind[attributes], self.attribute_text[attributes]
        sentences, values["sentence_owner"] = take_children(self.sentence_owner, n, rows)
        vectors = {p: v[rows] if p in ("fact", "relation") else v[sentences] if p == "sentence" else v for p, v in self.vectors.items()}
        terms = None if self.terms is None else self.terms.take(rows)
        return UnitTable(**values, texts=self.texts, vectors=vectors, terms=terms)  # type: ignore[arg-type]

    def with_terms(self) -> UnitTable:
        """The table with its BM25 terms: those stored, else made from its text columns (a store written before terms
        were stored, or by another tokenizer version)."""
        if self.terms is not None:
            return self
        return replace(self, terms=unit_term_lists(zip(self.fact_texts.tolist(), self.source_texts.tolist())))  # type: ignore[arg-type]

    def without_unused_texts(self) -> UnitTable:
        """The table with its attribute texts distinct, each one used by an attribute row."""
        texts = self.texts.tolist()
        new_row: dict[str, int] = {}
        kept: list[int] = []
        remap = np.zeros(len(texts), np.int64)
        for row in np.unique(self.attribute_text).tolist():
            if texts[row] not in new_row:
                new_row[texts[row]] = len(kept)
                kept.append(row)
            remap[row] = new_row[texts[row]]
        rows = np.asarray(kept, np.int64)
        vectors = {p: v[rows] if p == "text" else v for p, v in self.vectors.items()}
        return replace(self, attribute_text=remap[self.attribute_text], texts=self.texts.take(rows), vectors=vectors)

    def unit_order(self) -> np.ndarray:
        """Rows in unit order: by serial, then index in the window, then id."""
        order = np.lexsort((self.subs, self.serials))
        serials, subs = self.serials[order], self.subs[order]
        tied = np.r_[False, (serials[1:] == serials[:-1]) & (subs[1:] == subs[:-1])]
        if tied.any():
            starts = np.flatnonzero(~tied)
            ends = np.r_[starts[1:], len(order)]
            for a, b in zip(starts.tolist(), ends.tolist()):
                if b - a > 1:
                    order[a:b] = sorted(order[a:b].tolist(), key=self.ids.__getitem__)
        return order

    def in_unit_order(self, order: np.ndarray | None = None) -> UnitTable:
        """The table sorted into unit order (itself when it already is); ``order``: its :meth:`unit_order`, when already computed."""
        order = self.unit_order() if order is None else order
        return self if np.array_equal(order, np.arange(len(order))) else self.take(order)

    def attribute_index(self) -> AttributeIndex:
        """The attribute rows as retrieval reads them, each distinct text once.

        A text stored by several writes was embedded in other batches (equal up to the last bits): it keeps
        its first vector, so the units sharing it score exactly alike and a tie-break, not noise, orders them.
        Only the distinct texts' vectors are gathered from the segments' (mapped) arrays.
        """
        first: dict[str, int] = {}
        canonical = np.fromiter((first.setdefault(text, row) for row, text in enumerate(self.texts.tolist())), np.int64, len(self.texts))
        if len(first) == len(self.texts):
            return AttributeIndex(self.attribute_owner, self.attribute_kind, self.texts, np.asarray(self.vectors["text"]), self.attribute_text)
        kept = np.fromiter(first.values(), np.int64, len(first))
        position = np.zeros(len(self.texts), np.int64)
        position[kept] = np.arange(len(kept))
        text_id = position[canonical[self.attribute_text]]
        return AttributeIndex(self.attribute_owner, self.attribute_kind, self.texts.take(kept), self.vectors["text"][kept], text_id)


class UnitView(Sequence):
    """The units of a :class:`UnitTable` as :class:`MemoryUnit` objects, each built when first read and kept."""

    def __init__(self, table: UnitTable) -> None:
        self.table = table
        self._units: list[MemoryUnit | None] = [None] * len(table)
        self._complete = False
        self._bounds: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self._units)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        if i < 0:
            i += len(self._units)
        if not 0 <= i < len(self._units):
            raise IndexError(index)
        unit = self._units[i]
        if unit is None:
            unit = self._units[i] = self._build(i)
        return unit

    def __iter__(self) -> Iterator[MemoryUnit]:
        if not self._complete:
            self._build_all()
        return iter(self._units)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def _owner_bounds(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self._bounds:
            self._bounds[name] = group_bounds(getattr(self.table, f"{name}_owner"), len(self.table))
        return self._bounds[name]

    def _build(self, i: int) -> MemoryUnit:
        t = self.table
        turns, spans, attributes = (self._owner_bounds(name) for name in ("turn", "span", "attribute"))
        ta, tb = int(turns[0][i]), int(turns[1][i])
        sa, sb = int(spans[0][i]), int(spans[1][i])
        aa, ab = int(attributes[0][i]), int(attributes[1][i])
        named = [(int(k), t.texts[int(x)]) for k, x in zip(t.attribute_kind[aa:ab], t.attribute_text[aa:ab])]
        return MemoryUnit(
            id=t.ids[i], session_id=t.session_ids[i], fact_text=t.fact_texts[i], subject=t.subjects[i], predicate=t.predicates[i],
            object=t.objects[i], source_turn_ids=[t.turn_ids[j] for j in range(ta, tb)], source_text=t.source_texts[i],
            utterance_time=t.utterance_times[i], serial=int(t.serials[i]),
            fact_time=[TimeSpan(t.span_starts[j], t.span_ends[j], t.span_granularities[j]) for j in range(sa, sb)],
            entities=[text for kind, text in named if kind == ENTITY], locations=[text for kind, text in named if kind == LOCATION],
        )  # fmt: skip

    def _build_all(self) -> None:
        """Every unit not built yet, from columns decoded in one pass each."""
        t = self.table
        n = len(t)
        columns = {name: getattr(t, name).tolist() for name in _UNIT_TEXTS}
        turn_ids = _split(t.turn_ids.tolist(), t.turn_owner, n)
        starts, ends, grains = (_split(getattr(t, name).tolist(), t.span_owner, n) for name in ("span_starts", "span_ends", "span_granularities"))
        texts = t.texts.tolist()
        entities: list[list[str]] = [[] for _ in range(n)]
        locations: list[list[str]] = [[] for _ in range(n)]
        for owner, kind, text in zip(t.attribute_owner.tolist(), t.attribute_kind.tolist(), t.attribute_text.tolist()):
            if kind == ENTITY:
                entities[owner].append(texts[text])
            elif kind == LOCATION:
                locations[owner].append(texts[text])
        serials = t.serials.tolist()
        for i in range(n):
            if self._units[i] is None:
                self._units[i] = MemoryUnit(
                    columns["ids"][i], columns["session_ids"][i], columns["fact_texts"][i], columns["subjects"][i], columns["predicates"][i],
                    columns["objects"][i], turn_ids[i], columns["source_texts"][i], columns["utterance_times"][i], serials[i],
                    [TimeSpan(a, b, g) for a, b, g in zip(starts[i], ends[i], grains[i])], entities[i], locations[i],
                )  # fmt: skip
        self._complete = True


def unit_texts(units: Sequence[MemoryUnit], field: str, start: int = 0) -> list[str | None]:
    """One text field of every unit from ``start`` on (``"id"``, ``"predicate"``, ...): from its packed column when ``units``
    is a loaded :class:`UnitView`, so that no unit is built (building all of a large namespace's units takes seconds)."""
    if isinstance(units, UnitView):
        column = getattr(units.table, _COLUMN_OF_FIELD[field])
        return (column.take(np.arange(start, len(column))) if start else column).tolist()
    return [getattr(unit, field) for unit in units[start:]]


def unit_fact_spans(units: Sequence[MemoryUnit], start: int = 0) -> tuple[np.ndarray, list[TimeSpan]]:
    """The fact time spans of every unit from ``start`` on, grouped by unit in unit order, and the unit row of each: from the
    packed columns when ``units`` is a loaded :class:`UnitView`, as :func:`unit_texts` reads its fields."""
    if not isinstance(units, UnitView):
        rows = range(start, len(units))
        return np.array([row for row in rows for _ in units[row].fact_time], np.int64), [s for row in rows for s in units[row].fact_time]
    t = units.table
    owner = np.asarray(t.span_owner, np.int64)
    first = int(np.searchsorted(owner, start))
    rows = np.arange(first, len(owner))
    columns = (t.span_starts, t.span_ends, t.span_granularities)
    spans = [TimeSpan(a, b, g) for a, b, g in zip(*((c.take(rows) if first else c).tolist() for c in columns))]
    return owner[first:], spans


def first_source_turn_ids(units: Sequence[MemoryUnit], start: int = 0) -> list[str | None]:
    """The first source turn id of every unit from ``start`` on (None for a unit without one): from the packed columns when
    ``units`` is a loaded :class:`UnitView`, as :func:`unit_texts` reads its fields."""
    if not isinstance(units, UnitView):
        return [u.source_turn_ids[0] if u.source_turn_ids else None for u in units[start:]]
    table = units.table
    starts, ends = group_bounds(table.turn_owner, len(table))
    has = np.flatnonzero(ends > starts)
    has = has[has >= start]
    out: list[str | None] = [None] * (len(table) - start)
    for row, turn_id in zip((has - start).tolist(), table.turn_ids.take(starts[has]).tolist()):
        out[row] = turn_id
    return out


def _split(values: list, owner: np.ndarray, n: int) -> list[list]:
    """``values`` (child rows grouped by owner) as one list per owner."""
    starts, ends = group_bounds(owner, n)
    return [values[a:b] for a, b in zip(starts.tolist(), ends.tolist())]


def _stacked(parts: list[np.ndarray | RowStack]) -> np.ndarray | RowStack:
    """The non-empty blocks of ``parts`` as one :class:`RowStack` (or the single block itself); no row is copied."""
    blocks = [b for part in parts for b in row_blocks(part)]
    return RowStack.of([b for b in blocks if len(b)] or blocks[:1])
