"""Step 2 of the graph-token study: can graph tokens be trained to write their own graph's facts, read on held-out graphs?

    python -m experiments.graph_token.alignment --out out/graph_token     # over the study's prepared data

Runs the alignment stage (docs/alignment.md) on the study's conversations: ``python -m data_prep align`` over the
study's data-prep config, each case keeping the study's split (``--split-from <out>/data/trajectories``: the test
conversations are never built), then one ``python -m qgmem_train fit --config configs/align-cpu.yaml`` per arm, with the
``edges`` readout (one token per edge, at most ``--edge-tokens``): ``linear`` (frozen node and edge features, no message
passing, one linear projector without LayerNorm) and ``encoder`` (the config's encoder and projector). Each fit's last
validation (its checkpoint's ``graph_reading``: the shuffle gap on the validation conversation's graphs with its 95%
interval, and the graph-token cosine, uncentred) gives the arm's verdict: it passes when the gap is at least :data:`GAP_NATS` nats
a token with the interval above 0 and the cosine below :data:`COSINE_BELOW`.

Layout of ``<out>/alignment/``: ``data_prep.yaml`` and ``data/`` (the alignment data, resumable), ``data.json``;
``<arm>/`` (the fit's ``config.yaml`` overrides, ``fit.log``, ``ckpt/``, ``logs/`` and ``result.json``); ``results.json``
and ``results.md``. A finished part is reused; a fit killed midway resumes from its ``ckpt/last.ckpt``.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from qgmem_train.reports import ROOT, commit_text, git_state, machine_info, machine_text
from experiments.graph_token.cli import parser as study_parser
from experiments.graph_token.steps import data_identity, llm_instrument, part_settings, run_step, saved_or_computed, step_folder
from qgmem_train.errors import InputError
from qgmem_train.fileio import atomic_output, read_text
from qgmem_train.trajectory import read_trajectory_dataset, trajectory_graph_settings

log = logging.getLogger("experiments.graph_token.alignment")

GAP_NATS = 0.3
"""Shuffle gap (nats a target token) on held-out graphs at or above which the tokens carry their graph (issue 53's bar)."""
COSINE_BELOW = 0.99
"""Mean cosine between different graphs' tokens below which the tokens differ between graphs."""
ARMS = {
    "linear": {"encoder": {"layers": 0}, "projector": {"hidden_dim": 0, "norm": False}},
    "encoder": {},
}
"""Each arm's model settings over the alignment config's: frozen features and a linear projector, or the config's own."""
ARM_NAMES = {
    "linear": "frozen node/edge features, linear projector, no LayerNorm",
    "encoder": "the project's encoder and projector (the align config's)",
}


def alignment_config(out: Path, folder: Path) -> Path:
    """The study's data-prep config with its source read from ``<out>/data/source`` and its output under ``folder``:
    the alignment data draws the study's staged conversations wherever the study's folder now lies."""
    import yaml

    config = yaml.safe_load(read_text(out / "data" / "data_prep.yaml"))
    config["data_prep"].update(source=str(out / "data" / "source"), out=str(folder / "prep"))
    path = folder / "data_prep.yaml"
    with atomic_output(path) as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    return path


def launch(command: list[str], log_file: Path, threads: int, label: str) -> str:
    """Run ``command`` from the repository with ``threads`` torch threads, its output appended to ``log_file``; its stdout.
    A failure is an :class:`InputError` naming the log."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log.info("[%s] %s (log %s)", label, " ".join(command[1:]), log_file)
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    with log_file.open("a") as handle:
        handle.write(result.stderr + result.stdout)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(str(log_file), f"{label} exited with {result.returncode}: {last}")
    return result.stdout


def build_data(args: argparse.Namespace, out: Path, folder: Path, trajectories: Path) -> dict[str, Any]:
    """``data_prep align`` over the study's conversations with the study's split; the summary it prints, with the cases of
    each split and the test conversations' cases found in the data (none, or the step stops)."""
    config = alignment_config(out, folder)
    command = [sys.executable, "-m", "data_prep", "align", "--config", str(config), "--split-from", str(trajectories),
               "--out", str(folder / "data"), "--pseudo-queries", str(args.pseudo_queries)]  # fmt: skip
    summary = json.loads(launch(command, folder / "data.log", args.threads, "alignment data").strip().splitlines()[-1])
    test_cases = {ex.case_id for ex in read_trajectory_dataset(trajectories)["test"]}
    aligned = read_trajectory_dataset(summary["dataset"])
    cases = {name: sorted({ex.case_id for ex in part}) for name, part in aligned.items()}
    leaked = sorted(test_cases & {c for part in cases.values() for c in part})
    if leaked:
        raise InputError(summary["dataset"], f"holds test conversation(s) {', '.join(leaked)}")
    return {**summary, "case_ids": cases, "test_cases_in_data": leaked}


def fit_overrides(args: argparse.Namespace, arm: str, run_dir: Path, dataset: str) -> dict[str, Any]:
    """The arm's settings over the alignment config: its data, folders, steps, validations and model, and the ``graph.*``
    settings the dataset's graphs were built with (the fit refuses others)."""
    every = max(1, args.align_steps // args.align_val_checks)
    val_batches = -(-args.align_val_graphs // args.eval_batch_size)
    model: dict[str, Any] = {"readout": {"kind": "edges", "tokens": args.edge_tokens}}
    recorded = trajectory_graph_settings(dataset)
    graph = {} if recorded is None else {"graph": recorded}
    for group, values in ARMS[arm].items():
        model[group] = dict(values)
    return {
        "seed_everything": 0,
        "trainer": {"max_steps": args.align_steps, "val_check_interval": every, "limit_val_batches": val_batches,
                    "default_root_dir": str(run_dir), "enable_progress_bar": False, "log_every_n_steps": 1,
                    "logger": [{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run_dir), "name": "logs"}}]},
        "checkpoint": {"dirpath": str(run_dir / "ckpt")},
        "model": model,
        "data": {"path": dataset, "batch_size": args.align_batch_size, "eval_batch_size": args.eval_batch_size},
        "pipeline": {"models": {"llm": args.llm, "embedder": args.embedder}, **graph},
    }  # fmt: skip


def fit_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """``qgmem_train fit`` with the alignment config and the arm's overrides, resuming from ``ckpt/last.ckpt`` when there."""
    command = [sys.executable, "-m", "qgmem_train", "fit", "--config", str(args.align_config), "--config", str(run_dir / "config.yaml")]
    last = run_dir / "ckpt" / "last.ckpt"
    return command + (["--ckpt_path", str(last)] if last.is_file() else [])


def train_losses(run_dir: Path) -> list[float]:
    """Every logged ``train/loss`` of the arm's fit, in step order over its CSV logs (a resumed fit writes a new version)."""
    rows: dict[int, float] = {}
    for metrics in sorted((run_dir / "logs").glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1])):
        with metrics.open() as handle:
            for row in csv.DictReader(handle):
                if row.get("train/loss"):
                    rows[int(row["step"])] = float(row["train/loss"])
    return [rows[step] for step in sorted(rows)]


