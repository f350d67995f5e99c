"""Errors that the CLI turns into one clear line and exit code 2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class InputError(Exception):
    """Bad input: names where (file, record, field) and what is wrong."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class ModelUnavailableError(Exception):
    """A model or server that cannot be loaded or reached here, with the reason in one line."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a one-line error quotes."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def rust_panics_as_input_errors(where: str, what: str) -> Iterator[None]:
    """A panic inside a Rust extension (pyo3's ``PanicException``, a ``BaseException`` that ``except Exception`` misses,
    e.g. the tokenizers library on a hostile tokenizer.json's regex) as one :class:`InputError` naming ``where``."""
    try:
        yield
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise InputError(where, f"{what} fails: {first_line(exc)}") from None
