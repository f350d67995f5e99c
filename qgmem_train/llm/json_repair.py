"""Find and mend the JSON object in a model's free-text reply.

Handles what unconstrained models write: code fences, ``<think>`` blocks and prose around the object,
trailing commas, single quotes, unquoted keys, Python literals, raw newlines and stray quotes inside
strings, and replies cut off before their closing brackets.
"""

from __future__ import annotations

import json
import re
from typing import Any

_THINK_BLOCK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_FENCE_LINE = re.compile(r"^\s*```[\w-]*\s*$", re.MULTILINE)
_LITERALS = {"True": "true", "False": "false", "None": "null", "true": "true", "false": "false", "null": "null"}
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")
_CLOSER = {"{": "}", "[": "]"}
_MAX_STARTS = 8


def strip_wrapping(text: str) -> str:
    """Drop ``<think>`` blocks and code-fence lines; what is left still may hold prose."""
    return _FENCE_LINE.sub("", _THINK_BLOCK.sub("", text))


def parse_json_object(text: str) -> tuple[dict[str, Any], bool]:
    """The first JSON object in ``text`` and whether it needed mending; ``ValueError`` when there is none."""
    try:
        value = json.loads(text)
        if isinstance(value, dict):
            return value, False
    except (json.JSONDecodeError, TypeError):
        pass
    cleaned = strip_wrapping(text)
    starts = [m.start() for m in re.finditer(r"\{", cleaned)][:_MAX_STARTS]
    for start in starts:
        value = _mend_from(cleaned, start)
        if isinstance(value, dict):
            return value, True
    raise ValueError("no JSON object found" if not starts else "no parsable JSON object (mending failed)")


def _mend_from(text: str, start: int) -> Any:
    """Scan one object from ``text[start]`` into valid JSON; on failure retry cut back to earlier commas."""
    out, cuts = _scan(text, start)
    for body, stack in [(out, None), *reversed(cuts)]:
        candidate = _close("".join(body) if stack is None else body, stack)
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return None


def _close(body: str, stack: list[str] | None) -> str:
    """Append the closers that ``body`` still owes, dropping a dangling comma or colon first."""
    if stack is None:
        stack = _open_brackets(body)
    body = body.rstrip().rstrip(",:").rstrip()
    return body + "".join(_CLOSER[b] for b in reversed(stack))


def _open_brackets(body: str) -> list[str]:
    stack: list[str] = []
    in_string = escaped = False
    for ch in body:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack


def _next_significant(text: str, i: int) -> str:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return text[i] if i < len(text) else ""


def _scan(text: str, start: int) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Rewrite the object starting at ``start`` as JSON text; also return cut points before each comma."""
    out: list[str] = []
    cuts: list[tuple[str, list[str]]] = []
    stack: list[str] = []
    quote = ""
    i = start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and i + 1 < len(text):
                nxt = text[i + 1]
                out.append("'" if nxt == "'" else "\\" + nxt)
                i += 2
                continue
            if ch == quote and _next_significant(text, i + 1) in {",", ":", "}", "]", ""}:
                out.append('"')
                quote = ""
            elif ch == '"':
                out.append('\\"')
            elif ch == "\n":
                out.append("\\n")
            elif ch in "\r\t":
                out.append({"\r": "\\r", "\t": "\\t"}[ch])
            else:
                out.append(ch)
            i += 1
            continue
        if ch in "\"'":
            quote = ch
            out.append('"')
        elif ch in "{[":
            stack.append(ch)
            out.append(ch)
        elif ch in "}]":
            while out and out[-1] in {",", " ", "\n", "\t", "\r"}:
                out.pop()
            if stack:
                out.append(_CLOSER[stack.pop()])
            if not stack:
                break
        elif ch == ",":
            cuts.append(("".join(out), list(stack)))
            out.append(ch)
        elif ch in "-0123456789":
            number = _NUMBER.match(text, i)
            if number:
                out.append(number.group(0))
                i = number.end()
                continue
        elif ch.isalpha() or ch == "_":
            word = re.match(r"[A-Za-z_][\w\-]*", text[i:]).group(0)
            i += len(word)
            if _next_significant(text, i) == ":" or word not in _LITERALS:
                out.append(json.dumps(word))
            else:
                out.append(_LITERALS[word])
            continue
        elif ch in ": \t\r\n":
            out.append(ch)
        i += 1
    if quote:
        out.append('"')
    return out, cuts
