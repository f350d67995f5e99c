"""``python -m qgmem_train``: one entry that dispatches LightningCLI's and the project's subcommands.

Each subcommand lives in its own module exposing ``main(argv) -> int``; modules are imported only when
their command runs, so ``--help`` is instant. Output is quiet unless ``-v``/``--verbose`` is given anywhere
(:mod:`qgmem_train.logging_setup`). Bad input anywhere ends as one line on stderr and exit 2.
"""

from __future__ import annotations

import importlib
import sys

from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.logging_setup import LOG_LEVEL_ENV, setup_output

COMMANDS: dict[str, tuple[str, str]] = {
    "fit": ("qgmem_train.lightning_cli", "train the graph encoder and projector (LightningCLI)"),
    "validate": ("qgmem_train.lightning_cli", "validation loss, valid-JSON rate and exact match (LightningCLI)"),
    "test": ("qgmem_train.lightning_cli", "the same metrics on the test split (LightningCLI)"),
    "predict": ("qgmem_train.lightning_cli", "write predictions for a trajectory dataset as JSONL (LightningCLI)"),
    "fit-reranker": ("qgmem_train.reranker.cli", "train the cross-encoder reranker from the fused candidate pools (configs/reranker-cpu.yaml)"),
    "average-rerankers": ("qgmem_train.reranker.average", "average trained rerankers of one recipe and split (seeds) into one model of the same size"),
    "fit-embedder": ("qgmem_train.reranker.embedder_tuning", "fine-tune the embedder on the reranker's pairs and compare it on held-out conversations"),
    "build": ("qgmem_train.build", "build or extend a memory store from conversations"),
    "ask": ("qgmem_train.ask", "answer a question over a memory store, citing its source turns"),
    "serve": ("qgmem_train.serve.cli", "serve memory over HTTP: add sessions, search, ask, list and delete, per tenant"),
    "eval": ("qgmem_train.eval.cli", "retrieval and answer evaluation with metrics.json and plots"),
    "fetch": ("qgmem_train.llm.fetch", "put a training config's Hub models in the local cache once, before many ranks start"),
    "doctor": ("qgmem_train.doctor", "check the configured models: one constrained JSON record and a few embeddings"),
}


def usage() -> str:
    """The top-level help: every subcommand with a line each."""
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m qgmem_train COMMAND [ARGS...] [-v]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += [
        "",
        "-v, --verbose (anywhere): also show the libraries' logs, warnings and progress bars",
        f"  ({LOG_LEVEL_ENV}=DEBUG|INFO|WARNING|ERROR sets the level of the libraries' logs).",
        "Run `python -m qgmem_train COMMAND --help` for the options of one command.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Set the output policy, dispatch ``argv[0]`` to its module; map known failures to exit code 2."""
    argv = setup_output(argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"qgmem_train: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    try:
        if module.__name__.endswith("lightning_cli"):
            return int(module.main([command, *rest]) or 0)
        return int(module.main(rest) or 0)
    except (InputError, ModelUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
