"""Data of the graph-token study: ConvoMem cases grouped into conversations, the split by conversation, and the data
prep that turns the staged conversations into the split trajectory folder."""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qgmem_train.reports import git_state
from qgmem_train.config import BUNDLED_LLM
from qgmem_train.errors import InputError
from qgmem_train.fileio import write_json_atomic
from qgmem_train.memory.types import Session

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "convomem" / "test_cases"
SPLITS = ("train", "validation", "test")
RETRIEVAL_K = 10
"""Units a working memory holds in the data prep (``retrieval.k``), so edges of at most that many units a local graph."""
STAGED_CATEGORY = "conversations"
"""Folder of the staged cases (data prep's one category): one case per conversation."""

log = logging.getLogger(__name__)


@dataclass
class ConversationCases:
    """The cases of one conversation: its sessions (the union of the cases' haystacks) and its questions."""

    name: str
    case_ids: list[str]
    sessions: list[Session]
    questions: list[tuple[str, Any]]
    """``(category, CaseQuestion)`` in case order."""


def data_folder(data: Path | None) -> Path:
    """``--data`` resolved, or the default ConvoMem folder when it is not given; one clear error when that is missing."""
    if data is None:
        if not DEFAULT_DATA.is_dir():
            raise InputError("--data", f"no ConvoMem folder at the default {DEFAULT_DATA}; pass --data DIR")
        data = DEFAULT_DATA
    return data.resolve()


def category_of(file: Path) -> str:
    """A case file's category: its folder, or the folder above a Hub ``<n>_evidence`` folder."""
    folder = file.parent
    return folder.parent.name if re.fullmatch(r"\d+_evidence", folder.name) else folder.name


