"""Stored text made safe to print: no control, bidi or line-separator character reaches a terminal or a JSON reader raw.

A store's texts and speakers come from whoever wrote the conversations: printed raw, an escape sequence
rewrites the terminal, a carriage return or line separator starts a line that looks like another speaker's,
and a bidi override reverses what follows.
"""

from __future__ import annotations

import json
import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 controls (newlines and escapes among them), DEL, the bidi marks, embeddings, overrides and isolates, and the line and paragraph separators."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` with every unsafe character written as its escape (``\\x1b``, ``\\u202e``), on one line."""
    return _UNSAFE.sub(_escape, text)


def json_line(value: Any) -> str:
    """``value`` as one line of JSON (UTF-8 text kept) in which every unsafe character is a ``\\uXXXX`` escape."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))
