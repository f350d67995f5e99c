"""Run a command's ``main`` in the test's own process as the command's own process would run it: its exit status, stdout
and stderr, with Python's warnings written to stderr as a fresh interpreter writes them. A check of a command's exit
status and output then costs no new interpreter importing torch and Lightning again (seconds of CPU each time)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping

import pytest

FRESH_INTERPRETER_IGNORES = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
"""The warning categories a Python started without ``-W`` leaves unprinted."""


def run_main(
    main: Callable[[list[str]], int | None], argv: list[str], capfd: pytest.CaptureFixture[str], env: Mapping[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """``main(argv)`` with ``env`` set (``None`` unsets a variable); the environment and torch threads are put back
    afterwards, and so are the loggers: those that existed keep their handlers and levels, and a handler made during the
    call on the captured stdout or stderr (the command's own, say) is removed with the capture it writes to."""
    import torch

    saved_env, threads, captured = dict(os.environ), torch.get_num_threads(), (sys.stdout, sys.stderr)
    loggers = {name: (lg.handlers[:], lg.level) for name, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    root = (logging.root.handlers[:], logging.root.level)
    for name, value in (env or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    capfd.readouterr()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            warnings.simplefilter("default")
            for category in FRESH_INTERPRETER_IGNORES:
                warnings.simplefilter("ignore", category)
            try:
                code = main(argv)
            except SystemExit as exit:  # argparse and LightningCLI exit on bad arguments
                code = exit.code if isinstance(exit.code, int) else (1 if exit.code else 0)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        logging.root.handlers[:], level = root
        logging.root.setLevel(level)
        for name, lg in list(logging.root.manager.loggerDict.items()):
            if name in loggers:
                lg.handlers[:], level = loggers[name]
                lg.setLevel(level)
            elif isinstance(lg, logging.Logger):
                lg.handlers[:] = [h for h in lg.handlers if getattr(h, "stream", None) not in captured]
    out, err = capfd.readouterr()
    err += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
    return subprocess.CompletedProcess(argv, int(code or 0), out, err)
