"""Benchmark loaders: LoCoMo, BEAM, LongMemEval-S and FactConsolidation-SH/MH to conversations plus questions.

Every loader returns the dialogue histories as :class:`Conversation` objects (one store namespace each)
and the questions with their type or ability, reference answer, rubric nuggets, gold evidence turn ids
and the time they are asked. A malformed record raises :class:`InputError` naming file, record and field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from qgmem_train.errors import InputError
from qgmem_train.memory.loaders import load_beam, load_conversations, read_json, require_field
from qgmem_train.memory.types import Conversation, Session, Turn

BENCHMARKS = ("locomo", "beam", "longmemeval", "factconsolidation")
RETRIEVAL_CATEGORIES = (1, 2, 3, 4)
LOCOMO_CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
BEAM_ABILITIES = (
    "abstention", "contradiction_resolution", "event_ordering", "information_extraction", "instruction_following",
    "knowledge_update", "multi_session_reasoning", "preference_following", "summarization", "temporal_reasoning",
)  # fmt: skip
BEAM_REFERENCE_FIELDS = ("answer", "ideal_answer", "ideal_response", "ideal_summary", "expected_compliance")
FACT_SESSION_SIZE = 20
"""Numbered facts per session when a FactConsolidation context is turned into a dialogue history."""

_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")
_LME_DATE = re.compile(r"^\s*(\d{4})/(\d{2})/(\d{2})(?:\s*\(\w+\))?(?:\s+(\d{1,2}):(\d{2}))?\s*$")
_FACT_LINE = re.compile(r"^\s*(\d+)\.\s+(.+?)\s*$")


@dataclass
class EvalQuestion:
    """One question with its gold evidence turns (retrieval evaluation)."""

    conversation_id: str
    index: int
    question: str
    category: int
    evidence: list[str]


@dataclass
class BenchmarkQuestion:
    """One question of an answer-quality benchmark, asked over the conversation ``conversation_id``."""

    id: str
    conversation_id: str
    question: str
    qtype: str
    """LoCoMo category name, LongMemEval question_type, BEAM ability, or FactConsolidation single-hop/multi-hop."""
    reference: str
    question_time: str | None
    evidence: list[str] = field(default_factory=list)
    nuggets: list[str] = field(default_factory=list)
    """BEAM rubric nuggets; for event ordering, the reference items in their correct order."""


@dataclass
class Benchmark:
    """Dialogue histories and the questions asked over them."""

    name: str
    conversations: list[Conversation]
    questions: list[BenchmarkQuestion]


class _InConversation(Protocol):
    conversation_id: str


Q = TypeVar("Q", bound=_InConversation)


def spread_subset(items: Sequence[Any], limit: int | None) -> list[Any]:
    """``limit`` items evenly spaced over ``items`` (all of them when ``limit`` is None or larger)."""
    if limit is None or limit >= len(items):
        return list(items)
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


def group_by_conversation(questions: Iterable[Q]) -> dict[str, list[Q]]:
    """Questions grouped by conversation id, in order of first appearance (one namespace load per group)."""
    groups: dict[str, list[Q]] = {}
    for q in questions:
        groups.setdefault(q.conversation_id, []).append(q)
    return groups


def last_session_time(conversation: Conversation) -> str | None:
    """The latest session time of a conversation: when its questions are taken to be asked."""
    times = [s.time for s in conversation.sessions if s.time and s.turns]
    return max(times) if times else None


def load_locomo_questions(path: Path, conversation_ids: Sequence[str] | None = None) -> list[EvalQuestion]:
    """LoCoMo ``qa`` items of categories 1-4 that list gold evidence turn ids (``"D1:3; D2:4"`` is split)."""
    questions = []
    for sample_id, j, item, category, turns in _locomo_items(path, conversation_ids):
        if category in RETRIEVAL_CATEGORIES and turns:
            questions.append(EvalQuestion(sample_id, j, item["question"], category, turns))
    return questions


def _locomo_items(path: Path, conversation_ids: Sequence[str] | None) -> list[tuple[str, int, dict[str, Any], int, list[str]]]:
    """Checked LoCoMo ``qa`` items: (sample id, index, item, category, evidence turn ids)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError(str(path), "expected a JSON list of samples")
    items = []
    for i, sample in enumerate(data):
        if not isinstance(sample, dict) or not isinstance(sample.get("sample_id"), str):
            raise InputError(f"{path}: sample {i}.sample_id", "missing or not a string")
        sample_id = sample["sample_id"]
        if conversation_ids and sample_id not in conversation_ids:
            continue
        qa = sample.get("qa")
        if not isinstance(qa, list):
            raise InputError(f"{path}: sample {sample_id}.qa", "missing or not a list")
        for j, item in enumerate(qa):
            where = f"{path}: sample {sample_id}.qa[{j}]"
            require_field(item, "question", str, where)
            category = require_field(item, "category", int, where)
            evidence = item.get("evidence", [])
            if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
                raise InputError(f"{where}.evidence", "expected a list of turn ids")
            turns = [t for e in evidence for t in _EVIDENCE_SPLIT.split(e) if t]
            items.append((sample_id, j, item, category, list(dict.fromkeys(turns))))
    return items


