"""What each step of the graph-token study's next round shares: the data default, the one-line errors, the report files."""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qgmem_train.reports import portable
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


def saved_or_computed(
    path: Path, label: str, compute: Callable[[], dict[str, Any]], settings: dict[str, Any] | None = None, stale: Path | None = None,
) -> dict[str, Any]:
    """The record saved at ``path`` by an earlier run under the same ``settings``, else ``compute()`` with its wall time,
    saved there as it ends (so a killed step resumes at the part it was in). A record saved under other settings, or
    before settings were kept, is measured again, never mixed into this run's report; ``stale`` (the part's working
    folder, such as a fit's checkpoints) is removed first so nothing of the old settings is resumed."""
    settings = settings or {}
    if path.exists():
        record = json.loads(path.read_text())
        saved = record.get("settings")
        if saved == settings:
            log.info("[%s] reusing %s", label, path)
            return record
        log.info("[%s] %s was measured under %s; this run asks %s: measuring again", label, path.name,
                 settings_text(saved) if saved is not None else "unrecorded settings", settings_text(settings))  # fmt: skip
        path.unlink()
        if stale is not None and stale.exists():
            shutil.rmtree(stale)
    began = time.perf_counter()
    record = compute()
    record["wall_s"] = round(time.perf_counter() - began, 1)
    record["settings"] = settings
    write_json_atomic(path, record)
    return record


def settings_text(settings: dict[str, Any]) -> str:
    """``name=value`` pairs in name order, for the log."""
    return ", ".join(f"{name}={settings[name]}" for name in sorted(settings))


@functools.lru_cache(maxsize=None)
def llm_instrument(ref: str) -> str:
    """The frozen LLM as a report and a part's settings name it: its reference and, for a GGUF, the file and the
    quantization its weights were stored in (the loader dequantizes them to float32)."""
    from qgmem_train.llm.resolver import gguf_quantization, gguf_source

    source = gguf_source(ref)
    return ref if source is None else f"{ref} ({source.name}, GGUF {gguf_quantization(source)}, dequantized to float32)"


def data_identity(out: Path) -> str:
    """The study's prepared data as a part's settings name it: the commit its data prep ran at (as ``split.json``
    records it) and a digest of the data prep's pipeline settings (models, reranker, traces, retrieval, graph)."""
    import yaml

    summary = json.loads((out / "data" / "split.json").read_text())
    config = yaml.safe_load((out / "data" / "data_prep.yaml").read_text())
    digest = hashlib.sha256(json.dumps(config.get("pipeline", {}), sort_keys=True).encode()).hexdigest()[:12]
    return f"commit {summary.get('commit', 'unrecorded')[:12]}, pipeline {digest}"


def part_settings(args: argparse.Namespace, out: Path, **part: Any) -> dict[str, Any]:
    """What a study part's measurement depends on: the LLM with its quantization, the context cut, the prepared data,
    and the part's own settings (prompt, graph representation, retrieval arm, ...)."""
    return {"llm": llm_instrument(args.llm), "max_context_tokens": args.max_context_tokens, "data": data_identity(out), **part}


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
    result = portable(result, args.out.resolve())
    write_json_atomic(out / "results.json", result)
    with atomic_output(out / "results.md") as handle:
        handle.write(markdown(result))
    print(result["verdict"])
    return 0
