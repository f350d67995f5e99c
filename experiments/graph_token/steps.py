"""What each step of the graph-token study's next round shares: the data default, the one-line errors, the report files."""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.graph_token.data import data_folder, prepare_data
from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.fileio import atomic_output, write_json_atomic

log = logging.getLogger("experiments.graph_token.steps")


def step_folder(args: argparse.Namespace, name: str) -> tuple[Path, dict[str, Any], Path]:
    """The step's output folder ``<out>/<name>`` (made), the study's data summary (data prep run when missing) and the
    prepared trajectories' folder: every step reads the same questions as the study."""
    out = args.out.resolve()
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder, prepare_data(args, out), out / "data" / "trajectories"


def question_sample(examples: list[Any], count: int | None, seed: int) -> list[Any]:
    """A seeded sample of ``count`` examples (all of them when ``None``), in their original order: each step's
    questions are the same on every run."""
    if count is None or count >= len(examples):
        return list(examples)
    order = list(range(len(examples)))
    random.Random(f"step-questions:{seed}").shuffle(order)
    return [examples[i] for i in sorted(order[:count])]


def saved_or_computed(path: Path, label: str, compute: Callable[[], dict[str, Any]], settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record saved at ``path`` by an earlier run, or ``compute()`` with its wall time, saved there as it ends (so a
    killed step resumes at the part it was in). ``settings`` are kept in the record; a part saved with other settings is
    refused, never mixed into this run's report (records saved before settings were kept are reused as they are)."""
    settings = settings or {}
    if path.exists():
        record = json.loads(path.read_text())
        saved = record.get("settings", settings)
        if saved != settings:
            raise InputError(str(path), f"measured with {settings_text(saved)}; this run asks {settings_text(settings)}: remove it or use another --out")
        log.info("[%s] reusing %s", label, path)
        return record
    began = time.perf_counter()
    record = compute()
    record["wall_s"] = round(time.perf_counter() - began, 1)
    record["settings"] = settings
    write_json_atomic(path, record)
    return record


def settings_text(settings: dict[str, Any]) -> str:
    """``name=value`` pairs in name order, for a refusal."""
    return ", ".join(f"{name}={settings[name]}" for name in sorted(settings))


def run_step(
    args: argparse.Namespace, folder: str, run: Callable[[argparse.Namespace], dict[str, Any]], markdown: Callable[[dict[str, Any]], str],
    positive: tuple[str, ...] = (),
) -> int:
    """Run one step over ``args.out`` and write ``<out>/<folder>/results.json`` and ``results.md``; print its verdict.

    ``positive`` names settings that must be at least 1 when given. Bad input is one line on stderr and exit code 2.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        args.data = data_folder(args.data)
        for name in positive:
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise InputError(f"--{name.replace('_', '-')}", "must be at least 1")
        import torch

        torch.set_num_threads(args.threads)
        result = run(args)
    except (InputError, ModelUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out.resolve() / folder
    write_json_atomic(out / "results.json", result)
    with atomic_output(out / "results.md") as handle:
        handle.write(markdown(result))
    print(result["verdict"])
    return 0