def load_locomo_benchmark(path: Path) -> Benchmark:
    """LoCoMo: categories 1-4 with an ``answer`` (category 5, adversarial, has none and is left out as in the paper)."""
    conversations = load_conversations("locomo", path)
    asked = {c.id: last_session_time(c) for c in conversations}
    questions = []
    for sample_id, j, item, category, turns in _locomo_items(path, None):
        if category not in RETRIEVAL_CATEGORIES:
            continue
        answer = require_field(item, "answer", (str, int, float), f"{path}: sample {sample_id}.qa[{j}]")
        questions.append(BenchmarkQuestion(f"{sample_id}/{j}", sample_id, item["question"], LOCOMO_CATEGORY_NAMES[category],
                                           str(answer), asked.get(sample_id), turns))
    return Benchmark("locomo", conversations, questions)


def load_beam_benchmark(path: Path) -> Benchmark:
    """BEAM: ``<chat>/chat.json`` with ``<chat>/probing_questions/probing_questions.json`` ({ability: [question]})."""
    conversations = load_beam(path)
    chat_files = sorted(path.rglob("chat.json")) if path.is_dir() else [path]
    by_id = {c.id: c for c in conversations}
    questions = []
    for chat_file in chat_files:
        conversation_id = f"beam-{chat_file.parent.name}"
        probe_file = chat_file.parent / "probing_questions" / "probing_questions.json"
        if not probe_file.exists():
            continue
        data = read_json(probe_file)
        if not isinstance(data, dict):
            raise InputError(str(probe_file), "expected an object {ability: [questions]}")
        asked = last_session_time(by_id[conversation_id])
        for ability, items in data.items():
            if ability not in BEAM_ABILITIES:
                raise InputError(f"{probe_file}: {ability}", f"unknown ability (known: {', '.join(BEAM_ABILITIES)})")
            if not isinstance(items, list):
                raise InputError(f"{probe_file}: {ability}", "expected a list of questions")
            for j, item in enumerate(items):
                where = f"{probe_file}: {ability}[{j}]"
                question = require_field(item, "question", str, where)
                rubric = require_field(item, "rubric", list, where)
                if not rubric or not all(isinstance(n, str) and n.strip() for n in rubric):
                    raise InputError(f"{where}.rubric", "expected a non-empty list of nugget strings")
                reference = next((item[k] for k in BEAM_REFERENCE_FIELDS if isinstance(item.get(k), str)), None)
                if reference is None:
                    raise InputError(where, f"no reference answer (one of {', '.join(BEAM_REFERENCE_FIELDS)})")
                sources = item.get("source_chat_ids", [])
                ids = sources if isinstance(sources, list) else [i for v in sources.values() for i in v] if isinstance(sources, dict) else []
                questions.append(BenchmarkQuestion(f"{conversation_id}/{ability}/{j}", conversation_id, question, ability, reference,
                                                   asked, [str(i) for i in ids], list(rubric)))
    if not questions:
        raise InputError(str(path), "no probing_questions/probing_questions.json next to any chat.json")
    return Benchmark("beam", conversations, questions)


def longmemeval_time(value: Any, where: str) -> str:
    """A LongMemEval date ``2023/05/20 (Sat) 02:21`` as ISO ``2023-05-20T02:21:00``."""
    match = _LME_DATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise InputError(where, f"unrecognised date {value!r} (expected YYYY/MM/DD (Day) HH:MM)")
    year, month, day, hour, minute = match.groups()
    return f"{year}-{month}-{day}" + (f"T{int(hour):02d}:{minute}:00" if hour else "")


