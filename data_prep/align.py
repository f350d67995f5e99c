"""Alignment data: local graphs of training conversations whose target is the graph's own facts, no LLM answering or judge.

Each drawn case outside the test split has its memory store built (the data-prep construction), and local graphs
activated for its benchmark questions and for pseudo-queries (a seeded sample of its units' own fact texts). Every
distinct graph with an edge becomes one trajectory: the alignment instruction as the question, no memory context, and
the graph's facts as text (``[F#] subject | predicate | object``, each labelled as MEMORY_CONTEXT labels its unit) as
the answer, so the graph tokens are the only source of the target. Cases keep the task data's split: the split rule of data prep, or, with ``split_from``, the split
each case has in a trajectory folder (cases not found there are left out); test cases are never built.

Layout under ``out/``: ``align.json`` (settings fingerprint), ``store/`` (the memory store, resumable),
``cases/<namespace>.json`` (one finished case, written atomically) and ``dataset/`` (the trajectory folder, swapped in
whole). A rerun skips finished cases and recomputes a case file that is empty or cut short.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from data_prep.config import DataPrepConfig
from data_prep.convomem import ConvoMemCase, case_namespace, load_case
from data_prep.merge import SOURCE_DATASET
from data_prep.run import draw
from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.fileio import read_text, write_json_atomic
from qgmem_train.graph.facts import graph_facts_text
from qgmem_train.llm.prompts import ALIGNMENT_INSTRUCTION
from qgmem_train.trajectory import TrajectoryExample, read_trajectory_dataset, split_of_case, write_trajectory_dataset

if TYPE_CHECKING:  # the pipeline brings in PyG and the model libraries, which bad input should not wait for
    from qgmem_train.memory.store import MemoryStore
    from qgmem_train.pipeline import PipelineModels

log = logging.getLogger(__name__)

ALIGN_SPLITS = ("train", "validation")
"""Splits alignment data holds; test cases never contribute."""


def case_splits(cfg: DataPrepConfig, case_ids: list[str], split_from: str | None) -> dict[str, str]:
    """Split of each case: data prep's rule (:func:`split_of_case`), or the split holding it in the ``split_from`` folder.

    With ``split_from`` a case found in its test split anywhere counts as test, and a case absent from it is left out.
    """
    if split_from is None:
        return {c: split_of_case(c, cfg.validation_fraction, cfg.test_fraction) for c in case_ids}
    found: dict[str, str] = {}
    for name, examples in read_trajectory_dataset(split_from).items():
        if name not in (*ALIGN_SPLITS, "test"):
            raise InputError(f"{split_from}", f"has a split {name!r}; --split-from needs a folder split into train, validation and test")
        for ex in examples:
            if found.get(ex.case_id) != "test":
                found[ex.case_id] = name
    return {c: found[c] for c in case_ids if c in found}


def settings_fingerprint(cfg: DataPrepConfig, pipeline: PipelineConfig, pseudo_queries: int, splits: dict[str, str]) -> str:
    """Hash of everything that changes the alignment data: the data-prep settings, the pseudo-query count, the split."""
    blob = json.dumps({"data_prep": cfg.fingerprint(pipeline), "pseudo_queries": pseudo_queries, "splits": splits}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def case_examples(case: ConvoMemCase, store: MemoryStore, models: PipelineModels, cfg: DataPrepConfig, pipeline: PipelineConfig, pseudo_queries: int) -> list[TrajectoryExample]:
    """Build the case's memory, activate a local graph per query, and keep each distinct graph with an edge as an example."""
    from qgmem_train.answer.evidence import answer_evidence
    from qgmem_train.graph.local_graph import graph_options
    from qgmem_train.memory.construct import build_conversation
    from qgmem_train.pipeline import NamespaceIndex, activate_question

    namespace = case_namespace(case.ref.case_id)
    build_conversation(store, case.conversation, pipeline, models.embedder, namespace=namespace, llm=models.construction_llm)
    memory, index = NamespaceIndex(store, namespace, models).current()
    texts = [unit.fact_text for unit in memory.units if unit.fact_text.strip()]
    sampled = random.Random(f"align:{case.ref.case_id}").sample(texts, min(pseudo_queries, len(texts)))
    queries = [q.question for q in case.questions] + sampled
    examples: dict[str, TrajectoryExample] = {}
    for query in queries:
        wm = activate_question(query, None, memory, index, models)
        graph = answer_evidence(wm.units, memory, None, max_edges=pipeline.retrieval.k, **graph_options(pipeline.graph)).graph
        facts = graph_facts_text(graph)
        if not graph.num_edges or facts in examples:
            continue
        examples[facts] = TrajectoryExample(
            case_id=case.ref.case_id, question_id=f"{case.ref.case_id}/align{len(examples)}", source_dataset=f"{SOURCE_DATASET}/{case.ref.category}",
            namespace=namespace, question=ALIGNMENT_INSTRUCTION, question_time="", context="", answer=facts, reasoning_path="",
            graph=graph, unit_ids=[u.id for u in wm.units],
        )  # fmt: skip
    return list(examples.values())


