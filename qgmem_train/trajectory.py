"""The trajectory format, the contract between data prep and training: one example's schema and the split rule.

A trajectory records what the frozen pipeline saw for one question: the serialized working memory,
the local graph as labels (features are recomputed by the data module with the retrieval embedder),
the target answer with its reasoning path, and where the example came from. A folder of them is a
``datasets`` DatasetDict saved with ``save_to_disk``; :data:`TRAJECTORY_FEATURES` is its exact schema.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import datasets

from qgmem_train.errors import InputError
from qgmem_train.fileio import publish_output_folder, read_text, staging_beside
from qgmem_train.graph.local_graph import LocalGraph

SCHEMA_VERSION = 2
"""2: each edge records the MEMORY_CONTEXT label of its unit (``edge_unit_labels``); version 1 numbered the graph's facts
apart from the memory context's, so a label could name two units."""

TRAJECTORY_FEATURES = datasets.Features(
    {
        "schema_version": datasets.Value("int32"),
        "case_id": datasets.Value("string"),
        "question_id": datasets.Value("string"),
        "source_dataset": datasets.Value("string"),
        "namespace": datasets.Value("string"),
        "question": datasets.Value("string"),
        "question_time": datasets.Value("string"),
        "context": datasets.Value("string"),
        "unit_ids": datasets.Sequence(datasets.Value("string")),
        "node_labels": datasets.Sequence(datasets.Value("string")),
        "edge_src": datasets.Sequence(datasets.Value("int32")),
        "edge_dst": datasets.Sequence(datasets.Value("int32")),
        "edge_labels": datasets.Sequence(datasets.Value("string")),
        "edge_unit_labels": datasets.Sequence(datasets.Value("string")),
        "answer": datasets.Value("string"),
        "reasoning_path": datasets.Value("string"),
    }
)
"""Column types of a trajectory dataset; ``question_time`` is ``""`` when unknown."""


@dataclass
class TrajectoryExample:
    """One question with its activated working memory, local graph and target."""

    case_id: str
    """Case (conversation or ConvoMem case) the question belongs to; splits never cut a case."""
    question_id: str
    source_dataset: str
    """e.g. ``convomem/user_evidence`` or ``locomo``."""
    namespace: str
    """Memory-store namespace the working memory was activated from."""
    question: str
    question_time: str
    context: str
    """The serialized working memory (MEMORY_CONTEXT) given to the final-answer prompt."""
    answer: str
    reasoning_path: str
    graph: LocalGraph = field(default_factory=LocalGraph)
    unit_ids: list[str] = field(default_factory=list)
    """Ids of the activated memory units, in working-memory order."""

    def to_record(self) -> dict[str, Any]:
        """A flat row matching :data:`TRAJECTORY_FEATURES`."""
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "graph"}
        row.update(asdict(self.graph))
        row["schema_version"] = SCHEMA_VERSION
        return row

    @classmethod
    def from_record(cls, row: Mapping[str, Any], where: str = "trajectory") -> "TrajectoryExample":
        """Parse and check one row; any missing or inconsistent field is an :class:`InputError`."""
        missing = [name for name in TRAJECTORY_FEATURES if name not in row]
        if missing:
            raise InputError(where, f"missing field(s) {', '.join(missing)}")
        if row["schema_version"] != SCHEMA_VERSION:
            raise InputError(f"{where}.schema_version", f"is {row['schema_version']}, this code reads {SCHEMA_VERSION}")
        graph = LocalGraph(
            node_labels=list(row["node_labels"]),
            edge_src=[int(i) for i in row["edge_src"]],
            edge_dst=[int(i) for i in row["edge_dst"]],
            edge_labels=list(row["edge_labels"]),
            edge_unit_labels=list(row["edge_unit_labels"]),
        )
        _check_graph(graph, where)
        for name in ("question", "answer"):
            if not str(row[name]).strip():
                raise InputError(f"{where}.{name}", "is empty")
        scalar = {f.name: row[f.name] for f in fields(cls) if f.name not in {"graph", "unit_ids"}}
        return cls(**scalar, graph=graph, unit_ids=list(row["unit_ids"]))

    def target_json(self) -> str:
        """The training target: ``{"reasoning_path": ..., "answer": ...}`` in the prompt's key order."""
        return json.dumps({"reasoning_path": self.reasoning_path, "answer": self.answer}, ensure_ascii=False)


