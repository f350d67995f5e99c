"""Write tests/data/trajectories/: a few pipeline trajectories over the committed LoCoMo sample (tests only).

Memory is built in turns mode (no LLM) with the bundled MiniLM, each question's working memory is
activated by the real activation (rule-based intent, RRF order: no reranker, to stay fast on CPU),
serialized as MEMORY_CONTEXT, and turned into a local graph; the target is the gold answer with a
reasoning path citing the labels of units whose source turns are gold evidence. A model trained on
this fixture must never be evaluated on LoCoMo.

    python tests/data/make_trajectory_fixture.py [--questions 12] [--k 6] [--held-out 2] [--out FOLDER]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from qgmem_train.answer.memory_context import serialize_working_memory
from qgmem_train.config import PipelineConfig
from qgmem_train.graph.local_graph import local_graph_from_units
from qgmem_train.llm.embedder import Embedder
from qgmem_train.memory.construct import build_conversation
from qgmem_train.memory.loaders import load_locomo
from qgmem_train.memory.store import MemoryStore
from qgmem_train.retrieval.activation import activate
from qgmem_train.trajectory import TrajectoryExample, write_trajectory_dataset

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "locomo_sample.json"
TARGET = ROOT / "tests" / "data" / "trajectories"
ANSWERED_CATEGORIES = {1, 2, 4}
"""LoCoMo multi-hop, temporal and single-hop questions (they have a gold ``answer``)."""


def reasoning_path(labels: dict[str, str], evidence_units: set[str]) -> str:
    """A short reasoning path citing the labels of the units built from gold evidence turns."""
    cited = [label for label, unit_id in labels.items() if unit_id in evidence_units]
    if not cited:
        return "No memory unit states this directly; the answer follows from the memory context."
    return f"The answer is stated in {', '.join(cited)}."


def main(argv: list[str] | None = None) -> int:
    """Build the fixture from the committed sample and write it atomically."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=12, help="questions to keep (first answered ones)")
    parser.add_argument("--k", type=int, default=6, help="working-memory budget (the paper uses 10)")
    parser.add_argument("--held-out", type=int, default=2, help="questions in each of validation and test (the last ones)")
    parser.add_argument("--out", type=Path, default=TARGET, help="folder to write (default: the committed fixture)")
    args = parser.parse_args(argv)

    cfg = PipelineConfig()
    cfg.construction.units = "turns"
    cfg.retrieval.k = args.k
    embedder = Embedder(cfg.models.embedder)
    raw = json.loads(SAMPLE.read_text())[0]
    conversation = load_locomo(SAMPLE)[0]
    question_time = conversation.sessions[-1].time
    examples = []
    with tempfile.TemporaryDirectory() as tmp, MemoryStore.open(Path(tmp) / "store.sqlite", create=True) as store:
        build_conversation(store, conversation, cfg, embedder)
        memory = store.load_namespace(conversation.id)
        qas = [qa for qa in raw["qa"] if qa.get("category") in ANSWERED_CATEGORIES and "answer" in qa][: args.questions]
        for number, qa in enumerate(qas):
            wm = activate(qa["question"], question_time, memory, cfg=cfg.retrieval, llm=None, embedder=embedder, reranker=None)
            serialized = serialize_working_memory(wm.units, memory)
            evidence = {u.id for u in wm.units if set(u.source_turn_ids) & set(qa.get("evidence", []))}
            examples.append(
                TrajectoryExample(
                    case_id=conversation.id,
                    question_id=f"{conversation.id}/q{number}",
                    source_dataset="locomo-sample",
                    namespace=conversation.id,
                    question=qa["question"],
                    question_time=question_time or "",
                    context=serialized.text,
                    answer=str(qa["answer"]),
                    reasoning_path=reasoning_path(serialized.labels, evidence),
                    graph=local_graph_from_units(wm.units, max_edges=args.k, labels=serialized.label_of),
                    unit_ids=[u.id for u in wm.units],
                )
            )
    n, h = len(examples), args.held_out
    splits = {"train": examples[: n - 2 * h], "validation": examples[n - 2 * h : n - h], "test": examples[n - h :]}
    write_trajectory_dataset(splits, args.out)
    print(f"wrote {args.out}: " + ", ".join(f"{name} {len(part)}" for name, part in splits.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