def read_case(path: Path, case_id: str) -> list[TrajectoryExample] | None:
    """The finished examples of ``case_id`` at ``path``; None when the file is missing, empty, partial or another case's."""
    try:
        record = json.loads(path.read_bytes())
        if record["case_id"] != case_id:
            return None
        return [TrajectoryExample.from_record(row, str(path)) for row in record["examples"]]
    except (OSError, ValueError, KeyError, TypeError, InputError):
        return None


def build_alignment_data(cfg: DataPrepConfig, pipeline: PipelineConfig, out: str | Path, pseudo_queries: int, split_from: str | None = None) -> dict[str, Any]:
    """Write ``out/dataset`` (train and validation splits of alignment trajectories); return its summary."""
    out = Path(out)
    root, cases, _ = draw(cfg, pipeline)
    splits = case_splits(cfg, [c.case_id for c in cases], split_from)
    fingerprint = settings_fingerprint(cfg, pipeline, pseudo_queries, splits)
    state_file = out / "align.json"
    if state_file.exists():
        try:
            made_with = json.loads(read_text(state_file)).get("fingerprint")
        except (ValueError, AttributeError):
            made_with = None
        if made_with != fingerprint:
            raise InputError(str(state_file), "was made with other settings (config, --pseudo-queries or split); use another --out or delete it")
    write_json_atomic(state_file, {"fingerprint": fingerprint, "pseudo_queries": pseudo_queries, "split_from": split_from})
    mine = [c for c in cases if splits.get(c.case_id) in ALIGN_SPLITS]
    files = {c.case_id: out / "cases" / f"{case_namespace(c.case_id)}.json" for c in mine}
    done = {c.case_id: read_case(files[c.case_id], c.case_id) for c in mine}
    pending = [c for c in mine if done[c.case_id] is None]
    log.info("alignment data: %d of %d drawn cases in train/validation, %d already done", len(mine), len(cases), len(mine) - len(pending))
    if pending:
        # Imported here: the pipeline brings in PyG and the model libraries, which bad input should not wait for.
        from qgmem_train.memory.store import MemoryStore
        from qgmem_train.pipeline import PipelineModels

        models = PipelineModels(pipeline, intent=cfg.intent)
        with MemoryStore.open(out / "store", create=True) as store:
            bar = tqdm(pending, desc="alignment data", unit="case")
            for ref in bar:
                case = load_case(root, ref, max_questions=cfg.max_questions_per_case, max_sessions=cfg.max_sessions_per_case)
                examples = case_examples(case, store, models, cfg, pipeline, pseudo_queries)
                write_json_atomic(files[ref.case_id], {"case_id": ref.case_id, "examples": [ex.to_record() for ex in examples]})
                done[ref.case_id] = examples
                bar.set_postfix({"graphs": sum(len(v or []) for v in done.values())})
    by_split: dict[str, list[TrajectoryExample]] = {name: [] for name in ALIGN_SPLITS}
    for ref in mine:
        by_split[splits[ref.case_id]] += done[ref.case_id] or []
    if not by_split["train"]:
        raise InputError(f"{cfg.source}", "no training graph with an edge: draw more cases (data_prep.total_cases) or lower test_fraction")
    dataset = write_trajectory_dataset(by_split, out / "dataset", graph=pipeline.to_dict()["graph"])
    cases_per_split = Counter(splits[c.case_id] for c in mine)
    return {"dataset": str(dataset), "graphs": {k: len(v) for k, v in by_split.items()}, "cases": dict(cases_per_split),
            "left_out_cases": len(cases) - len(mine)}
