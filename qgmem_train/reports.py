"""What the benchmarks (``bench/``) and the studies (``experiments/``) record beside their figures, in one place both
import: the machine a run was on (:func:`machine_info`: cores, CPU, torch threads, load average), the commit
(:func:`git_state`), paired bootstrap intervals over questions (how far a difference between two rankings or variants
could be chance), the t interval over seeds, and a report's tail: written as JSON and markdown, or its markdown made
again from the saved JSON (``--report-only``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import posixpath
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qgmem_train.fileio import atomic_output, write_report_atomic

ROOT = Path(__file__).resolve().parents[1]
"""The repository, whose commit a report records."""


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo, else the platform's processor string."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor() or "unknown")


def machine_info() -> dict[str, object]:
    """Cores, CPU model, Python and torch versions, and the load average when the run started."""
    info: dict[str, object] = {"cores": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version()}
    try:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        info["load_average_1m"] = round(os.getloadavg()[0], 2)
    return info


MACHINE_TOPS = frozenset({"tmp", "home", "root", "mnt", "scratch", "work", ROOT.parts[1], Path.home().parts[1]})
"""The top folders of this machine's own files (workspaces, temporary folders, home folders): a path under one names
this machine, so no result may hold it (system paths such as ``/usr/bin/time`` name a tool, not the machine's files)."""
MACHINE_PATH = re.compile(rf"(?<![\w.:/~$-])/(?:{'|'.join(sorted(map(re.escape, MACHINE_TOPS)))})(?:/[^\s\"'`()<>,;|\]\[]*)?(?![\w.-])")
"""An absolute path under one of :data:`MACHINE_TOPS`, in any text (JSON, markdown, a command line)."""
CLIMBING_PATH = re.compile(rf"(?<![\w.])(?:\.\./)+(?:{'|'.join(sorted(map(re.escape, MACHINE_TOPS)))})(?:/[^\s\"'`()<>,;|\]\[]*)?(?![\w.-])")
"""A relative path that climbs out of the project into one of :data:`MACHINE_TOPS` (``../../tmp/run``): the same path
of the machine, written relative to where the report was made."""
OUTSIDE_PROJECT = "[machine]"
"""What stands for a folder of the machine outside the project and its ``shared/`` neighbours in a portable result."""


def machine_paths(text: str) -> list[str]:
    """The paths of this machine's own files that ``text`` holds, absolute (:data:`MACHINE_PATH`) or climbing out of the
    project to them (:data:`CLIMBING_PATH`)."""
    return MACHINE_PATH.findall(text) + CLIMBING_PATH.findall(text)


RESULTS_FOLDERS = ("experiments/*/results", "bench/results")
"""Where the project's committed results lie, below the repository."""


def files_with_machine_paths(root: Path = ROOT) -> dict[str, list[str]]:
    """Each text file below ``root``'s results folders (:data:`RESULTS_FOLDERS`) that holds an absolute path of the
    machine, with the paths it holds."""
    found = {}
    for file in sorted(f for pattern in RESULTS_FOLDERS for folder in root.glob(pattern) for f in folder.rglob("*") if f.is_file()):
        try:
            text = file.read_text()
        except UnicodeDecodeError:  # a figure
            continue
        if paths := machine_paths(text):
            found[str(file.relative_to(root))] = paths
    return found


def portable(value: Any, base: Path | str | None = None, root: Path | str = ROOT) -> Any:
    """``value`` (a JSON-like record or a string) with every absolute path of the machine made relative: to ``base``
    (the run's output folder) when under it, else to the repository ``root`` when beside it (``../shared/...``), else
    :data:`OUTSIDE_PROJECT` and the path below its top folder (``/tmp/run`` → ``[machine]/run``); a result then holds no
    path of the machine it ran on and still says where each file lies."""
    if isinstance(value, dict):
        return {key: portable(item, base, root) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable(item, base, root) for item in value]
    if not isinstance(value, str):
        return value

    def relative(match: re.Match[str]) -> str:
        path = match.group(0)
        for folder in (base, root):
            if folder is not None and (path == str(folder) or path.startswith(str(folder).rstrip("/") + "/")):
                return posixpath.relpath(path, str(folder))
        beside = posixpath.dirname(str(root).rstrip("/"))
        if path.startswith(beside + "/"):
            return posixpath.relpath(path, str(root))
        return posixpath.join(OUTSIDE_PROJECT, *path.strip("/").split("/")[1:])

    return MACHINE_PATH.sub(relative, value)


def paired_bootstrap(first: dict[str, float], second: dict[str, float], resamples: int, seed: int) -> dict[str, Any]:
    """Mean per-question difference ``first - second`` with a percentile bootstrap 95% interval over questions."""
    ids = sorted(set(first) & set(second))
    diff = np.array([first[q] - second[q] for q in ids])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(ids), size=(resamples, len(ids)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"questions": len(ids), "mean_difference": float(diff.mean()), "ci95": [float(low), float(high)],
            "share_of_resamples_above_0": float((means > 0).mean()), "resamples": resamples, "seed": seed}  # fmt: skip


def seed_interval(differences: list[float]) -> dict[str, Any]:
    """Mean, sample std and Student-t 95% interval of one difference measured once per seed: the spread a new training
    run would show, which a bootstrap over the questions of seed-averaged scores does not see."""
    from scipy import stats

    values = np.asarray(differences, float)
    mean, std = float(values.mean()), float(values.std(ddof=1))
    half = float(stats.t.ppf(0.975, len(values) - 1)) * std / np.sqrt(len(values))
    return {"seeds": len(values), "mean": mean, "std": std, "ci95": [mean - half, mean + half]}


def compared_codes(root: Path, baseline: Path | None, label: str | None) -> dict[str, Path] | None:
    """The code of each side of a comparison by label: ``root``'s (this code) and, with ``baseline``, that checkout's;
    None, with one line on stderr, when ``baseline`` holds no ``qgmem_train``."""
    if baseline is not None and not (baseline / "qgmem_train").is_dir():
        print(f"{baseline}: no qgmem_train folder (pass a checkout of the code to compare)", file=sys.stderr)
        return None
    return {"this code": root} | ({label or "baseline": baseline} if baseline is not None else {})


def child_json(script: str | Path, code: Path, args: list[str], cwd: Path) -> Any:
    """The JSON last line ``script`` prints, run with ``args`` in a fresh process whose ``qgmem_train`` is ``code``'s (a
    checkout compared with this one), offline, one OpenMP thread."""
    env = dict(os.environ, PYTHONPATH=str(code), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True, text=True, env=env, cwd=cwd)
    return json.loads(done.stdout.strip().splitlines()[-1])


def git_state() -> dict[str, Any]:
    """The commit this runs from and how many tracked files differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty_files": 0}
    return {"commit": commit, "dirty_files": len(status.splitlines())}


Markdown = Callable[[dict[str, Any]], str]
"""A study's report as markdown, made from the report's JSON alone."""


def write_report(path: Path, report: dict[str, Any], markdown: Markdown) -> str:
    """``report`` written to ``path`` (JSON) and its markdown beside it (``.md``), each atomically; the markdown is
    printed and returned."""
    report = portable(report, path.parent)
    text = markdown(report)
    write_report_atomic(path, report, text)
    print(text)
    return text


def add_report_options(parser: argparse.ArgumentParser, out: Path, name: str | None = None) -> None:
    """Where a study writes its report (``--out``, default ``out``; ``--report``, the file name, when ``name`` is given) and
    the options that remake saved reports from their JSON instead of running it."""
    parser.add_argument("--out", type=Path, default=out, help="results folder")
    if name is not None:
        parser.add_argument("--report", default=name, help="report name: writes <out>/<report>.json and .md")
    parser.add_argument("--report-only", nargs="+", type=Path, metavar="JSON",
                        help="remake the markdown of these saved reports (<name>.json) beside them; nothing runs")  # fmt: skip
    parser.add_argument("--check", action="store_true", help="with --report-only: compare the remade tables with the saved markdown, write nothing")


def table_rows(markdown: str) -> list[str]:
    """The table rows of a markdown report: its numbers."""
    return [line for line in markdown.splitlines() if line.startswith("|")]


def remake_reports(files: list[Path], markdown: Markdown, check: bool = False) -> int:
    """Each saved report's markdown made again from its JSON: written beside it, or with ``check`` its tables compared
    with the saved markdown's. A file that is not a saved report is one line and exit 2; tables that differ, one line
    naming the first row that does and exit 1."""
    for file in files:
        try:
            text = markdown(json.loads(Path(file).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {file}: not a saved report of this study ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        target = Path(file).with_suffix(".md")
        if not check:
            with atomic_output(target) as handle:
                handle.write(text)
            print(f"wrote {target}")
            continue
        remade, saved = table_rows(text), table_rows(target.read_text() if target.is_file() else "")
        if remade != saved:
            first = next((i for i, (a, b) in enumerate(zip(remade, saved)) if a != b), min(len(remade), len(saved)))
            found = remade[first] if first < len(remade) else "no row"
            print(f"error: {target}: table row {first + 1} differs from its JSON's: {found}", file=sys.stderr)
            return 1
    return 0


def machine_text(machine: dict[str, Any]) -> str:
    """One line of :func:`machine_info`'s record, as the reports print it."""
    return (f"{machine.get('cpu')}, {machine.get('cores')} cores, torch {machine.get('torch')} ({machine.get('torch_threads')} threads), "
            f"load average {machine.get('load_average_1m')} at the start")


def commit_text(git: dict[str, Any]) -> str:
    """The commit of :func:`git_state`'s record, with the count of modified files when there are any."""
    return f"`{git['commit']}`" + (f" ({git['dirty_files']} files modified)" if git["dirty_files"] else "")
