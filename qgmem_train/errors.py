"""Errors that the CLI turns into one clear line and exit code 2."""

from __future__ import annotations


class InputError(Exception):
    """Bad input: names where (file, record, field) and what is wrong."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class ModelUnavailableError(Exception):
    """A model or server that cannot be loaded or reached here, with the reason in one line."""
