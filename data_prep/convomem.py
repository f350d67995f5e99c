"""ConvoMem test cases: find them (Hub dataset or local folder), and read one as a conversation plus questions.

Both layouts are accepted: the Hub's ``core_benchmark/pre_mixed_testcases/<category>/<n>_evidence/*.json``
(files may hold one case or a list of them) and the repository's ``test_cases/<source>/<category>/*.json``.
A category is any folder below the root with that name. Items are read under ``evidenceItems`` or
``evidence_items``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from data_prep.sampling import CaseRef
from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.memory.loaders import convomem_sessions, read_json
from qgmem_train.memory.types import Conversation, Session

HUB_PREFIX = "core_benchmark/pre_mixed_testcases"


@dataclass
class CaseQuestion:
    """One evidence item of a case: question, gold answer and the evidence message texts."""

    question: str
    answer: str
    evidence_texts: list[str]
    evidence_sessions: list[str]


@dataclass
class ConvoMemCase:
    """A test case ready for the pipeline."""

    ref: CaseRef
    conversation: Conversation
    questions: list[CaseQuestion]


def case_namespace(case_id: str) -> str:
    """Store namespace of a case: short, stable, filesystem- and SQL-safe."""
    return "case-" + hashlib.sha1(case_id.encode()).hexdigest()[:16]


def resolve_source(source: str, revision: str | None, categories: list[str]) -> Path:
    """A local folder as it is, or the Hub dataset's category folders downloaded (offline: one clear error)."""
    path = Path(source)
    if path.exists():
        return path
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import OfflineModeIsEnabled

    if constants.HF_HUB_OFFLINE:
        raise ModelUnavailableError(f"{source}: not a local folder, and the Hub is offline (HF_HUB_OFFLINE=1)")
    try:
        local = snapshot_download(
            repo_id=source,
            repo_type="dataset",
            revision=revision,
            allow_patterns=[f"{HUB_PREFIX}/{c}/**" for c in categories],
        )
    except OfflineModeIsEnabled:
        raise ModelUnavailableError(f"{source}: not a local folder, and the Hub is offline (HF_HUB_OFFLINE=1)") from None
    except Exception as exc:  # network and repository errors all mean the same thing to the user
        raise ModelUnavailableError(f"{source}: not a local folder, and the Hub dataset could not be fetched ({type(exc).__name__})") from None
    return Path(local)


@lru_cache(maxsize=8)
def _read(path: str) -> Any:
    return read_json(Path(path))


def _cases_in(value: Any) -> list[dict]:
    return value if isinstance(value, list) else [value]


def discover_cases(root: Path, categories: list[str]) -> dict[str, list[CaseRef]]:
    """Every case of every wanted category below ``root``, as references (files are read lazily)."""
    found: dict[str, list[CaseRef]] = {}
    for category in categories:
        folders = sorted(p for p in root.rglob(category) if p.is_dir())
        refs = []
        for folder in folders:
            for file in sorted(folder.rglob("*.json")):
                rel = str(file.relative_to(root))
                refs += [CaseRef(category, rel, i) for i in range(len(_cases_in(_read(str(file)))))]
        if refs:
            found[category] = refs
    return found


def _items(case: dict, where: str) -> tuple[str, list]:
    key = "evidenceItems" if "evidenceItems" in case else "evidence_items"
    items = case.get(key)
    if not isinstance(items, list):
        raise InputError(where, "field evidenceItems (or evidence_items) missing or not a list")
    return key, items


def _item_conversations(item: Any, where: str) -> list:
    """The ``conversations`` of an evidence item (every item's, not only the questions kept); none when it has none."""
    if not isinstance(item, dict):
        raise InputError(where, "expected an evidence-item object")
    conversations = item.get("conversations") or []
    if not isinstance(conversations, list):
        raise InputError(f"{where}.conversations", "must be a list")
    return conversations


def _question(item: Any, where: str) -> CaseQuestion:
    conversations = _item_conversations(item, where)
    for name in ("question", "answer"):
        if not isinstance(item.get(name), (str, int, float)) or not str(item.get(name)).strip():
            raise InputError(f"{where}.{name}", "missing or empty")
    evidences = item.get("message_evidences") or []
    if not isinstance(evidences, list):
        raise InputError(f"{where}.message_evidences", "must be a list")
    texts = [str(e.get("text", "")) for e in evidences if isinstance(e, dict)]
    sessions = [str(c.get("id")) for c in conversations if isinstance(c, dict) and c.get("id")]
    return CaseQuestion(str(item["question"]), str(item["answer"]), texts, sessions)


def load_case(root: Path, ref: CaseRef, *, max_questions: int | None, max_sessions: int | None) -> ConvoMemCase:
    """Read one case: its haystack (evidence sessions first when capped) and its first questions."""
    file = root / ref.path
    cases = _cases_in(_read(str(file)))
    where = f"{file}[{ref.index}]" if len(cases) > 1 else str(file)
    if ref.index >= len(cases) or not isinstance(cases[ref.index], dict):
        raise InputError(where, "expected a test-case object")
    case = cases[ref.index]
    key, items = _items(case, where)
    questions = [_question(item, f"{where}: {key}[{i}]") for i, item in enumerate(items[:max_questions] if max_questions else items)]
    raw = case.get("conversations")
    if raw is None:
        raw = [c for i, item in enumerate(items) for c in _item_conversations(item, f"{where}: {key}[{i}]")]
    if not isinstance(raw, list):
        raise InputError(f"{where}: conversations", "must be a list")
    sessions: list[Session] = convomem_sessions(raw, f"{where}: conversations")
    if max_sessions:
        wanted = {s for q in questions for s in q.evidence_sessions}
        keep = [s for s in sessions if s.id in wanted] + [s for s in sessions if s.id not in wanted]
        keep_ids = {s.id for s in keep[:max_sessions]}
        sessions = [s for s in sessions if s.id in keep_ids]
    return ConvoMemCase(ref, Conversation(ref.case_id, sessions), questions)
