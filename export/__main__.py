"""``python -m export --checkpoint CKPT --config FIT_YAML --out DIR [--push REPO_ID]``: export, then optionally push.

The folder is always written first (atomically); ``--dry-run`` or offline mode stop there with a
message. Bad input, a missing model or a failed push end as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.logging_setup import setup_output


def build_parser() -> argparse.ArgumentParser:
    """Options of ``python -m export``."""
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, type=Path, help="Lightning checkpoint of the module (or its folder: last.ckpt)")
    parser.add_argument("--config", required=True, type=Path, help="the fit YAML it was trained with (its pipeline: section is exported)")
    parser.add_argument("--out", required=True, type=Path, help="export folder to write (an earlier export there is replaced)")
    parser.add_argument("--eval-report", type=Path, help="metrics.json of an evaluation, shown in the model card")
    parser.add_argument("--llm-id", help="public name (Hub repo id) of a base model the fit config names by a local path")
    parser.add_argument("--embedder-id", help="public name (Hub repo id) of an embedder the fit config names by a local path")
    parser.add_argument("--push", metavar="REPO_ID", help="Hugging Face Hub model repo to upload the folder to (owner/name)")
    parser.add_argument("--private", action="store_true", help="create the Hub repo as private")
    parser.add_argument("--revision", help="branch to push to (created when missing; default: main)")
    parser.add_argument("--dry-run", action="store_true", help="write the folder, then stop before any network access")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Export, then push unless it is a dry run; 0 on success, 2 with one line on any known failure."""
    from export.hub import PushError

    args = build_parser().parse_args(setup_output(argv))
    try:
        if args.push is not None and args.push.count("/") != 1:
            raise InputError("--push", f"{args.push!r} is not a repo id of the form owner/name")
        from export.package import export_model

        out = export_model(args.checkpoint, args.config, args.out, eval_report=args.eval_report, repo_id=args.push,
                           names={"llm": args.llm_id, "embedder": args.embedder_id})  # fmt: skip
        print(f"exported to {out}")
        if args.dry_run:
            target = f"; would upload it to {args.push} ({'private' if args.private else 'public'}, revision {args.revision or 'main'})" if args.push else ""
            print(f"dry run: nothing pushed{target}")
            return 0
        if args.push is None:
            return 0
        from export.hub import push_folder

        print(f"pushed: {push_folder(out, args.push, private=args.private, revision=args.revision)}")
        return 0
    except (InputError, ModelUnavailableError, PushError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