def load_longmemeval_benchmark(path: Path) -> Benchmark:
    """LongMemEval-S: each record's haystack sessions are its own conversation (namespace = question_id).

    Turn ids are ``<session id>:<k>``; turns marked ``has_answer`` are the gold evidence. A question id
    ending in ``_abs`` is an abstention question (judged with the abstention prompt).
    """
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError(str(path), "expected a JSON list of questions")
    conversations, questions = [], []
    for i, record in enumerate(data):
        qid = require_field(record, "question_id", str, f"{path}: record {i}")
        where = f"{path}: record {qid}"
        qtype = require_field(record, "question_type", str, where)
        question = require_field(record, "question", str, where)
        answer = require_field(record, "answer", (str, int, float), where)
        asked = longmemeval_time(record.get("question_date"), f"{where}.question_date")
        ids = require_field(record, "haystack_session_ids", list, where)
        dates = require_field(record, "haystack_dates", list, where)
        raw_sessions = require_field(record, "haystack_sessions", list, where)
        if not len(ids) == len(dates) == len(raw_sessions):
            raise InputError(f"{where}.haystack_sessions", f"{len(raw_sessions)} sessions, {len(ids)} ids and {len(dates)} dates differ")
        sessions, evidence = [], []
        for s, (session_id, date, turns_raw) in enumerate(zip(ids, dates, raw_sessions)):
            swhere = f"{where}.haystack_sessions[{s}]"
            if not isinstance(turns_raw, list):
                raise InputError(swhere, "expected a list of turns")
            turns = []
            for k, raw in enumerate(turns_raw):
                turn = Turn(f"{session_id}:{k}", require_field(raw, "role", str, f"{swhere}[{k}]"), require_field(raw, "content", str, f"{swhere}[{k}]"))
                turns.append(turn)
                if raw.get("has_answer") is True:
                    evidence.append(turn.id)
            sessions.append(Session(str(session_id), longmemeval_time(date, f"{where}.haystack_dates[{s}]"), turns))
        conversations.append(Conversation(qid, sessions))
        kind = "abstention" if qid.endswith("_abs") else qtype
        questions.append(BenchmarkQuestion(qid, qid, question, kind, str(answer), asked, evidence))
    return Benchmark("longmemeval", conversations, questions)


def fact_turns(context: str, record_id: str, where: str) -> list[Turn]:
    """The numbered facts (``0. X is Y.``) of a FactConsolidation context, one turn each; other lines are ignored."""
    turns = [Turn(f"{record_id}:{m[1]}", "user", m[2]) for line in context.splitlines() if (m := _FACT_LINE.match(line))]
    if not turns:
        raise InputError(f"{where}.context", "no numbered facts ('N. fact') found")
    return turns


def load_factconsolidation_benchmark(path: Path) -> Benchmark:
    """FactConsolidation-SH/MH (MemoryAgentBench ``Conflict_Resolution``): a list of {context, questions, answers, metadata}.

    The context's numbered facts become undated turns in sessions of :data:`FACT_SESSION_SIZE` (their
    serial order is the update order: a later fact overrides an earlier one); ``answers[i]`` lists the
    accepted answers of ``questions[i]``. The hop type comes from ``metadata.source`` (``..._sh_..``/``..._mh_..``).
    """
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError(str(path), "expected a JSON list of records")
    conversations, questions = [], []
    for i, record in enumerate(data):
        where = f"{path}: record {i}"
        metadata = record.get("metadata") if isinstance(record, dict) else None
        source = metadata.get("source", "") if isinstance(metadata, dict) else ""
        record_id = f"fact-{i}"
        turns = fact_turns(require_field(record, "context", str, where), record_id, where)
        sessions = [Session(f"chunk_{n // FACT_SESSION_SIZE + 1}", None, turns[n : n + FACT_SESSION_SIZE])
                    for n in range(0, len(turns), FACT_SESSION_SIZE)]
        conversations.append(Conversation(record_id, sessions))
        asked = require_field(record, "questions", list, where)
        answers = require_field(record, "answers", list, where)
        if len(asked) != len(answers):
            raise InputError(f"{where}.answers", f"{len(answers)} answers for {len(asked)} questions")
        hop = "multi-hop" if "_mh" in source else "single-hop" if "_sh" in source else "unknown-hop"
        for j, (question, accepted) in enumerate(zip(asked, answers)):
            if not isinstance(question, str) or not question.strip():
                raise InputError(f"{where}.questions[{j}]", "expected a non-empty string")
            accepted = accepted if isinstance(accepted, list) else [accepted]
            if not accepted or not all(isinstance(a, str) for a in accepted):
                raise InputError(f"{where}.answers[{j}]", "expected a string or a list of strings")
            questions.append(BenchmarkQuestion(f"{record_id}/{j}", record_id, question, hop, " or ".join(accepted), None))
    return Benchmark("factconsolidation", conversations, questions)


LOADERS = {
    "locomo": load_locomo_benchmark,
    "beam": load_beam_benchmark,
    "longmemeval": load_longmemeval_benchmark,
    "factconsolidation": load_factconsolidation_benchmark,
}


def plain_conversation(conversation: Conversation) -> dict[str, Any]:
    """A conversation in the plain format of ``docs/conversations.md`` (what ``build --dataset jsonl`` reads)."""
    return {
        "id": conversation.id,
        "sessions": [{"id": s.id, "time": s.time, "turns": [{"id": t.id, "speaker": t.speaker, "text": t.text} for t in s.turns]}
                     for s in conversation.sessions],
    }  # fmt: skip


def load_benchmark(name: str, path: str | Path) -> Benchmark:
    """Load benchmark ``name`` from ``path`` (a file, or BEAM's folder of chats)."""
    if name not in LOADERS:
        raise InputError("--benchmark", f"unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
    path = Path(path)
    if not path.exists():
        raise InputError(str(path), "input not found")
    return LOADERS[name](path)
