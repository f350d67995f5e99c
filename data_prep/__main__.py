"""``python -m data_prep``: run the frozen pipeline over ConvoMem and keep trajectories for training.

    python -m data_prep --config configs/data_prep/demo-cpu.yaml            # all shards' work, then merge
    python -m data_prep --config FILE --shard 0/4                          # one shard (SLURM array task)
    python -m data_prep merge --config FILE [--push-to-hub REPO]           # combine finished shards
    python -m data_prep align --config FILE [--pseudo-queries N]           # alignment data: graphs -> their facts

Every finished case is persisted at once; rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.fileio import refuse_foreign_folder
from qgmem_train.logging_setup import setup_output


def _shard(text: str) -> tuple[int, int]:
    try:
        index, total = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N such as 0/4, got {text!r}") from None
    if not 0 <= index < total:
        raise argparse.ArgumentTypeError(f"shard index {index} is not in 0..{total - 1}")
    return index, total


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    """The CLI: run (default), merge or align."""
    p = argparse.ArgumentParser(prog="python -m data_prep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=["run", "merge", "align"], default="run",
                   help="run (default), merge, or align: alignment data from the training cases' graphs (docs/alignment.md)")
    p.add_argument("--config", required=True, help="YAML with data_prep: and pipeline: sections")
    p.add_argument("--shard", type=_shard, help="process only shard I of N (then run merge once all are done)")
    p.add_argument("--push-to-hub", metavar="REPO", help="after merge, push the dataset to this Hub dataset repo (token from HF_TOKEN)")
    p.add_argument("--pseudo-queries", type=_count, default=16, metavar="N",
                   help="align: also activate a graph for N of each case's units' own texts (default 16)")
    p.add_argument("--split-from", metavar="FOLDER", help="align: take each case's split from this trajectory folder (cases absent from it are left out)")
    p.add_argument("--out", metavar="FOLDER", help="align: output folder (default: data_prep.out/align)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run or merge; bad input and unavailable models are one line and exit 2."""
    args = parser().parse_args(setup_output(argv))
    from data_prep.config import load_data_prep_config

    try:
        cfg, pipeline = load_data_prep_config(args.config)
        out = (args.out or str(Path(cfg.out) / "align")) if args.command == "align" else cfg.out
        refuse_foreign_folder(Path(out) / "dataset")  # before the work: the dataset is written last
        if args.command == "align":
            from data_prep.align import build_alignment_data

            print(json.dumps(build_alignment_data(cfg, pipeline, out, args.pseudo_queries, args.split_from)))
            return 0
        if args.command == "run":
            from data_prep.run import run_shard

            shard, total = args.shard or (0, 1)
            folder = run_shard(cfg, pipeline, shard, total)
            print(f"shard {shard}/{total} done: {folder}")
            if args.shard is not None:
                return 0
        from data_prep.merge import merge  # the training libraries it needs load only once the input is known good

        manifest = merge(cfg, pipeline)
        print(json.dumps({"dataset": manifest["dataset"], "per_split": manifest["counts"]["per_split"], "target": manifest["target"]}))
        if args.push_to_hub:
            from data_prep.push import push_dataset

            push_dataset(manifest["dataset"], args.push_to_hub)
    except (InputError, ModelUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
