"""The walk of one ``ask`` and one ``serve`` search: how often the calls move between qgmem_train's folders.

Run ``python -m bench.bench_walk --baseline DIR`` (``DIR`` a checkout of other code, e.g. ``git worktree add`` of an
earlier commit). For each code a fresh process (one torch thread, ``qgmem_train`` from that code) stores the LoCoMo
sample's conversation in turns mode (MiniLM), then records every call of a ``qgmem_train`` function (``sys.setprofile``,
on every thread) while ``ask`` (the command's ``main``: SmolLM2 answers, rules intent, no reranker) answers one question,
and while a ``serve`` :class:`~qgmem_train.serve.service.MemoryService` answers one search (its first, which loads the
namespace and builds its index) and a second one. Each call is placed in its folder (``retrieval``, ``memory``, ...; the
package's own top-level modules are ``root``); a move is a call in another folder than the call before it. Results go to
bench/results/walk.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "locomo_sample.json"
NAMESPACE = "conv-26"
QUESTION = "What did Caroline go to yesterday?"
QUESTION_TIME = "2023-05-09"
WALKS = ("ask", "serve_first_search", "serve_second_search")


class Walk:
    """A profile function recording, while :meth:`recording`, the folder of every ``qgmem_train`` function called, on
    any thread, in call order. Installed once (:meth:`install`) before the threads it should see are started: a
    thread's profile function is fixed when it starts."""

    def __init__(self) -> None:
        self.folders: list[str] | None = None

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        folders = self.folders
        if folders is None or event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if name == "qgmem_train" or name.startswith("qgmem_train."):
            parts = name.split(".")
            package = hasattr(sys.modules.get(name), "__path__")
            folders.append(parts[1] if len(parts) > 2 or (package and len(parts) == 2) else "root")

    def install(self) -> None:
        """Profile this thread and every thread started from here on."""
        threading.setprofile(self)
        sys.setprofile(self)

    @contextmanager
    def recording(self) -> Iterator[list[str]]:
        """The folders of the calls made inside the block."""
        self.folders = folders = []
        try:
            yield folders
        finally:
            self.folders = None


def moves(folders: list[str]) -> dict[str, Any]:
    """Calls, moves (a call in another folder than the one before) and the moves by pair of folders, most first."""
    pairs = Counter(" <-> ".join(sorted((a, b))) for a, b in zip(folders, folders[1:]) if a != b)
    return {"calls": len(folders), "moves": sum(pairs.values()), "folders": sorted(set(folders)), "pairs": dict(pairs.most_common())}


def child(work: Path) -> dict[str, Any]:
    """The three walks with the ``qgmem_train`` this process imports (only names every compared code has)."""
    import asyncio

    import torch

    from qgmem_train.__main__ import main as cli
    from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM, PipelineConfig
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.llm.local import TransformersLLM
    from qgmem_train.memory.loaders import load_conversations
    from qgmem_train.predictor import QGMemPredictor
    from qgmem_train.serve.service import MemoryService

    torch.set_num_threads(1)
    cfg = PipelineConfig()
    cfg.models.reranker, cfg.models.device = "none", "cpu"
    cfg.construction.units, cfg.construction.traces = "turns", False
    cfg.generation.max_new_tokens = 32
    predictor = QGMemPredictor(None, cfg, llm=TransformersLLM(BUNDLED_LLM), embedder=Embedder(BUNDLED_EMBEDDER, device="cpu"), reranker=None,
                               intent="rules")  # fmt: skip
    store = work / "store"
    with predictor.memory(NAMESPACE, store) as memory:
        for session in load_conversations("locomo", SAMPLE)[0].sessions:
            memory.add_session(session.turns, time=session.time, session_id=session.id)
    config = work / "ask.yaml"
    config.write_text("pipeline:\n  construction:\n    units: turns\n    traces: false\n  generation:\n    max_new_tokens: 32\n")
    walks: dict[str, Any] = {}
    walk = Walk()
    walk.install()
    with walk.recording() as folders:
        code = cli(["ask", "--store", str(store), "--namespace", NAMESPACE, "--config", str(config), "--reranker", "none", "--intent", "rules",
                    "--time", QUESTION_TIME, QUESTION])  # fmt: skip
    if code != 0:
        raise SystemExit(f"ask exited with {code}")
    walks["ask"] = moves(folders)
    service = MemoryService(predictor, store)
    try:
        for name in WALKS[1:]:
            with walk.recording() as folders:
                asyncio.run(service.search(NAMESPACE, QUESTION, QUESTION_TIME))
            walks[name] = moves(folders)
    finally:
        service.close()
    return walks


def run_child(code: Path, work: Path) -> dict[str, Any]:
    """:func:`child` in a fresh process with ``qgmem_train`` from ``code``."""
    from qgmem_train.reports import child_json

    return child_json(__file__, code, ["--child", str(Path(tempfile.mkdtemp(prefix="walk-", dir=work)))], work)


def markdown(report: dict[str, Any]) -> str:
    """Each code's calls and moves per walk, and its most frequent pairs of folders."""
    from qgmem_train.reports import machine_text

    lines = [
        "# The walk of one `ask` and one `serve` search: moves between qgmem_train's folders",
        "",
        f"A move is a call of a qgmem_train function in another folder than the call before it (sys.setprofile over every "
        f"thread). Machine: {machine_text(report['machine'])}; counts do not depend on its load.",
        "",
        "| code | walk | calls | moves | moves between retrieval and memory | most frequent pairs |",
        "|---|---|---|---|---|---|",
    ]
    for label, walks in report["codes"].items():
        for name in WALKS:
            walk = walks[name]
            top = ", ".join(f"{pair} {count}" for pair, count in list(walk["pairs"].items())[:4])
            lines.append(f"| {label} | {name} | {walk['calls']} | {walk['moves']} | {walk['pairs'].get('memory <-> retrieval', 0)} | {top} |")
    lines += ["", report["reading"], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the options, walk each code in its own process, write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench.bench_walk", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout whose qgmem_train walks the same, beside this code's")
    parser.add_argument("--baseline-label", help="what the baseline is, for the report (default: baseline)")
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "bench_walk", help="where the stores are built")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "walk.json")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    from qgmem_train.fileio import write_report_atomic
    from qgmem_train.reports import compared_codes, machine_info

    codes = compared_codes(ROOT, args.baseline, args.baseline_label)
    if codes is None:
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": machine_info(), "question": QUESTION, "namespace": NAMESPACE,
        "codes": {label: run_child(code, args.work) for label, code in codes.items()},
        "reading": "Calls that stay in one folder are not moves; model loading and generation run in torch and "
                   "transformers, outside the count. The first serve search loads the namespace and builds its index.",
    }  # fmt: skip
    write_report_atomic(args.out, report, markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
