"""What a command prints besides its own lines: one policy for logs, warnings, library progress bars and bitsandbytes.

By default a command shows only the project's progress bars and summary lines: third-party log records
below ERROR, Python warnings and the libraries' own progress bars (transformers' "Loading weights",
Hub downloads) are hidden. ``-v``/``--verbose`` anywhere on the command line, or ``QGMEM_LOG_LEVEL``
(DEBUG, INFO, WARNING, ERROR), brings them back. Every entry point calls :func:`setup_output` first.

bitsandbytes stays unimportable until quantization is asked for (:func:`allow_bitsandbytes`): peft, which
sentence-transformers imports, imports it eagerly, which costs seconds and, on CPUs with AVX512-BF16,
logs a kernels warning on every command.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings
from collections.abc import Sequence

LOG_LEVEL_ENV = "QGMEM_LOG_LEVEL"
VERBOSE_FLAGS = ("-v", "--verbose")
PROJECT_PACKAGES = frozenset({"qgmem_train", "data_prep", "export"})
"""Top-level packages whose log records are the project's own lines: always shown at INFO and above."""
QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Read by the libraries when they are imported; set only where the user has not set them."""
PROGRESS_BAR_SWITCHES = {
    "huggingface_hub.utils": ("disable_progress_bars", "enable_progress_bars"),
    "transformers.utils.logging": ("disable_progress_bar", "enable_progress_bar"),
    "datasets.utils.tqdm": ("disable_progress_bars", "enable_progress_bars"),
}
"""Where the progress bars of libraries already imported are switched (the environment covers later imports)."""
QUIET_LEVEL = logging.ERROR

_env_set: set[str] = set()
_quiet: bool | None = None
"""``None`` until :func:`configure_output` runs."""


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (test capture replaces it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


class _LibraryFilter(logging.Filter):
    """Pass the project's records, and the libraries' from ``level`` up."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".", 1)[0] in PROJECT_PACKAGES or record.levelno >= self.level


def take_verbose_flag(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without ``-v``/``--verbose`` (anywhere before ``--``), and whether one was given."""
    rest: list[str] = []
    verbose = False
    for index, arg in enumerate(argv):
        if arg == "--":
            rest += argv[index:]
            break
        if arg in VERBOSE_FLAGS:
            verbose = True
        else:
            rest.append(arg)
    return rest, verbose


def library_log_level(verbose: bool) -> int:
    """The level of third-party records shown: ``QGMEM_LOG_LEVEL``, at most INFO with ``-v``, else ERROR."""
    name = os.environ.get(LOG_LEVEL_ENV, "").strip().upper()
    level = QUIET_LEVEL
    if name:
        level = logging.getLevelName(name)
        if not isinstance(level, int):
            print(f"error: {LOG_LEVEL_ENV}={name}: not a log level (DEBUG, INFO, WARNING, ERROR)", file=sys.stderr)
            raise SystemExit(2)
    return min(level, logging.INFO) if verbose else level


def configure_output(verbose: bool = False) -> int:
    """Apply the output policy to this process; returns the third-party log level in effect."""
    global _quiet
    level = library_log_level(verbose)
    quiet = _quiet = level >= QUIET_LEVEL
    _configure_logging(level)
    warnings.simplefilter("ignore" if quiet else "default")
    _configure_libraries(quiet)
    hide_bitsandbytes()
    return level


def is_quiet() -> bool:
    """Whether this process hides the libraries' output (set by :func:`configure_output`)."""
    return bool(_quiet)


def is_verbose() -> bool:
    """Whether this process was configured to show the libraries' output (``-v`` or ``QGMEM_LOG_LEVEL`` below ERROR)."""
    return _quiet is False


def setup_output(argv: Sequence[str] | None = None) -> list[str]:
    """The call every entry point makes first: configure output from ``-v`` and the environment, return the other args."""
    rest, verbose = take_verbose_flag(sys.argv[1:] if argv is None else argv)
    configure_output(verbose)
    return rest


def route_to_root(name: str) -> None:
    """Send the records of logger ``name`` through the root handler and its filter.

    For libraries that add a console handler of their own when imported (``lightning`` does), so their
    lines follow the policy too; call it after the import.
    """
    logger = logging.getLogger(name)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.propagate = True


def _configure_logging(level: int) -> None:
    """One stderr handler on the root logger that drops library records below ``level``."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_LibraryFilter(level))
        root.addHandler(handler)
    for library_filter in handler.filters:
        library_filter.level = level  # type: ignore[union-attr]
    root.setLevel(level)
    for name in PROJECT_PACKAGES:
        logging.getLogger(name).setLevel(min(level, logging.INFO))


def _configure_libraries(quiet: bool) -> None:
    """transformers' verbosity and the progress bars of transformers, the Hub and datasets, before or after their import."""
    if quiet:
        for key, value in QUIET_ENV.items():
            if key not in os.environ:
                os.environ[key] = value
                _env_set.add(key)
    else:
        for key in _env_set:
            os.environ.pop(key, None)
        _env_set.clear()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(logging.ERROR if quiet else logging.WARNING)
    for module, (disable, enable) in PROGRESS_BAR_SWITCHES.items():
        if module in sys.modules:
            switches = importlib.import_module(module)
            getattr(switches, disable if quiet else enable)()


def hide_bitsandbytes() -> None:
    """Make ``import bitsandbytes`` fail (and find_spec answer None) unless it is loaded already."""
    sys.modules.setdefault("bitsandbytes", None)  # type: ignore[arg-type]


def allow_bitsandbytes() -> None:
    """Undo :func:`hide_bitsandbytes` before quantized weights load, and forget availability checks cached meanwhile."""
    if "bitsandbytes" in sys.modules and sys.modules["bitsandbytes"] is None:
        del sys.modules["bitsandbytes"]
    for module, name in (("transformers.utils.import_utils", "is_bitsandbytes_available"), ("peft.import_utils", "is_bnb_4bit_available")):
        check = getattr(sys.modules.get(module), name, None)
        if hasattr(check, "cache_clear"):
            check.cache_clear()