def _check_graph(graph: LocalGraph, where: str) -> None:
    edges = {len(graph.edge_src), len(graph.edge_dst), len(graph.edge_labels), len(graph.edge_unit_labels)}
    if len(edges) != 1:
        raise InputError(f"{where}.edge_src", "edge_src, edge_dst, edge_labels and edge_unit_labels differ in length")
    if any(not 0 <= i < graph.num_nodes for i in graph.edge_src + graph.edge_dst):
        raise InputError(f"{where}.edge_src", f"edge endpoint outside 0..{graph.num_nodes - 1}")


def split_of_case(case_id: str, validation_fraction: float, test_fraction: float) -> str:
    """Deterministic split of a case (data prep and the data module split alike) from the SHA-1 of its id: test, then validation, else train."""
    bucket = int(hashlib.sha1(case_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    if bucket < test_fraction:
        return "test"
    return "validation" if bucket < test_fraction + validation_fraction else "train"


GRAPH_SETTINGS_FILE = "graph_settings.json"
"""The ``graph.*`` settings a trajectory folder's graphs were built with, beside its splits (see :func:`trajectory_graph_settings`)."""


def write_trajectory_dataset(
    splits: Mapping[str, list[TrajectoryExample]], path: str | os.PathLike, graph: Mapping[str, Any] | None = None
) -> Path:
    """Save the non-empty splits of ``{split: examples}`` as a DatasetDict folder at ``path``, with ``graph`` (the
    ``graph.*`` settings its local graphs were built with) recorded in it when given.

    The folder is written beside ``path`` and then swapped in (:func:`publish_output_folder`): a reader, or a
    crash, finds the previous dataset or the new one, never none; a folder there that data prep did not write is refused.
    """
    path = Path(path)
    with staging_beside(path) as staging:
        # Empty splits are left out: datasets can neither build nor reload a split without rows.
        table = {name: [ex.to_record() for ex in examples] for name, examples in splits.items() if examples}
        dataset = datasets.DatasetDict(
            {name: datasets.Dataset.from_list(rows, features=TRAJECTORY_FEATURES) for name, rows in table.items()}
        )
        dataset.save_to_disk(str(staging))
        if graph is not None:
            (staging / GRAPH_SETTINGS_FILE).write_text(json.dumps(dict(graph), sort_keys=True))
        publish_output_folder(staging, path, "data prep")
    return path


def trajectory_graph_settings(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``graph.*`` settings recorded in a trajectory folder; ``None`` for a folder written without them."""
    file = Path(path) / GRAPH_SETTINGS_FILE
    if not file.exists():
        return None
    try:
        settings = json.loads(read_text(file, kind="graph settings file"))
    except ValueError as exc:
        raise InputError(str(file), f"not valid JSON: {exc}") from None
    if not isinstance(settings, dict):
        raise InputError(str(file), "expected an object of graph.* settings")
    return settings


def read_trajectory_dataset(path: str | os.PathLike) -> dict[str, list[TrajectoryExample]]:
    """Load a saved trajectory folder as ``{split: examples}``; one Dataset (no splits) becomes ``{"all": ...}``."""
    path = Path(path)
    if not path.exists():
        raise InputError(str(path), "trajectory dataset folder not found")
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise InputError(str(path), f"not a saved datasets folder: {str(exc).splitlines()[0]}") from None
    parts = loaded if isinstance(loaded, datasets.DatasetDict) else {"all": loaded}
    return {
        name: [TrajectoryExample.from_record(row, f"{path}[{name}][{i}]") for i, row in enumerate(part)]
        for name, part in parts.items()
    }
