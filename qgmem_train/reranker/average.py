"""``python -m qgmem_train average-rerankers A B [...] --out OUT``: one CrossEncoder whose weights are the mean of several.

Rerankers trained from the same starting weights on the same split, with other seeds (the four-layer students of
``make reranker-small`` start from their teacher's first layers), average into a model of the same size and speed
that ranks at least as well as one of them (a uniform "model soup", Wortsman et al., 2022;
experiments/reranker/results/reranker_soup.md). The folders must agree on architecture, document layout and training split; the
result is published atomically with a ``training.json`` naming what it averaged.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from qgmem_train.errors import InputError
from qgmem_train.fileio import parse_json, publish_output_folder, read_text, refuse_foreign_folder, staging_beside

WEIGHTS = "model.safetensors"
SAME_TRAINING = ("train_conversations", "val_conversations", "document_layout", "input_sha256", "store")
"""Fields of ``training.json`` the averaged models must share: a mean of models trained on other data is not a model of any."""
CONFIG_NAME_KEY = "_name_or_path"


def read_record(folder: Path, name: str) -> dict[str, Any]:
    """A JSON file of a trained model folder, as an object; one line when it is missing or not one."""
    path = folder / name
    value = parse_json(read_text(path), str(path))
    if not isinstance(value, dict):
        raise InputError(str(path), "not a JSON object")
    return value


def check_same_training(folders: list[Path]) -> list[dict[str, Any]]:
    """The ``training.json`` of each folder, refusing folders of another architecture or training split than the first."""
    from qgmem_train.retrieval.cross_encoder import TRAINING_RECORD

    configs = [{k: v for k, v in read_record(f, "config.json").items() if k != CONFIG_NAME_KEY} for f in folders]
    records = [read_record(f, TRAINING_RECORD) for f in folders]
    for folder, config, record in zip(folders[1:], configs[1:], records[1:]):
        differs = sorted(k for k in configs[0].keys() | config.keys() if configs[0].get(k) != config.get(k))
        if differs:
            raise InputError(str(folder / "config.json"), f"{', '.join(differs)} differ from {folders[0]}'s: not the same architecture")
        differs = [k for k in SAME_TRAINING if records[0].get(k) != record.get(k)]
        if differs:
            raise InputError(str(folder / TRAINING_RECORD), f"{', '.join(differs)} differ from {folders[0]}'s: trained on other data")
    return records


def mean_weights(files: list[Path]) -> dict[str, Any]:
    """The element-wise mean of the floating-point tensors of ``files`` (others, e.g. position ids, from the first)."""
    import torch
    from safetensors.torch import load_file

    states = [load_file(f) for f in files]
    for file, state in zip(files[1:], states[1:]):
        if state.keys() != states[0].keys() or any(state[k].shape != states[0][k].shape for k in state):
            raise InputError(str(file), f"its tensors differ in name or shape from {files[0]}'s")
    return {k: torch.stack([s[k] for s in states]).mean(0) if t.is_floating_point() else t for k, t in states[0].items()}


def average(folders: list[Path], out: Path) -> dict[str, Any]:
    """Write the mean of ``folders`` to ``out`` (tokenizer and config of the first) and return its training record."""
    from safetensors.torch import save_file

    from qgmem_train.retrieval.cross_encoder import TRAINING_RECORD

    records = check_same_training(folders)
    state = mean_weights([f / WEIGHTS for f in folders])
    record = {
        **records[0],
        "seed": [r.get("seed") for r in records],
        "seconds": round(sum(float(r.get("seconds") or 0.0) for r in records), 1),
        "averaged_from": [{"folder": str(f), "seed": r.get("seed"), "validation_after": r.get("validation_after")} for f, r in zip(folders, records)],
    }
    with staging_beside(out) as staging:
        shutil.copytree(folders[0], staging, dirs_exist_ok=True)
        save_file(state, staging / WEIGHTS, metadata={"format": "pt"})
        (staging / TRAINING_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        publish_output_folder(staging, out, "average-rerankers")
    return record


def main(argv: list[str]) -> int:
    """Average the named folders into ``--out`` and print one line."""
    parser = argparse.ArgumentParser(prog="python -m qgmem_train average-rerankers", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="trained CrossEncoder folders (fit-reranker --out), two or more")
    parser.add_argument("--out", type=Path, required=True, help="folder for the averaged CrossEncoder: new, empty or an earlier output (replaced atomically)")
    args = parser.parse_args(argv)
    if len(args.folders) < 2:
        raise InputError("folders", "name two or more trained folders to average")
    refuse_foreign_folder(args.out)
    for folder in args.folders:
        if not (folder / WEIGHTS).is_file():
            raise InputError(str(folder), f"no {WEIGHTS}: not a trained CrossEncoder folder (fit-reranker --out)")
    average(args.folders, args.out)
    print(f"average-rerankers: {len(args.folders)} models averaged into {args.out}")
    return 0
