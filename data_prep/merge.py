"""Combine finished shards into one trajectory dataset, split by case, with a manifest.

Merge refuses when a shard is missing, unfinished, or was made with another config, and when a case
record is missing, empty or partial (rerunning the shard computes such a case again). Targets follow
``data_prep.target``: the paper keeps judge-correct answers as they were generated; ``gold`` targets the
dataset's answer with a reasoning path over the evidence units' labels, for every question whose gold
answer is not empty (such runs answer and judge nothing; their questions count as ``not_judged``).

The manifest records throughput: ``cases_per_hour`` and ``questions_per_hour`` over the summed per-case
wall time (``seconds.total`` of every case, all stages, model loading excluded), i.e. the rate of one
process; shards run side by side multiply it.
"""

from __future__ import annotations

import platform
from collections import Counter
from pathlib import Path
from typing import Any

from data_prep.config import DataPrepConfig
from data_prep.pipeline import stages_of
from data_prep.run import case_file, read_case_record, read_shard_state, shard_dir
from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.fileio import write_json_atomic
from qgmem_train.graph.local_graph import LocalGraph
from qgmem_train.trajectory import TrajectoryExample, split_of_case, write_trajectory_dataset

SOURCE_DATASET = "convomem"


def _shard_states(out: Path, fingerprint: str) -> list[tuple[Path, dict]]:
    """Every shard of the run, checked complete and made with this config."""
    found = sorted((out / "shards").glob("*-of-*/shard.json"))
    if not found:
        raise InputError(str(out / "shards"), "no shards here; run `python -m data_prep --config FILE [--shard I/N]` first")
    states = [(p.parent, read_shard_state(p)) for p in found]
    counts = {s["num_shards"] for _, s in states}
    if len(counts) != 1:
        raise InputError(str(out / "shards"), f"shards of different splits {sorted(counts)}; keep one shard count per output folder")
    (num_shards,) = counts
    checked = []
    for shard in range(num_shards):
        folder = shard_dir(out, shard, num_shards)
        state_file = folder / "shard.json"
        if not state_file.exists():
            raise InputError(str(state_file), f"shard {shard}/{num_shards} is missing")
        state = read_shard_state(state_file)
        if state["fingerprint"] != fingerprint:
            raise InputError(str(state_file), "was made with another config than this merge")
        if not state["done"]:
            raise InputError(str(state_file), f"shard {shard}/{num_shards} has not finished; rerun it")
        checked.append((folder, state))
    return checked


def _example(record: dict, question: dict, target: str) -> TrajectoryExample | None:
    """The trajectory of one question, or None when the target mode drops it."""
    if target == "judge_correct":
        if not question["correct"]:
            return None
        answer, reasoning = question["answer"], question["reasoning_path"]
    else:
        answer, reasoning = question["gold_answer"], question["gold_reasoning_path"]
        if not str(answer).strip():
            return None
    return TrajectoryExample(
        case_id=record["case_id"],
        question_id=question["question_id"],
        source_dataset=f"{SOURCE_DATASET}/{record['category']}",
        namespace=record["namespace"],
        question=question["question"],
        question_time=question["question_time"],
        context=question["context"],
        answer=str(answer),
        reasoning_path=str(reasoning),
        graph=LocalGraph(**question["graph"]),
        unit_ids=[u["id"] for u in question["units"]],
    )


def merge(cfg: DataPrepConfig, pipeline: PipelineConfig) -> dict[str, Any]:
    """Write ``out/dataset`` (DatasetDict) and ``out/manifest.json``; return the manifest."""
    out = Path(cfg.out)
    fingerprint = cfg.fingerprint(pipeline)
    states = _shard_states(out, fingerprint)
    records = []
    for folder, state in states:
        for case_id in state["cases"]:
            path = case_file(folder, case_id)
            record = read_case_record(path, case_id)
            if record is None:
                problem = "is empty or partial" if path.exists() else "is missing"
                raise InputError(str(path), f"the record of case {case_id} {problem}; rerun the shard to compute it again")
            if any("edge_unit_labels" not in question["graph"] for question in record["questions"]):
                raise InputError(str(path), f"case {case_id} was run before graph edges carried their units' labels (trajectory "
                                 "schema 2); run data prep again with a new data_prep.out")  # fmt: skip
            records.append(record)
    records.sort(key=lambda r: r["case_id"])

    splits: dict[str, list[TrajectoryExample]] = {"train": [], "validation": [], "test": []}
    per_category: dict[str, Counter] = {}
    parse = Counter()
    seconds = Counter()
    for record in records:
        split = split_of_case(record["case_id"], cfg.validation_fraction, cfg.test_fraction)
        counts = per_category.setdefault(record["category"], Counter())
        counts["cases"] += 1
        parse.update(record["parse"])
        seconds.update(record["seconds"])
        for question in record["questions"]:
            counts["questions"] += 1
            if question["correct"] is None:
                counts["not_judged"] += 1
            else:
                counts["judge_correct"] += question["correct"]
                counts["answer_dropped"] += question["answer"] is None
            example = _example(record, question, cfg.target)
            if example is None:
                counts["dropped"] += 1
                continue
            counts[f"kept_{split}"] += 1
            splits[split].append(example)
    dataset_dir = write_trajectory_dataset(splits, out / "dataset", graph=pipeline.to_dict()["graph"])
    n_cases = max(1, len(records))
    n_questions = sum(len(r["questions"]) for r in records)
    hours = seconds["total"] / 3600
    manifest = {
        "fingerprint": fingerprint,
        "target": cfg.target,
        "source": cfg.source,
        "revision": cfg.revision,
        "seed": cfg.seed,
        "categories": cfg.categories,
        "shards": len(states),
        "sampling": states[0][1]["sampling"],
        "cases": [r["case_id"] for r in records],
        "counts": {"per_category": {c: dict(v) for c, v in sorted(per_category.items())},
                   "per_split": {name: len(rows) for name, rows in splits.items()}},
        "json_outputs": dict(parse),
        "stages": stages_of(cfg),
        "seconds_per_case": {k: round(v / n_cases, 3) for k, v in seconds.items()},
        "cases_per_hour": round(len(records) / hours, 2) if hours > 0 else None,
        "questions_per_hour": round(n_questions / hours, 2) if hours > 0 else None,
        "models": {"llm": pipeline.models.llm, "llm_revision": pipeline.models.llm_revision,
                   "embedder": pipeline.models.embedder, "reranker": pipeline.models.reranker,
                   "reranker_model": pipeline.models.reranker_model},
        "config": {"data_prep": {k: v for k, v in vars(cfg).items()}, "pipeline": pipeline.to_dict()},
        "dataset": str(dataset_dir),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    write_json_atomic(out / "manifest.json", manifest)
    return manifest
