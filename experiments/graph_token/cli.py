"""The graph-token study's command line: its options, the settings a folder's runs share, and the run loop (data,
every arm and seed, skipping finished runs, then the report). The study is described in :mod:`experiments.graph_token`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled models are local; never reach for the Hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from qgmem_train.reports import git_state, machine_info, portable  # noqa: E402
from experiments.graph_token.answering import answered_ids, answered_subset  # noqa: E402
from experiments.graph_token.arms import GRAPH_ARMS, variants  # noqa: E402
from experiments.graph_token.data import DEFAULT_DATA, ROOT, data_folder, prepare_data  # noqa: E402
from experiments.graph_token.report import markdown, plot  # noqa: E402
from experiments.graph_token.stats import summarize  # noqa: E402
from experiments.graph_token.steps import llm_instrument  # noqa: E402
from experiments.graph_token.training import extend_answers, run_relative, run_variant  # noqa: E402
from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM  # noqa: E402
from qgmem_train.errors import InputError, ModelUnavailableError  # noqa: E402
from qgmem_train.fileio import atomic_output, write_json_atomic  # noqa: E402

log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    """The command line; the defaults are the ~75-minute run described in :mod:`experiments.graph_token`."""
    p = argparse.ArgumentParser(prog="python -m experiments.graph_token", description="Does the graph token help? Graph-token variants against their controls, split by conversation.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help=f"ConvoMem-format folder (default: {DEFAULT_DATA} when present)")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "graph_token", help="output folder (resumes what is there)")
    p.add_argument("--variants", nargs="+", default=None, metavar="ARM",
                   help=f"arms to run (default: all): {', '.join(variants())}; lora+<design> follows --lora-readout")
    p.add_argument("--report-only", action="store_true", help="report the runs already in --out and run none (missing ones are named)")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 of the arms named by --seeded")
    p.add_argument("--seeded", nargs="*", default=[], metavar="ARM", help="arms run with --seeds seeds (with their -shuffled tests)")
    p.add_argument("--other-seeds", type=int, default=1, help="seeds 0..N-1 of every other arm")
    p.add_argument("--edge-tokens", type=int, default=10, help="cap of the edges readout (k), and its soft prompt's size")
    p.add_argument("--query-tokens", type=int, default=4, help="T of the query readout and its soft prompt")
    p.add_argument("--lora-readout", choices=GRAPH_ARMS, default="edges", help="the graph design of the LoRA + graph arm")
    p.add_argument("--monitor", choices=("val/answer_loss", "val/loss"), default="val/answer_loss", help="validation loss that picks the checkpoint")
    p.add_argument("--no-attribute-edges", dest="attribute_edges", action="store_false", help="local graphs of one edge per unit (the paper's)")
    p.add_argument("--test-count", type=int, default=2, help="test conversations (one validation, the rest train)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per trained run")
    p.add_argument("--batch-size", type=int, default=1, help="training examples per step")
    p.add_argument("--eval-batch-size", type=int, default=8, help="examples per validation/test/predict batch")
    p.add_argument("--val-checks", type=int, default=3, help="validation-loss checks per trained run (model selection, curves)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of every trained variant")
    p.add_argument("--gnn-hidden", type=int, default=256, help="graph encoder width (projector: twice this)")
    p.add_argument("--max-context-tokens", type=int, default=600, help="serialized working memory kept in the prompt (the paper's ~600; 128 too)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="generation budget (answer strings capped at (N-24)//2 characters)")
    p.add_argument("--max-train-questions", type=int, default=300, help="train questions over all train conversations")
    p.add_argument("--max-val-questions", type=int, default=12, help="validation questions")
    p.add_argument("--max-test-questions", type=int, default=None, help="test questions (default: every question of the test conversations)")
    p.add_argument("--max-f1-questions", type=int, default=None,
                   help="answer (F1, BLEU-1, EM) a seeded sample of this many test questions (default: every one); losses use all")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the conversation split and the question samples")
    p.add_argument("--test-conversation", nargs="+", help="name the test conversations (e.g. dataset_2 dataset_6) instead of drawing them")
    p.add_argument("--validation-conversation", help="name the validation conversation instead of drawing it")
    p.add_argument("--sentence-vectors", action="store_true", help="data prep also embeds every sentence of a unit (about 2x slower)")
    p.add_argument("--reranker", choices=("none", "llm", "cross"), default="none",
                   help="the data prep's reranker (the demo's: cross with --reranker-model checkpoints/reranker-cpu-small/model, built by make reranker-small)")
    p.add_argument("--reranker-model", default=None, help="the cross reranker's model folder")
    p.add_argument("--traces", action="store_true", help="the data prep builds dynamic memory traces (evidence clusters in the context)")
    p.add_argument("--bootstrap-resamples", type=int, default=2000)
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: on a shared 2-core machine, 2 threads ran 8x slower)")
    p.add_argument("--llm", default=BUNDLED_LLM, help="frozen backbone of the runs")
    p.add_argument("--embedder", default=BUNDLED_EMBEDDER, help="retrieval and graph-feature embedder")
    return p


RUN_SETTINGS = (
    "steps", "batch_size", "val_checks", "lr", "gnn_hidden", "edge_tokens", "query_tokens", "monitor",
    "max_context_tokens", "max_new_tokens", "llm",
)  # fmt: skip
"""Settings that change a run's result: rerunning into the same --out with others is refused (``--lora-readout`` is not
one: it names its arm, ``lora+<design>``, so rounds with different ones share a folder)."""
ANSWER_SETTINGS = ("max_f1_questions",)
"""Settings recorded but free to change: another answer sample extends (or trims) the answers of the finished runs."""
DATA_SETTINGS = (
    "data", "max_train_questions", "max_val_questions", "max_test_questions", "split_seed", "test_conversation",
    "validation_conversation", "sentence_vectors", "embedder", "attribute_edges", "test_count", "reranker", "reranker_model", "traces",
)  # fmt: skip
"""Settings that change the data."""


def check_settings(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Record the settings in ``out/settings.json``, refusing to mix runs made with other ones."""
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k in RUN_SETTINGS + DATA_SETTINGS + ANSWER_SETTINGS}
    file = out / "settings.json"
    if file.exists():
        before = json.loads(file.read_text())
        default = parser().get_default
        changed = sorted(k for k in settings if k not in ANSWER_SETTINGS and before.get(k, default(k)) != settings[k])
        if changed:
            raise InputError(str(file), f"this folder holds runs made with other {', '.join(changed)}; pass another --out")
    write_json_atomic(file, settings)
    return settings


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """The whole experiment: data, every run (skipping finished ones), then the report."""
    started = time.perf_counter()
    args.data = data_folder(args.data)
    for name in ("steps", "seeds", "other_seeds", "val_checks", "batch_size", "eval_batch_size", "threads", "edge_tokens", "query_tokens", "test_count"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", "must be at least 1")
    arms = variants(args.edge_tokens, args.query_tokens, args.lora_readout)
    args.variants = args.variants or list(arms)
    unknown = [k for k in args.variants + args.seeded if k not in arms]
    if unknown:
        raise InputError("--variants", f"unknown arm(s) {', '.join(unknown)} (known: {', '.join(arms)})")
    for key in args.variants:
        source = arms[key].shuffled_of
        if source is not None and source not in args.variants:
            raise InputError("--variants", f"{key} tests the checkpoint of {source}: run {source} too")
    import torch

    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    if args.report_only and not (out / "data" / "split.json").exists():
        raise InputError(str(out), "no data prep here to report on; run without --report-only first")
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    settings = check_settings(args, out)
    data = prepare_data(args, out)  # bad data is refused here, before Lightning's import
    import lightning  # noqa: F401  (sets its own log level on import; quieted below)

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # the stage lines say what it would

    def seeds_of(key: str) -> int:
        return args.seeds if key in args.seeded or arms[key].shuffled_of in args.seeded else args.other_seeds

    order = [k for k in arms if k in args.variants]  # run order: a shuffled-graph arm after its source
    plan = [(arms[k], seed) for k in order for seed in range(seeds_of(k))]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in args.variants}
    not_run: list[str] = []
    for number, (variant, seed) in enumerate(plan, 1):
        run_dir = out / "runs" / f"{variant.key}-seed{seed}"
        result_file = run_dir / "result.json"
        if result_file.exists():
            log.info("[run %d/%d] %s, seed %d: done before, reusing %s", number, len(plan), variant.name, seed, result_file)
            done = json.loads(result_file.read_text())
            wanted = set(answered_subset([r["question_id"] for r in done["predictions"]], args.max_f1_questions, args.split_seed))
            if answered_ids(done) != wanted:
                if args.report_only:
                    log.info("  its answers are not the sample of --max-f1-questions %s; reported as they are", args.max_f1_questions)
                else:
                    done = extend_answers(args, variant, seed, out / "data" / "trajectories", run_dir, done, wanted)
            runs[variant.key].append(done)
            continue
        if args.report_only:
            log.info("[run %d/%d] %s, seed %d: not run (--report-only)", number, len(plan), variant.name, seed)
            not_run.append(f"{variant.name}, seed {seed}")
            continue
        log.info("[run %d/%d] %s, seed %d", number, len(plan), variant.name, seed)
        source = None
        if variant.shuffled_of is not None:
            source = next((r for r in runs[variant.shuffled_of] if r["seed"] == seed), None)
            if source is None:
                log.info("[run %d/%d] %s, seed %d: no checkpoint of %s, seed %d; skipped", number, len(plan), variant.name, seed, variant.shuffled_of, seed)
                continue
            checkpoint = out / run_relative(source["checkpoint_best"])
            if not checkpoint.is_file():
                trained = out / "runs" / f"{variant.shuffled_of}-seed{seed}" / "result.json"
                raise InputError(str(checkpoint), f"the checkpoint {variant.key} tests is gone; remove {trained} to train {variant.shuffled_of} again")
        result = run_variant(args, variant, seed, out / "data" / "trajectories", run_dir, source)
        log.info(
            "[run %d/%d] done in %.0f s: test loss %.4f, valid JSON %.3f, F1 %.3f, BLEU-1 %.3f, EM %.3f", number, len(plan),
            result["wall_s"], result["test_loss"], result["json_valid"], result["f1"], result["bleu1"], result["exact_match"],
        )  # fmt: skip
        runs[variant.key].append(result)

    result = {
        "command": shlex.join(["python", "-m", "experiments.graph_token", *argv]),
        "git": git_state(),
        "machine": machine,
        "settings": {**settings, "instrument": llm_instrument(args.llm), "variants": args.variants, "seeds": args.seeds, "seeded": args.seeded, "other_seeds": args.other_seeds,
                     "eval_batch_size": args.eval_batch_size, "bootstrap_resamples": args.bootstrap_resamples,
                     "bootstrap_seed": args.bootstrap_seed},  # fmt: skip
        "out": str(out),
        "data": {k: v for k, v in data.items() if k != "questions"},
        "summary": summarize(runs, data["questions"], args),
        "not_run": not_run,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    result["plots"] = [p.name for p in plot(result, runs, out)]
    result = portable(result, out)
    write_json_atomic(out / "results.json", result)
    with atomic_output(out / "results.md") as handle:
        handle.write(markdown(result))
    log.info("[report] wrote %s, %s and %s", out / "results.json", out / "results.md", ", ".join(result["plots"]))
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the experiment; bad input is one line on stderr and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    for name in ("experiments.graph_token", "data_prep"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    for message in (".*does not have many workers.*", ".*`srun` command is available.*", ".*LeafSpec.*", ".*module\\(s\\) in eval mode.*"):
        warnings.filterwarnings("ignore", message=message)
    try:
        run(args, argv)
    except (InputError, ModelUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
