"""The graph-token study's report: results.md and its plots from results.json, and a saved results folder's report
rebuilt after checking its numbers against its saved runs.

    python -m experiments.graph_token.report experiments/graph_token/results/graph_token_600_mean_seeds           # rewrites its results.md
    python -m experiments.graph_token.report --check experiments/graph_token/results/graph_token_600_mean_seeds   # compares, writes nothing

A saved folder holds ``results.json`` and ``runs/<arm>-seed<k>.json`` (each run's ``result.json``). Every number of the
summary but the F1 per category (the saved runs do not hold their questions' categories) is recomputed from the runs;
a number that differs is one line on stderr and exit 1, a folder that is not a saved report one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from qgmem_train.reports import commit_text, machine_text
from experiments.graph_token.data import SPLITS
from experiments.graph_token.stats import summarize
from experiments.graph_token.training import run_relative
from qgmem_train.errors import InputError
from qgmem_train.fileio import atomic_output


def fmt(cell: dict[str, Any], digits: int = 3) -> str:
    """``mean ± std`` (std left out for one seed)."""
    return f"{cell['mean']:.{digits}f}" + (f" ± {cell['std']:.{digits}f}" if cell["std"] is not None else "")


def markdown(result: dict[str, Any]) -> str:
    """results.md: command, commit, machine, split, steps and time per run, the table, per-category F1, the bootstrap."""
    m, d, s = result["machine"], result["data"], result["settings"]
    variants_ = result["summary"]["variants"]
    lines = [
        "# Graph token experiment: graph tokens against a soft prompt, no graph, the text path and LoRA", "",
        f"Command: `{result['command']}`  ",
        f"Commit: {commit_text(result['git'])}  ",
        f"Machine: {machine_text(m)}. Wall time {result['wall_s'] / 60:.1f} min.", "",
        f"Data: `{d['source']}`; split by conversation (never one conversation in two splits), split seed {s['split_seed']}:", "",
        "| split | conversations | questions used | per category |", "|---|---|---|---|",
    ]  # fmt: skip
    for name in SPLITS:
        per_cat = ", ".join(f"{c} {n}" for c, n in d["examples_per_category"][name].items())
        lines.append(f"| {name} | {', '.join(d['split'][name])} | {d['examples'][name]} | {per_cat} |")
    dp = d["data_prep"]
    lines += [
        "",
        f"Data prep (`{dp['config']}`): turns units, rule intent, gold targets, no traces; one staged case per conversation; "
        f"{dp['seconds_per_case']} seconds per case, {dp['questions_per_hour']} questions/hour, {dp['wall_s']:.0f} s in all.", "",
        f"Training: frozen {s.get('instrument') or '`' + s['llm'] + '` (float32)'}, {s['steps']} optimizer steps of batch {s['batch_size']}, learning rate {s['lr']} "
        f"(10% warm-up, cosine), {s['monitor']} every {math.ceil(s['steps'] / s['val_checks'])} steps on the validation conversation "
        f"(best checkpoint tested); context {s['max_context_tokens']} tokens, {s['max_new_tokens']} new tokens, schema-constrained; "
        f"local graphs {'with' if s['attribute_edges'] else 'without'} attribute edges. Losses on every test question; "
        + ("answers (valid JSON, F1, BLEU-1, EM) on every one." if s.get("max_f1_questions") is None else
           f"answers (valid JSON, F1, BLEU-1, EM) on a seeded sample of {s['max_f1_questions']} of them (split seed, test order)."), "",
        "## Test conversations", "",
        "| variant | seeds | steps | answer loss | test loss | valid JSON | F1 | BLEU-1 | EM | token cosine | between-question variance |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in variants_.values():
        diag = [f"{row[k]:{spec}}" if k in row else "" for k, spec in (("graph_token_cosine", ".6f"), ("graph_token_between_variance_ratio", ".1e"))]
        lines.append(
            f"| {row['name']} | {len(row['seeds'])} | {row['steps']} | {fmt(row['test_answer_loss'])} | {fmt(row['test_loss'])} | "
            f"{fmt(row['json_valid'])} | {fmt(row['f1'])} | {fmt(row['bleu1'])} | {fmt(row['exact_match'])} | {diag[0]} | {diag[1]} |"
        )
    lines += ["", "Mean ± sample std over seeds (no ± for one seed). Answer loss: the answer field's tokens alone; test loss: the whole "
              "target. Token cosine and between-question variance: the graph tokens of the test questions (`qgmem_train/graph/diagnostics.py`)."]  # fmt: skip
    if result.get("not_run"):
        lines += ["", f"Not run (--report-only): {'; '.join(result['not_run'])}."]
    for title, key, unit in (("answer-span loss (control − arm: above 0, the arm is better)", "bootstrap_answer_loss", "answer loss"),
                             ("F1 (arm − control)", "bootstrap", "F1")):  # fmt: skip
        boot = result["summary"].get(key) or {}
        if not boot:
            continue
        lines += ["", f"## Paired bootstrap of the {title}", "",
                  "| arm − control | seeds | questions | mean | 95% interval | resamples above 0 |", "|---|---|---|---|---|---|"]  # fmt: skip
        for pair, b in boot.items():
            seeds = ", ".join(map(str, b.get("training_seeds") or [])) or "all"
            lines.append(
                f"| {pair.replace(' - ', ' − ')} | {seeds} | {b['questions']} | {b['mean_difference']:+.4f} | "
                f"[{b['ci95'][0]:+.4f}, {b['ci95'][1]:+.4f}] | {b['share_of_resamples_above_0']:.3f} |"
            )
        lines += ["", f"Per-question {unit} averaged over the seeds both arms ran; {next(iter(boot.values()))['resamples']} resamples of the "
                  f"test questions, seed {s['bootstrap_seed']}."]  # fmt: skip
    for title, key in (("answer-span loss (control − arm)", "seeds_answer_loss"), ("F1 (arm − control)", "seeds")):
        seeded = result["summary"].get(key) or {}
        if not seeded:
            continue
        lines += ["", f"## Seed by seed: the {title}", "",
                  "| arm − control | seeds | difference per seed | mean ± std over seeds | 95% t interval over seeds |", "|---|---|---|---|---|"]  # fmt: skip
        for pair, b in seeded.items():
            seeds = ", ".join(str(r["training_seed"]) for r in b["per_seed"])
            differences = ", ".join(f"{r['mean_difference']:+.4f}" for r in b["per_seed"])
            lines.append(
                f"| {pair.replace(' - ', ' − ')} | {seeds} | {differences} | {b['mean']:+.4f} ± {b['std']:.4f} | "
                f"[{b['ci95'][0]:+.4f}, {b['ci95'][1]:+.4f}] |"
            )
        lines += ["", "Each seed's difference pairs the two arms' runs of that seed (a shuffled-graph test: the checkpoint it tests); "
                  "the t interval treats the seeds as independent runs, and is what a claim about the design rests on."]  # fmt: skip
    categories = sorted({c for row in variants_.values() for c in row["f1_per_category"]})
    if categories:
        lines += ["", "## F1 per category", "", "| variant | " + " | ".join(categories) + " |", "|---|" + "---|" * len(categories)]
        for row in variants_.values():
            cells = [f"{row['f1_per_category'][c]['mean']:.3f}" if c in row["f1_per_category"] else "" for c in categories]
            lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
        counts = next(iter(variants_.values()))["f1_per_category"]
        lines += ["", "Questions per category: " + ", ".join(f"{c} {counts[c]['questions']}" for c in categories if c in counts) + "."]
    lines += ["", "## Runs", "", "| variant | seed | steps | s/step | train s | test s | wall s | best val loss (step) | checkpoint |", "|---|---|---|---|---|---|---|---|---|"]
    for row in variants_.values():
        for r in row["runs"]:
            best = f"{r['best_val_loss']:.4f}" + (f" ({r['best_step']})" if r["best_step"] is not None else "")
            ckpt = f"`{run_relative(r['checkpoint_best'])}`" if r["checkpoint_best"] else "none (nothing trained)"
            lines.append(f"| {row['name']} | {r['seed']} | {r['steps']} | {r['seconds_per_step'] or ''} | {r['train_s']} | {r['eval_s']} | {r['wall_s']} | {best} | {ckpt} |")
    lines += ["", "Plots: `loss_curves.png`, `f1.png`, `f1_per_category.png`."]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], runs: dict[str, list[dict[str, Any]]], out: Path) -> list[Path]:
    """Loss curves per trained variant, F1 per variant (± std over seeds) and F1 per category, as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants_ = result["summary"]["variants"]
    written = []
    trained = [k for k, done in runs.items() if done and done[0]["steps"]]
    reference = variants_.get("none", {}).get("runs", [{}])[0].get("best_val_loss")
    columns = max(1, len(trained))
    fig, axes = plt.subplots(1, columns, figsize=(4.5 * columns, 3.6), squeeze=False, sharey=True)
    for ax, key in zip(axes[0], trained):
        for run in runs[key]:
            if run["train_curve"]:
                steps, losses = zip(*run["train_curve"])
                ax.plot(steps, losses, alpha=0.35, linewidth=0.8, label=f"train, seed {run['seed']}")
            if run["val_curve"]:
                steps, losses = zip(*run["val_curve"])
                ax.plot(steps, losses, marker="o", label=f"validation, seed {run['seed']}")
        if reference is not None:
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1, label="validation, no graph")
        ax.set_title(variants_[key]["name"], fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel(f"loss ({result['settings']['monitor']})")
    if not trained:
        axes[0][0].text(0.5, 0.5, "no trained variant", ha="center", va="center")
    fig.tight_layout()
    written.append(out / "loss_curves.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    names = [row["name"] for row in variants_.values()]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names)), 3.8))
    means = [row["f1"]["mean"] for row in variants_.values()]
    errors = [row["f1"]["std"] or 0.0 for row in variants_.values()]
    ax.bar(range(len(names)), means, yerr=errors, capsize=4, color="tab:blue")
    ax.set_xticks(range(len(names)), list(variants_), rotation=60, fontsize=6)
    ax.set_ylim(0, max(0.05, max(m + e for m, e in zip(means, errors)) * 1.15))
    ax.set_ylabel("test F1 (mean ± std over seeds)")
    ax.set_title("F1 per variant on the test conversation", fontsize=10)
    fig.text(0.01, 0.01, "; ".join(names), fontsize=5, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    written.append(out / "f1.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    categories = sorted({c for row in variants_.values() for c in row["f1_per_category"]})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * max(1, len(categories))), 3.8))
    width = 0.8 / max(1, len(variants_))
    for i, row in enumerate(variants_.values()):
        values = [row["f1_per_category"].get(c, {}).get("mean", 0.0) for c in categories]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=row["name"])
    ax.set_xticks([x + width * (len(variants_) - 1) / 2 for x in range(len(categories))], categories, fontsize=7, rotation=15)
    top = max((v.get("mean", 0.0) for row in variants_.values() for v in row["f1_per_category"].values()), default=0.0)
    ax.set_ylim(0, max(0.05, top * 1.15))
    ax.set_ylabel("test F1")
    ax.set_title("F1 per category", fontsize=10)
    ax.legend(fontsize=6)
    fig.tight_layout()
    written.append(out / "f1_per_category.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def saved_runs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """The runs of a saved results folder (``runs/<arm>-seed<k>.json``) by arm, each arm's in seed order."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for file in sorted((folder / "runs").glob("*.json")):
        run = json.loads(file.read_text())
        runs[run["variant"]].append(run)
    if not runs:
        raise InputError(str(folder / "runs"), "no saved runs (<arm>-seed<k>.json) here")
    return {arm: sorted(done, key=lambda r: r["seed"]) for arm, done in runs.items()}


def summary_from_runs(folder: Path, saved: dict[str, Any]) -> dict[str, Any]:
    """The summary of ``saved`` (the folder's results.json) recomputed from the folder's runs with its settings, every
    question in one category (the runs do not hold the categories)."""
    runs = saved_runs(folder)
    settings = saved["settings"]
    lora = [key.removeprefix("lora+") for key in runs if key.startswith("lora+") and not key.endswith("-shuffled")]
    args = argparse.Namespace(edge_tokens=settings["edge_tokens"], query_tokens=settings["query_tokens"], lora_readout=lora[0] if lora else "edges",
                              bootstrap_resamples=settings["bootstrap_resamples"], bootstrap_seed=settings["bootstrap_seed"])  # fmt: skip
    questions = {r["question_id"]: {"category": "all"} for done in runs.values() for run in done for r in run["predictions"]}
    return summarize(runs, questions, args)


def differences(recomputed: Any, saved: Any, where: str = "summary") -> list[str]:
    """Where ``recomputed`` and ``saved`` differ (floats to 1e-9), skipping the per-category F1 and the saved-only keys."""
    if isinstance(recomputed, dict) and isinstance(saved, dict):
        return [line for key in recomputed if key != "f1_per_category" for line in differences(recomputed[key], saved.get(key), f"{where}.{key}")]
    if isinstance(recomputed, list) and isinstance(saved, list) and len(recomputed) == len(saved):
        return [line for i, (a, b) in enumerate(zip(recomputed, saved)) for line in differences(a, b, f"{where}[{i}]")]
    if isinstance(recomputed, float) and isinstance(saved, (int, float)):
        return [] if math.isclose(recomputed, saved, rel_tol=1e-9, abs_tol=1e-12) else [f"{where}: {saved} saved, {recomputed} from the runs"]
    return [] if recomputed == saved else [f"{where}: {saved!r} saved, {recomputed!r} from the runs"]


def load_saved(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """A saved results folder's results.json and where its summary differs from the one its runs make."""
    file = folder / "results.json"
    if not file.is_file():
        raise InputError(str(folder), "not a saved graph-token report (no results.json)")
    saved = json.loads(file.read_text())
    return saved, differences(summary_from_runs(folder, saved), saved["summary"])


def main(argv: list[str] | None = None) -> int:
    """Rebuild (or with ``--check`` compare) the results.md of saved results folders whose numbers their runs make."""
    p = argparse.ArgumentParser(prog="python -m experiments.graph_token.report", description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="saved results folders (results.json and runs/)")
    p.add_argument("--check", action="store_true", help="compare with the committed results.md instead of writing it")
    args = p.parse_args(argv)
    for folder in args.folders:
        try:
            saved, found = load_saved(folder)
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if found:
            print(f"error: {folder / 'results.json'}: {len(found)} number(s) differ from its saved runs, first {found[0]}", file=sys.stderr)
            return 1
        text, written = markdown(saved), folder / "results.md"
        if args.check:
            if not written.is_file() or written.read_text() != text:
                print(f"error: {written}: not the report its results.json makes", file=sys.stderr)
                return 1
            continue
        with atomic_output(written) as handle:
            handle.write(text)
        print(f"wrote {written}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
