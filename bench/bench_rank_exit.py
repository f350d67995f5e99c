"""Seconds from a fault to each rank's exit: two CPU ranks (gloo) started as srun starts them, loader workers in both.

The faults of ``tests/test_rank_exit.py``: SIGTERM to the step's processes during training and during validation, and
an exception on one rank during validation (:func:`tests.two_ranks.run_two_ranks`, the tiny random decoder). ``--root``
runs the ranks on another checkout's code (``git archive COMMIT | tar -x -C /tmp/before``), so a change is timed before and
after on one machine; a rank still running at ``--guard`` seconds counts as hung (the group is then killed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from qgmem_train.reports import machine_info
from tests.tiny_decoder import fixture_corpus, save_tiny_decoder
from tests.two_ranks import ROOT, run_two_ranks

CASES = (("sigterm", "train"), ("sigterm", "validation"), ("raise", "validation"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout whose code the ranks run (this one)")
    parser.add_argument("--guard", type=float, default=200.0, help="seconds after which a rank counts as hung")
    parser.add_argument("--out", type=Path, help="JSON file for the rows (printed in any case)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        llm = save_tiny_decoder(Path(scratch) / "tiny", fixture_corpus())
        for fault, when in CASES:
            ended = run_two_ranks(llm, Path(scratch) / f"{fault}-{when}", fault, when, guard_s=args.guard, root=args.root.resolve())
            rows.append({"fault": fault, "during": when, "exit_codes": ended.codes, "seconds_to_exit": ended.seconds_to_exit})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_info(), "guard_s": args.guard, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