def find_conversations(root: Path) -> list[ConversationCases]:
    """Every case below ``root`` grouped into conversations: cases that share a session id are one conversation.

    Named after the cases' common file stem (``dataset_3``) when they have one, else after their first session.
    """
    from data_prep.convomem import discover_cases, load_case

    if not root.is_dir():
        raise InputError(str(root), "not a folder; pass --data DIR, a ConvoMem-format folder (<source>/<category>/*.json)")
    files = [p for p in sorted(root.rglob("*.json")) if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    categories = sorted({category_of(p) for p in files})
    refs = sorted({ref for found in discover_cases(root, categories).values() for ref in found}, key=lambda r: r.case_id)
    if not refs:
        raise InputError(str(root), "no ConvoMem test cases (*.json below <category>/ folders) here")
    cases = [load_case(root, ref, max_questions=None, max_sessions=None) for ref in refs]

    parent = list(range(len(cases)))

    def top(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, case in enumerate(cases):
        for session in case.conversation.sessions:
            if session.id in owner:
                parent[top(i)] = top(owner[session.id])
            else:
                owner[session.id] = i
    groups: dict[int, list[Any]] = defaultdict(list)
    for i, case in enumerate(cases):
        groups[top(i)].append(case)

    found: list[ConversationCases] = []
    taken: Counter = Counter()
    for members in groups.values():
        stems = {Path(c.ref.path).stem for c in members}
        sessions: dict[str, Session] = {}
        for case in sorted(members, key=lambda c: (-len(c.conversation.sessions), c.ref.case_id)):
            for session in case.conversation.sessions:
                sessions.setdefault(session.id, session)
        base = stems.pop() if len(stems) == 1 else next(iter(sessions), "conversation")
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", base)
        taken[base] += 1
        name = base if taken[base] == 1 else f"{base}-{taken[base]}"
        questions = [(c.ref.category, q) for c in sorted(members, key=lambda c: c.ref.case_id) for q in c.questions]
        found.append(ConversationCases(name, sorted(c.ref.case_id for c in members), list(sessions.values()), questions))
    return sorted(found, key=lambda c: c.name)


def split_conversations(
    names: list[str], seed: int, test: list[str] | None = None, validation: str | None = None, test_count: int = 1
) -> dict[str, list[str]]:
    """``test_count`` test conversations and one validation conversation (named, else drawn with ``seed``), every other one train.

    A conversation is in exactly one split; the split needs at least one train conversation.
    """
    names = sorted(set(names))
    count = len(test) if test else test_count
    if len(names) < count + 2:
        raise InputError(
            "--data", f"{len(names)} conversation(s) found ({', '.join(names) or 'none'}); the split needs at least {count + 2} "
            f"(train, validation, {count} test)",
        )  # fmt: skip
    for option, name in [("--test-conversation", t) for t in test or []] + [("--validation-conversation", validation)]:
        if name is not None and name not in names:
            raise InputError(option, f"{name!r} is not a conversation here (found: {', '.join(names)})")
    if test and validation in test:
        raise InputError("--validation-conversation", "must differ from --test-conversation")
    pool = [n for n in names if n not in (test or []) and n != validation]
    random.Random(f"split:{seed}").shuffle(pool)
    tests = sorted(test) if test else sorted(pool.pop(0) for _ in range(count))
    validation = validation or pool.pop(0)
    return {"train": sorted(pool), "validation": [validation], "test": tests}


def quotas(total: int | None, sizes: list[int]) -> list[int]:
    """``total`` questions spread evenly over conversations of ``sizes`` questions (None: all of them)."""
    if total is None:
        return list(sizes)
    share, extra = divmod(total, len(sizes))
    return [min(size, share + (i < extra)) for i, size in enumerate(sizes)]


def staged_case(conversation: ConversationCases, picked: list[int]) -> dict[str, Any]:
    """A ConvoMem test case of the conversation's whole haystack and the ``picked`` questions (with their category)."""
    items = []
    for i in picked:
        category, question = conversation.questions[i]
        items.append(
            {
                "question": question.question,
                "answer": question.answer,
                "message_evidences": [{"speaker": "User", "text": t} for t in question.evidence_texts],
                "category": category,
            }
        )
    sessions = [{"id": s.id, "messages": [{"speaker": t.speaker, "text": t.text} for t in s.turns]} for s in conversation.sessions]
    return {"evidenceItems": items, "conversations": sessions}


def prep_config(args: argparse.Namespace, config: Path, source: Path, cases: int) -> str:
    """The study's data-prep config (written to ``config``): turns units, rule intent, gold targets, the study's
    retrieval k and graph, and the reranker and traces of ``--reranker`` (``--reranker-model``) and ``--traces``."""
    reranker = f"    reranker: {args.reranker}\n" + (f"    reranker_model: {json.dumps(args.reranker_model)}\n" if args.reranker_model else "")
    return (
        "# Written by python -m experiments.graph_token: one staged case per conversation; rerun with\n"
        f"#   python -m data_prep --config {config}\n"
        "data_prep:\n"
        f"  source: {json.dumps(str(source))}\n"
        f"  categories: {{{STAGED_CATEGORY}: 1}}\n"
        f"  total_cases: {cases}\n"
        "  seed: 0\n  intent: rules\n  target: gold\n  validation_fraction: 0.0\n  test_fraction: 0.0\n"
        f"  out: {json.dumps(str(config.parent / 'prep'))}\n"
        "pipeline:\n"
        f"  models:\n    llm: {BUNDLED_LLM}\n    embedder: {args.embedder}\n{reranker}    dtype: float32\n    device: cpu\n"
        f"  construction:\n    units: turns\n    traces: {str(args.traces).lower()}\n    sentence_vectors: {str(args.sentence_vectors).lower()}\n"
        f"  retrieval:\n    k: {RETRIEVAL_K}\n"
        f"  graph:\n    attribute_edges: {str(args.attribute_edges).lower()}\n"
    )  # fmt: skip


def prepare_data(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Split by conversation, stage one case per conversation, run data prep, write the split trajectory folder."""
    data_dir = out / "data"
    summary_file = data_dir / "split.json"
    if summary_file.exists() and (data_dir / "trajectories").exists():
        import yaml

        config = data_dir / "data_prep.yaml"
        made, asked = (yaml.safe_load(text)["pipeline"] for text in (config.read_text(), prep_config(args, config, data_dir / "source", 0)))
        if made != asked:
            changed = sorted(f"{group}.{key}" for group in asked for key in asked[group] if made.get(group, {}).get(key) != asked[group][key])
            raise InputError(str(config), f"the data here was prepared with other {', '.join(changed)}; pass another --out")
        log.info("[data] reusing %s", data_dir / "trajectories")
        return json.loads(summary_file.read_text())

    started = time.perf_counter()
    conversations = find_conversations(args.data)
    by_name = {c.name: c for c in conversations}
    split = split_conversations(list(by_name), args.split_seed, args.test_conversation, args.validation_conversation, args.test_count)
    from data_prep.config import load_data_prep_config  # the data checks above come before the model libraries load
    from data_prep.merge import merge
    from data_prep.run import run_shard
    from qgmem_train.trajectory import read_trajectory_dataset, write_trajectory_dataset

    caps = {"train": args.max_train_questions, "validation": args.max_val_questions, "test": args.max_test_questions}
    log.info(
        "[data] %d conversations in %s: %s", len(conversations), args.data,
        "; ".join(f"{s} {', '.join(split[s])}" for s in SPLITS),
    )  # fmt: skip

    source = data_dir / "source" / STAGED_CATEGORY
    questions: dict[str, dict[str, str]] = {}
    for name in SPLITS:
        members = [by_name[n] for n in split[name]]
        for conversation, quota in zip(members, quotas(caps[name], [len(c.questions) for c in members])):
            order = list(range(len(conversation.questions)))
            random.Random(f"questions:{args.split_seed}:{conversation.name}").shuffle(order)
            picked = sorted(order[:quota])
            write_json_atomic(source / f"{conversation.name}.json", staged_case(conversation, picked))
            case_id = f"{STAGED_CATEGORY}/{conversation.name}.json#0"
            for number, i in enumerate(picked):
                questions[f"{case_id}/q{number}"] = {"conversation": conversation.name, "split": name, "category": conversation.questions[i][0]}

    config = data_dir / "data_prep.yaml"
    config.write_text(prep_config(args, config, source.parent, len(conversations)))
    cfg, pipeline = load_data_prep_config(config)
    log.info("[data] data prep: %d staged cases, %d questions (%s)", len(conversations), len(questions), config)
    run_shard(cfg, pipeline)
    manifest = merge(cfg, pipeline)

    rows = read_trajectory_dataset(manifest["dataset"])["train"]
    splits: dict[str, list[Any]] = {name: [] for name in SPLITS}
    for example in rows:
        splits[questions[example.question_id]["split"]].append(example)
    write_trajectory_dataset(splits, data_dir / "trajectories")
    per_category = {
        name: dict(sorted(Counter(questions[ex.question_id]["category"] for ex in splits[name]).items())) for name in SPLITS
    }
    summary = {
        "source": str(args.data),
        "conversations": {
            c.name: {"cases": c.case_ids, "sessions": len(c.sessions), "turns": sum(len(s.turns) for s in c.sessions), "questions": len(c.questions)}
            for c in conversations
        },
        "split": split,
        "commit": git_state()["commit"],
        "examples": {name: len(part) for name, part in splits.items()},
        "examples_per_category": per_category,
        "questions": questions,
        "data_prep": {
            "config": str(config),
            "seconds_per_case": manifest["seconds_per_case"],
            "cases_per_hour": manifest["cases_per_hour"],
            "questions_per_hour": manifest["questions_per_hour"],
            "wall_s": round(time.perf_counter() - started, 1),
        },
    }
    write_json_atomic(summary_file, summary)
    log.info("[data] done in %.0f s: %s examples", summary["data_prep"]["wall_s"], summary["examples"])
    return summary
