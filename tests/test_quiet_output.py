"""Quiet by default: the demo's commands print their own progress bars and summary lines, no library chatter.

The commands run as a user runs them (subprocesses, small inputs, the bundled models): build, eval
retrieval, data prep, fit, export and ask through the exported model. Each runs under ``-X importtime`` so
the test also sees that bitsandbytes is never imported when nothing is quantized. ``-v`` brings a
library's lines back.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from qgmem_train.logging_setup import LOG_LEVEL_ENV, QUIET_ENV, library_log_level, take_verbose_flag
from qgmem_train.model.settings import merge_settings
from tests.test_retrieval_activation import tiny_cross_encoder

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "locomo_sample.json"
FIT_CONFIG = ROOT / "configs" / "demo-cpu.yaml"
DATA_PREP_CONFIG = ROOT / "configs" / "data_prep" / "demo-cpu.yaml"
TRAJECTORIES = ROOT / "tests" / "data" / "trajectories"

LIBRARY_LINES = [
    "gemm_4bit_forward",  # bitsandbytes on CPUs with AVX512-BF16
    "kernels-community",
    "Loading weights",  # transformers' progress bar per model
    "Loading SentenceTransformer",
    "litlogger",  # Lightning's tip
    "module(s) in eval mode",
    "GPU available",
    "Seed set to",
    "Trainable params",  # Lightning's model summary
    "Saving the dataset",  # datasets' progress bar
    "torchvision is not installed",  # torch's ONNX exporter
    "pre-processing before quantization",  # ONNX Runtime's quantizer
]
WARNING_LINE = re.compile(r"\S+\.py:\d+: |\b[A-Z]\w*Warning\b")
"""A Python warning as ``warnings`` (or Lightning's rank_zero_warn) prints it."""
BAR = re.compile(r"^(?P<desc>[^:|]+): +\d+%\|")
PROJECT_BARS = re.compile(r"^(build|eval retrieval|data prep shard \d+/\d+|generate|embedding graph labels)$")
BITSANDBYTES_IMPORT = re.compile(r"\|\s+bitsandbytes\.")
"""An ``-X importtime`` line of a bitsandbytes submodule: the package really loaded."""


def run(module: str, *args: str, importtime: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository root, with none of the quiet settings inherited."""
    env = {k: v for k, v in os.environ.items() if k not in QUIET_ENV and k != LOG_LEVEL_ENV}
    flags = ["-X", "importtime"] if importtime else []
    result = subprocess.run([sys.executable, *flags, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def output_lines(text: str) -> list[str]:
    """Lines as a terminal shows them (progress bars redraw with ``\\r``), import-time lines left out."""
    return [line.strip() for line in re.split(r"[\r\n]", text) if line.strip() and not line.startswith("import time:")]


def fit_config(root: Path) -> Path:
    """The demo fit config, writing under ``root``: two steps of a LoRA run on the committed trajectories, one example
    a step and a short context (the lines a fit prints do not depend on how much it computes)."""
    raw = yaml.safe_load(FIT_CONFIG.read_text())
    raw["trainer"].update(max_steps=2, val_check_interval=2, limit_val_batches=1, default_root_dir=str(root))
    for logger in raw["trainer"]["logger"]:
        logger["init_args"]["save_dir"] = str(root)
    raw["checkpoint"]["dirpath"] = str(root / "ckpt")
    raw["model"] = merge_settings(raw["model"], {"lora": {"r": 2}, "generation": {"val_generate": False, "max_new_tokens": 32},
                                               "prompt": {"max_context_tokens": 32}})
    raw["data"].update(path=str(TRAJECTORIES), batch_size=1, eval_batch_size=1)
    path = root / "fit.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def data_prep_config(root: Path) -> Path:
    """The demo data-prep config cut to one case of one question, writing under ``root``."""
    raw = yaml.safe_load(DATA_PREP_CONFIG.read_text())
    raw["data_prep"].update(
        source=str(ROOT / "samples" / "convomem_cases"), categories={"category_1_basic_facts": 1}, total_cases=1,
        max_questions_per_case=1, max_sessions_per_case=1, out=str(root / "data_prep"),
    )  # fmt: skip
    path = root / "data_prep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every command of the demo once, quietly, on small inputs; the runs by name."""
    root = tmp_path_factory.mktemp("quiet")
    turns = root / "turns.yaml"
    turns.write_text("pipeline:\n  construction:\n    units: turns\n    traces: false\n")
    store, export = root / "store", root / "export"
    build = ["build", "--dataset", "locomo", "--input", str(SAMPLE), "--store", str(store), "--units", "turns", "--limit-sessions", "1", "--config", str(turns)]
    fit = fit_config(root)
    runs = {"build": run("qgmem_train", *build)}
    onnx = root / "onnx.yaml"  # a one-layer cross-encoder: its export and quantization print what a full one's would, in seconds
    (root / "cross").mkdir()
    onnx.write_text(yaml.safe_dump({"pipeline": {"construction": {"units": "turns", "traces": False}, "models": {
        "reranker_model": str(tiny_cross_encoder(root / "cross")), "reranker_runtime": "onnxruntime", "reranker_quantization": "int8",
        "cache_dir": str(root / "cache")}}}))  # fmt: skip
    runs["eval retrieval onnxruntime"] = run("qgmem_train", "eval", "retrieval", "--dataset", "locomo", "--input", str(SAMPLE), "--store", str(store),
                                             "--out", str(root / "eval-onnx"), "--intent", "rules", "--reranker", "cross", "--limit", "1", "--config", str(onnx))  # fmt: skip
    runs["data prep"] = run("data_prep", "--config", str(data_prep_config(root)))
    runs["fit"] = run("qgmem_train", "fit", "--config", str(fit))
    runs["export"] = run("export", "--checkpoint", str(root / "ckpt" / "last.ckpt"), "--config", str(fit), "--out", str(export), "--dry-run")
    runs["ask"] = run("qgmem_train", "ask", "--model", str(export), "--store", str(store), "--time", "2023-05-09", "--intent", "rules", "--json",
                      "What did Caroline go to yesterday?")  # fmt: skip
    runs["build -v"] = run("qgmem_train", *build, "-v", importtime=False)
    return runs


@pytest.mark.slow
def test_commands_show_only_their_own_bars_and_lines(demo: dict[str, subprocess.CompletedProcess[str]]) -> None:
    for name, result in demo.items():
        if name.endswith("-v"):
            continue
        lines = output_lines(result.stdout) + output_lines(result.stderr)
        noise = [line for line in lines if any(text in line for text in LIBRARY_LINES) or WARNING_LINE.search(line)]
        foreign_bars = [line for line in output_lines(result.stderr) if (bar := BAR.match(line)) and not PROJECT_BARS.match(bar["desc"])]
        assert not noise and not foreign_bars, f"{name}: {(noise + foreign_bars)[:5]}"
    assert "built 1 conversation(s)" in demo["build"].stdout and "wrote " in demo["eval retrieval onnxruntime"].stdout
    assert re.search(r"^fit: 2 steps, val/loss \d+\.\d+, last checkpoint .*last\.ckpt$", demo["fit"].stdout, re.M)
    assert "exported to" in demo["export"].stdout


@pytest.mark.slow
def test_ask_json_is_one_object_with_the_evidence(demo: dict[str, subprocess.CompletedProcess[str]]) -> None:
    record = json.loads(demo["ask"].stdout)
    assert record["path"] == "graph" and set(record) >= {"answer", "reasoning_path", "cited", "units", "tokens", "seconds"}
    assert record["units"] and all(unit["source_turns"] for unit in record["units"])
    assert record["cited"] == [unit for unit in record["units"] if unit["cited"]]
    assert record["tokens"]["context"] > 0 and record["seconds"]["total"] > 0


@pytest.mark.slow
def test_bitsandbytes_is_not_imported_without_quantization(demo: dict[str, subprocess.CompletedProcess[str]]) -> None:
    for name, result in demo.items():
        if not name.endswith("-v"):
            assert not [line for line in result.stderr.splitlines() if BITSANDBYTES_IMPORT.search(line)], name


@pytest.mark.slow
def test_verbose_brings_library_lines_back(demo: dict[str, subprocess.CompletedProcess[str]]) -> None:
    lines = output_lines(demo["build -v"].stderr)
    assert any("Loading weights" in line for line in lines)
    assert "units 18 (0 new)" in demo["build -v"].stdout


def test_verbose_flag_is_taken_anywhere_before_a_double_dash() -> None:
    assert take_verbose_flag(["ask", "-v", "q?", "--verbose", "--", "-v"]) == (["ask", "q?", "--", "-v"], True)
    assert take_verbose_flag(["build", "--store", "s"]) == (["build", "--store", "s"], False)


def test_log_level_comes_from_the_flag_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    assert (library_log_level(False), library_log_level(True)) == (logging.ERROR, logging.INFO)
    monkeypatch.setenv(LOG_LEVEL_ENV, "debug")
    assert library_log_level(False) == logging.DEBUG
    monkeypatch.setenv(LOG_LEVEL_ENV, "warning")
    assert (library_log_level(False), library_log_level(True)) == (logging.WARNING, logging.INFO)


def test_a_bad_log_level_is_one_line_and_exit_2() -> None:
    env = {**os.environ, LOG_LEVEL_ENV: "LOUD"}
    result = subprocess.run([sys.executable, "-m", "qgmem_train", "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {LOG_LEVEL_ENV}=LOUD: not a log level (DEBUG, INFO, WARNING, ERROR)"


def test_asking_for_quantization_makes_bitsandbytes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    from qgmem_train.llm.resolver import quantization_config

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # hidden, as every entry point leaves it
    assert importlib.util.find_spec("bitsandbytes") is None
    config = quantization_config("4bit", "cuda:0", torch.bfloat16)
    assert config.load_in_4bit and importlib.util.find_spec("bitsandbytes") is not None
