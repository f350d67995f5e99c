"""One shard of a data-prep run: draw the cases, skip those already done, persist each at once.

Layout under ``out/shards/<I>-of-<N>/``: ``shard.json`` (config fingerprint, the shard's cases, done
flag), ``cases/<namespace>.json`` (one record per finished case, written atomically) and ``store/``
(the shard's memory store, one namespace per case, itself resumable). A killed run resumes where it
stopped without redoing or duplicating a case; a case file that is empty or cut short (a copy, a full
disk) does not count as done and is computed again.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from tqdm.auto import tqdm

from data_prep.config import DataPrepConfig
from data_prep.convomem import case_namespace, discover_cases, load_case, resolve_source
from data_prep.sampling import CaseRef, sample_cases, shard_of
from qgmem_train.config import PipelineConfig
from qgmem_train.errors import InputError
from qgmem_train.fileio import read_text, write_json_atomic
from qgmem_train.memory.store import MemoryStore

log = logging.getLogger(__name__)


def shard_dir(out: Path, shard: int, num_shards: int) -> Path:
    """Folder of one shard's outputs."""
    return out / "shards" / f"{shard}-of-{num_shards}"


def case_file(folder: Path, case_id: str) -> Path:
    """Where a shard folder keeps the record of one finished case."""
    return folder / "cases" / f"{case_namespace(case_id)}.json"


CASE_FIELDS = frozenset({"case_id", "category", "namespace", "stages", "build", "parse", "seconds", "questions"})
"""Top-level fields of a finished case record."""
SHARD_FIELDS = {"shard": int, "num_shards": int, "fingerprint": str, "sampling": dict, "cases": list, "done": bool}
"""Fields of ``shard.json`` and their types."""


def read_case_record(path: Path, case_id: str) -> dict | None:
    """The finished record of ``case_id`` at ``path``; None when the file is missing, empty, partial or another case's."""
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("case_id") != case_id or not CASE_FIELDS <= record.keys():
        return None
    return record if isinstance(record["questions"], list) else None


def read_shard_state(path: Path) -> dict:
    """A shard's ``shard.json``; an unreadable, malformed or incomplete one is an :class:`InputError`."""
    fix = "delete this shard's folder to run the shard again"
    try:
        state = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(str(path), f"not valid JSON: {exc}; {fix}") from None
    if not isinstance(state, dict):
        raise InputError(str(path), f"expected a JSON object; {fix}")
    for name, kind in SHARD_FIELDS.items():
        if not isinstance(state.get(name), kind) or (kind is int and isinstance(state[name], bool)):
            raise InputError(f"{path}: {name}", f"missing or not {kind.__name__}; {fix}")
    return state


def draw(cfg: DataPrepConfig, pipeline: PipelineConfig) -> tuple[Path, list[CaseRef], dict]:
    """Resolve the source and draw the run's cases (the same list in every shard)."""
    root = resolve_source(cfg.source, cfg.revision, list(cfg.categories))
    available = discover_cases(root, list(cfg.categories))
    missing = [c for c in cfg.categories if c not in available]
    if missing:
        raise InputError(f"{cfg.source}", f"no cases for categories {missing} (found: {sorted(available) or 'none'})")
    cases, counts = sample_cases(available, cfg.categories, cfg.total_cases, cfg.seed)
    return root, cases, counts


def run_shard(cfg: DataPrepConfig, pipeline: PipelineConfig, shard: int = 0, num_shards: int = 1) -> Path:
    """Process this shard's cases, resuming from what is on disk; returns the shard folder."""
    out = Path(cfg.out)
    folder = shard_dir(out, shard, num_shards)
    fingerprint = cfg.fingerprint(pipeline)
    state_file = folder / "shard.json"
    if state_file.exists():
        state = read_shard_state(state_file)
        if state["fingerprint"] != fingerprint:
            raise InputError(str(state_file), "was made with another config; use a new data_prep.out or delete the shard")
    root, cases, counts = draw(cfg, pipeline)
    mine = shard_of(cases, shard, num_shards)
    state = {"shard": shard, "num_shards": num_shards, "fingerprint": fingerprint, "source": str(root),
             "sampling": counts, "cases": [c.case_id for c in mine], "done": False}
    write_json_atomic(state_file, state)

    pending = [c for c in mine if read_case_record(case_file(folder, c.case_id), c.case_id) is None]
    for ref in pending:
        if case_file(folder, ref.case_id).exists():
            log.warning("%s: empty or partial case record; computing case %s again", case_file(folder, ref.case_id), ref.case_id)
    log.info("shard %d/%d: %d cases, %d already done", shard, num_shards, len(mine), len(mine) - len(pending))
    if pending:
        # Imported here: the pipeline brings in PyG and the model libraries, which bad input should not wait for.
        from data_prep.pipeline import run_case
        from qgmem_train.pipeline import PipelineModels

        models = PipelineModels(pipeline, intent=cfg.intent)
        with MemoryStore.open(folder / "store", create=True) as store:
            bar = tqdm(pending, desc=f"data prep shard {shard}/{num_shards}", unit="case")
            kept, label = 0, "judge_correct" if cfg.target == "judge_correct" else "questions"
            for ref in bar:
                started = time.perf_counter()
                case = load_case(root, ref, max_questions=cfg.max_questions_per_case, max_sessions=cfg.max_sessions_per_case)
                record = run_case(case, store, models, cfg, pipeline)
                record["seconds"]["total"] = round(time.perf_counter() - started, 3)
                write_json_atomic(case_file(folder, ref.case_id), record)
                kept += sum(bool(q["correct"]) if label == "judge_correct" else 1 for q in record["questions"])
                bar.set_postfix({label: kept})
    state["done"] = True
    write_json_atomic(state_file, state)
    return folder