def fit_arm(args: argparse.Namespace, arm: str, folder: Path, data: dict[str, Any]) -> dict[str, Any]:
    """One arm's fit (resumed when killed), then its last checkpoint's step, epoch and graph reading."""
    import torch
    import yaml

    run_dir = folder / arm
    run_dir.mkdir(parents=True, exist_ok=True)
    with atomic_output(run_dir / "config.yaml") as handle:
        yaml.safe_dump(fit_overrides(args, arm, run_dir, data["dataset"]), handle, sort_keys=False)
    launch(fit_command(args, run_dir), run_dir / "fit.log", args.threads, f"fit {arm}")
    checkpoint = torch.load(run_dir / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    losses = train_losses(run_dir)
    tail = max(1, len(losses) // 10)
    return {
        "arm": arm, "steps": checkpoint["global_step"], "train_graphs": data["graphs"]["train"],
        "epochs": round(checkpoint["global_step"] * args.align_batch_size / data["graphs"]["train"], 3),
        "reading": checkpoint["qgmem"]["graph_reading"],
        "train_loss_first": sum(losses[:tail]) / tail if losses else None, "train_loss_last": sum(losses[-tail:]) / tail if losses else None,
    }  # fmt: skip


def arm_verdict(reading: dict[str, Any] | None) -> bool | None:
    """Whether an arm's last validation passes the bar; ``None`` when it measured nothing."""
    if not reading or "skipped" in reading or reading.get("shuffle_gap_low") is None:
        return None
    cosine = reading.get("token_raw_cosine", reading.get("token_cosine"))  # readings before the centred cosine hold the raw one
    return reading["shuffle_gap"] >= GAP_NATS and reading["shuffle_gap_low"] > 0 and cosine is not None and cosine < COSINE_BELOW


def step_verdict(rows: list[dict[str, Any]]) -> tuple[bool | None, str]:
    """The step passes when an arm does; it is undecided when no arm measured a gap."""
    passed = [r["arm"] for r in rows if r["passed"]]
    if passed:
        return True, f"passes: {', '.join(passed)} carries at least {GAP_NATS} nats a token of its own graph on held-out graphs"
    if all(r["passed"] is None for r in rows):
        return None, "undecided: no arm measured a shuffle gap"
    measured = [r for r in rows if r["passed"] is False]
    steps, epochs = max(r["steps"] for r in measured), max(r["epochs"] for r in measured)
    return False, (f"fails: no arm's tokens carry {GAP_NATS} nats a token of their graph on held-out graphs after {steps} steps "
                   f"({epochs:.3f} of an epoch): no alignment at this budget")


def load_note(remade: bool) -> str:
    """What the report's load average is when every part was reused: the remake's, not the fits'."""
    return " (taken when this report was remade from saved parts, not during the fits)" if remade else ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The alignment data (reused when there), each arm's fit (each saved as it ends), the report."""
    machine = machine_info()
    out = args.out.resolve()
    folder, summary, trajectories = step_folder(args, "alignment")
    remade = all((folder / part).exists() for part in ("data.json", *(f"{arm}/result.json" for arm in args.arms)))
    data = saved_or_computed(folder / "data.json", "data", lambda: build_data(args, out, folder, trajectories),
                             {"pseudo_queries": args.pseudo_queries, "data": data_identity(out)}, stale=folder / "data")  # fmt: skip
    settings = part_settings(args, out, **{key: getattr(args, key) for key in ("align_steps", "align_batch_size", "align_val_checks", "align_val_graphs", "edge_tokens", "eval_batch_size")})
    rows = []
    for arm in args.arms:
        record = saved_or_computed(folder / arm / "result.json", f"fit {arm}", lambda: fit_arm(args, arm, folder, data),
                                   {**settings, "config": str(args.align_config)}, stale=folder / arm)  # fmt: skip
        rows.append({**record, "name": ARM_NAMES[arm], "passed": arm_verdict(record["reading"])})
    passed, text = step_verdict(rows)
    return {
        "step": 2, "question": "can graph tokens be trained to carry their graph's facts?", "passed": passed, "verdict": text,
        "split": summary["split"], "data": {k: v for k, v in data.items() if k != "case_ids"}, "rows": rows,
        "settings": {"config": str(args.align_config), "steps": args.align_steps, "batch_size": args.align_batch_size,
                     "val_checks": args.align_val_checks, "val_graphs_cap": args.align_val_graphs, "eval_batch_size": args.eval_batch_size,
                     "edge_tokens": args.edge_tokens, "pseudo_queries": args.pseudo_queries, "llm": llm_instrument(args.llm), "threads": args.threads},
        "wall_s": round(data["wall_s"] + sum(r["wall_s"] for r in rows), 1), "machine": machine, "remade": remade, "git": git_state(),
    }  # fmt: skip


def fmt_reading(reading: dict[str, Any]) -> tuple[str, str, str]:
    """The gap with its interval, the validation graphs and the cosine of one reading, as table cells."""
    if not reading or reading.get("shuffle_gap_low") is None:
        return "not measured", "", ""
    gap = f"{reading['shuffle_gap']:+.4f} [{reading['shuffle_gap_low']:+.4f}, {reading['shuffle_gap_high']:+.4f}]"
    cosine = reading.get("token_cosine")
    return gap, str(reading["examples"]), "" if cosine is None else f"{cosine:.4f}"


def fmt_loss(value: float | None) -> str:
    """A loss, or a dash when none was logged."""
    return "–" if value is None else f"{value:.3f}"


def markdown(result: dict[str, Any]) -> str:
    """The step's report: the verdict, the data, and per arm its training, shuffle gap, cosine and time."""
    s, d = result["settings"], result["data"]
    verdicts = {True: "passes", False: "fails", None: "not measured"}
    lines = [
        "# Graph-token study, step 2: can graph tokens be trained to carry their graph's facts?", "",
        f"**{result['verdict']}.** Alignment data (`data_prep align`, {s['pseudo_queries']} pseudo-queries a case, the study's split): "
        f"{d['graphs']['train']} training graphs of {', '.join(result['split']['train'])}, {d['graphs']['validation']} held-out graphs of "
        f"{', '.join(result['split']['validation'])}; the test conversations ({', '.join(result['split']['test'])}) were not built. "
        f"Fit: `{s['config']}`, frozen {s['llm']}, edges readout (at most {s['edge_tokens']} tokens), {s['steps']} steps at batch "
        f"{s['batch_size']}, {s['val_checks']} validation(s) over at most {s['val_graphs_cap']} held-out graphs. Shuffle gap: the loss of the "
        f"facts with another graph's tokens minus with its own, nats a token, 95% t interval over the validation graphs, at the last "
        f"validation. Passes at a gap ≥ {GAP_NATS} with the interval above 0 and a token cosine < {COSINE_BELOW}.", "",
        "| arm | settings | steps | epochs | train loss first → last 10% | shuffle gap [95%] | val graphs | token cosine | verdict | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in result["rows"]:
        gap, graphs, cosine = fmt_reading(r["reading"])
        lines.append(f"| {r['arm']} | {r['name']} | {r['steps']} | {r['epochs']} | {fmt_loss(r['train_loss_first'])} → {fmt_loss(r['train_loss_last'])} | "
                     f"{gap} | {graphs} | {cosine} | {verdicts[r['passed']]} | {r['wall_s']:.0f} |")  # fmt: skip
    lines += ["", f"Commit: {commit_text(result['git'])}. Machine: {machine_text(result['machine'])}{load_note(result.get('remade', False))}. Wall time of the data and the fits {result['wall_s']:.0f} s "
              "(each part's last launch: a reused part keeps its own, a resumed fit counts from its resume).", ""]  # fmt: skip
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The study's command line plus this step's settings."""
    p = study_parser()
    p.prog, p.description = "python -m experiments.graph_token.alignment", __doc__.splitlines()[0]
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="the arms to fit, in this order")
    p.add_argument("--align-config", type=Path, default=ROOT / "configs" / "align-cpu.yaml", help="the alignment fit's config")
    p.add_argument("--align-steps", type=int, default=60, help="optimizer steps of each arm's fit")
    p.add_argument("--align-batch-size", type=int, default=2, help="training graphs a step")
    p.add_argument("--align-val-checks", type=int, default=1, help="validations of each fit (the last one is the step's reading)")
    p.add_argument("--align-val-graphs", type=int, default=56, help="held-out graphs each validation reads at most")
    p.add_argument("--pseudo-queries", type=int, default=256, help="data_prep align: graphs activated for a case's own unit texts")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run step 2 over ``--out`` (the study's output folder)."""
    positive = ("align_steps", "align_batch_size", "align_val_checks", "align_val_graphs", "pseudo_queries", "eval_batch_size")
    return run_step(parser().parse_args(argv), "alignment", run, markdown, positive)


if __name__ == "__main__":
    sys.exit(main())
