"""Conversations in: LoCoMo, BEAM, ConvoMem test cases and a plain JSON/JSONL format, all to one model.

Every loader returns :class:`Conversation` objects with the dataset's own turn ids; a malformed record
raises :class:`InputError` naming the file, the record and the field (the CLI prints it and exits 2).
The plain format is documented in ``docs/conversations.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from qgmem_train.errors import InputError
from qgmem_train.fileio import parse_json, read_text
from qgmem_train.memory.timeparse import parse_session_time
from qgmem_train.memory.types import Conversation, Session, Turn

DATASETS = ("locomo", "beam", "convomem", "jsonl")


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing, folder-valued, unreadable, non-UTF-8 or malformed file is an :class:`InputError`."""
    return parse_json(read_text(path), str(path))


def require_field(record: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``record[key]`` checked for presence and type; the error names ``where.key``."""
    if not isinstance(record, dict):
        raise InputError(where, f"expected an object, got {type(record).__name__}")
    if key not in record:
        raise InputError(f"{where}.{key}", "missing field")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InputError(f"{where}.{key}", f"expected {names}, got {type(value).__name__}")
    return value


def session_time(value: Any, where: str) -> str | None:
    """Parse a session time; an unparsable non-empty value is an error naming ``where``."""
    if value in (None, ""):
        return None
    parsed = parse_session_time(str(value))
    if parsed is None:
        raise InputError(where, f"unrecognised date {value!r}")
    return parsed


def load_locomo(path: Path) -> list[Conversation]:
    """LoCoMo ``locomo10.json``: a list of samples with ``conversation.session_N`` and ``session_N_date_time``.

    A turn that shares an image keeps its caption in the text (``[shares a photo: <blip_caption>]``):
    answers often rest on what the photo shows.
    """
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError(str(path), "expected a JSON list of samples")
    conversations = []
    for i, sample in enumerate(data):
        where = f"{path}: sample {i}"
        sample_id = require_field(sample, "sample_id", str, where)
        where = f"{path}: sample {sample_id}"
        body = require_field(sample, "conversation", dict, where)
        for key in body:
            if re.fullmatch(r"session_\d{10,}", key):
                raise InputError(f"{where}.conversation.{key[:20]}...", "a session number longer than 9 digits")
        numbers = sorted(int(m[1]) for key in body if (m := re.fullmatch(r"session_(\d+)", key)))
        if not numbers:
            raise InputError(f"{where}.conversation", "no session_N lists")
        sessions = []
        for n in numbers:
            key = f"session_{n}"
            turns_raw = require_field(body, key, list, f"{where}.conversation")
            time = session_time(body.get(f"{key}_date_time"), f"{where}.conversation.{key}_date_time")
            turns = []
            for j, raw in enumerate(turns_raw):
                twhere = f"{where}.conversation.{key}[{j}]"
                text = require_field(raw, "text", str, twhere)
                if isinstance(raw.get("blip_caption"), str) and raw["blip_caption"].strip():
                    text = f"{text} [shares a photo: {raw['blip_caption'].strip()}]"
                turns.append(Turn(require_field(raw, "dia_id", str, twhere), require_field(raw, "speaker", str, twhere), text))
            sessions.append(Session(key, time, turns))
        conversations.append(Conversation(sample_id, sessions))
    return conversations


def load_beam(path: Path) -> list[Conversation]:
    """BEAM ``chat.json`` (a list of batches of message groups); a folder loads every ``*/chat.json`` below it.

    A batch is a session whose time is its first message ``time_anchor``; turn ids are the message ids,
    the ids BEAM's probing questions cite. The conversation id is the chat's folder name.
    """
    files = sorted(path.rglob("chat.json"), key=lambda p: [int(s) if s.isdigit() else s for s in p.parts]) if path.is_dir() else [path]
    if not files:
        raise InputError(str(path), "no chat.json below this folder")
    conversations = []
    for file in files:
        data = read_json(file)
        if not isinstance(data, list):
            raise InputError(str(file), "expected a JSON list of batches")
        sessions = []
        for i, batch in enumerate(data):
            where = f"{file}: batch {i}"
            groups = require_field(batch, "turns", list, where)
            time, turns = None, []
            for g, group in enumerate(groups):
                if not isinstance(group, list):
                    raise InputError(f"{where}.turns[{g}]", f"expected a list of messages, got {type(group).__name__}")
                for k, message in enumerate(group):
                    mwhere = f"{where}.turns[{g}][{k}]"
                    msg_id = require_field(message, "id", (int, str), mwhere)
                    role = require_field(message, "role", str, mwhere)
                    content = require_field(message, "content", str, mwhere)
                    if time is None and message.get("time_anchor"):
                        time = session_time(message["time_anchor"], f"{mwhere}.time_anchor")
                    turns.append(Turn(str(msg_id), role, content))
            batch_no = batch.get("batch_number", i + 1)
            sessions.append(Session(f"batch_{batch_no}", time, turns))
        conversations.append(Conversation(f"beam-{file.parent.name}", sessions))
    return conversations


def convomem_sessions(raw_conversations: list[Any], where: str) -> list[Session]:
    """ConvoMem conversations as undated sessions; turn ids are ``<conversation id>:<k>``, a repeated id is read once."""
    sessions: list[Session] = []
    seen: set[str] = set()
    for i, conv in enumerate(raw_conversations):
        cwhere = f"{where}[{i}]"
        conv_id = str(require_field(conv, "id", (str, int), cwhere))
        if conv_id in seen:
            continue
        seen.add(conv_id)
        messages = require_field(conv, "messages", list, cwhere)
        turns = []
        for k, message in enumerate(messages):
            mwhere = f"{cwhere}.messages[{k}]"
            turns.append(Turn(f"{conv_id}:{k + 1}", require_field(message, "speaker", str, mwhere), require_field(message, "text", str, mwhere)))
        sessions.append(Session(conv_id, None, turns))
    return sessions


def load_convomem(path: Path) -> list[Conversation]:
    """ConvoMem test cases: one JSON file, or every ``*.json`` below a folder.

    A case with top-level ``conversations`` (``pre_mixed_testcases``, key ``evidenceItems``) is one
    conversation named after its path. A file with only ``evidence_items`` (HF ``evidence_questions``)
    gives one conversation per item, built from that item's own ``conversations``. ConvoMem has no
    dates: sessions carry no time and units are ordered by turn order. Turn ids are ``<session id>:<k>``.
    """
    root = path if path.is_dir() else path.parent
    files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
    if not files:
        raise InputError(str(path), "no *.json test cases below this folder")
    conversations = []
    for file in files:
        case = read_json(file)
        name = "-".join(file.relative_to(root).with_suffix("").parts)
        where = f"{file}"
        if not isinstance(case, dict):
            raise InputError(where, "expected a test-case object")
        if "conversations" in case:
            raw = require_field(case, "conversations", list, where)
            conversations.append(Conversation(name, convomem_sessions(raw, f"{where}: conversations")))
            continue
        key = "evidence_items" if "evidence_items" in case else "evidenceItems"
        items = require_field(case, key, list, where)
        for i, item in enumerate(items):
            iwhere = f"{where}: {key}[{i}]"
            raw = require_field(item, "conversations", list, iwhere)
            conversations.append(Conversation(f"{name}-{i}", convomem_sessions(raw, f"{iwhere}.conversations")))
    return conversations


LOCOMO_SESSION = re.compile(r"locomo_(\d+)_(session_\d+)")
"""How ConvoMem names a session it re-packed from LoCoMo: ``locomo_<sample index>_session_<n>``."""
PHOTO = re.compile(r" \[shares a photo: .*\]$", re.DOTALL)
"""The photo caption :func:`load_locomo` appends to a turn's text (ConvoMem's turns have none)."""


def restore_locomo(conversations: list[Conversation], locomo: list[Conversation]) -> tuple[list[Conversation], dict[str, int]]:
    """ConvoMem's re-packed LoCoMo sessions given back what the re-packing dropped: the speakers' names (ConvoMem calls
    nearly every speaker ``User`` or ``Assistant``) and the session dates of LoCoMo's own file (:func:`load_locomo`).

    A session named ``locomo_<i>_session_<n>`` (:data:`LOCOMO_SESSION`) takes them from LoCoMo sample ``i``'s session
    ``n`` when it holds the same turns (as many, each LoCoMo's text without its photo caption); any other session is kept
    as it is and counted. Returns the conversations and ``{"restored": sessions, "not_locomo": ..., "turns_differ": ...}``.
    """
    found = {"restored": 0, "not_locomo": 0, "turns_differ": 0}
    restored = []
    for conversation in conversations:
        sessions = []
        for session in conversation.sessions:
            match = LOCOMO_SESSION.fullmatch(session.id)
            source = {s.id: s for s in locomo[int(match[1])].sessions}.get(match[2]) if match and int(match[1]) < len(locomo) else None
            if source is None:
                found["not_locomo"] += 1
            elif len(source.turns) != len(session.turns) or any(
                PHOTO.sub("", theirs.text).strip() != ours.text.strip() for ours, theirs in zip(session.turns, source.turns)
            ):
                found["turns_differ"] += 1
            else:
                found["restored"] += 1
                session = Session(session.id, source.time, [Turn(ours.id, theirs.speaker, ours.text) for ours, theirs in zip(session.turns, source.turns)])
            sessions.append(session)
        restored.append(Conversation(conversation.id, sessions))
    return restored, found


def _plain_conversation(record: Any, where: str) -> Conversation:
    conv_id = str(require_field(record, "id", (str, int), where))
    where = f"{where} ({conv_id})"
    sessions = []
    for i, raw in enumerate(require_field(record, "sessions", list, where)):
        swhere = f"{where}.sessions[{i}]"
        session_id = str(raw.get("id", f"session_{i + 1}")) if isinstance(raw, dict) else ""
        time = session_time(raw.get("time") if isinstance(raw, dict) else None, f"{swhere}.time")
        turns = []
        for k, turn in enumerate(require_field(raw, "turns", list, swhere)):
            twhere = f"{swhere}.turns[{k}]"
            turns.append(Turn(str(require_field(turn, "id", (str, int), twhere)), require_field(turn, "speaker", str, twhere), require_field(turn, "text", str, twhere)))
        sessions.append(Session(session_id, time, turns))
    return Conversation(conv_id, sessions)


def load_plain(path: Path) -> list[Conversation]:
    """The plain format (``docs/conversations.md``): a JSON object or list of them, or JSONL, one per line."""
    if path.suffix == ".jsonl":
        conversations = []
        for n, line in enumerate(read_text(path).split("\n"), start=1):
            if not line.strip():
                continue
            record = parse_json(line, f"{path}: line {n}")
            conversations.append(_plain_conversation(record, f"{path}: line {n}"))
        return conversations
    data = read_json(path)
    records = data if isinstance(data, list) else [data]
    return [_plain_conversation(record, f"{path}: record {i}") for i, record in enumerate(records)]


LOADERS: dict[str, Callable[[Path], list[Conversation]]] = {
    "locomo": load_locomo,
    "beam": load_beam,
    "convomem": load_convomem,
    "jsonl": load_plain,
}


def _check_unique_turn_ids(conversation: Conversation, source: str) -> None:
    seen: set[str] = set()
    for session in conversation.sessions:
        for turn in session.turns:
            if turn.id in seen:
                raise InputError(f"{source}: conversation {conversation.id}, session {session.id}, turn {turn.id}", "duplicate turn id")
            seen.add(turn.id)


def load_conversations(dataset: str, path: str | Path, conversation_ids: Iterable[str] | None = None) -> list[Conversation]:
    """Load ``dataset`` from ``path``, optionally only the conversations whose id is listed."""
    if dataset not in LOADERS:
        raise InputError("--dataset", f"unknown dataset {dataset!r} (known: {', '.join(DATASETS)})")
    path = Path(path)
    try:
        path.stat()
    except FileNotFoundError:
        raise InputError(str(path), "input not found") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
    conversations = LOADERS[dataset](path)
    for conversation in conversations:
        _check_unique_turn_ids(conversation, str(path))
    if conversation_ids:
        wanted = list(conversation_ids)
        known = {c.id for c in conversations}
        missing = [w for w in wanted if w not in known]
        if missing:
            raise InputError(f"{path}: --conversation {missing[0]}", f"no such conversation (known: {', '.join(sorted(known)[:10])}...)")
        conversations = [c for c in conversations if c.id in wanted]
    return conversations
