"""Sentence splitting for facts: the pieces the dense channel embeds besides the whole fact.

A long turn (turns mode) often answers a question in one of its sentences; its single embedding
averages that sentence away. Embedding each sentence too, with the fact's speaker label kept on
every piece, lets the dense channel score the unit by its best-matching sentence.
"""

from __future__ import annotations

import re

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_SPEAKER_LABEL = re.compile(r"^([^:\n]{1,40}):\s+(?=\S)")


def split_sentences(text: str) -> list[str]:
    """The non-empty sentences of ``text`` (split after ``.``, ``!`` or ``?`` followed by space)."""
    return [s.strip() for s in _SENTENCE.split(text.strip()) if s.strip()]


def fact_sentences(fact_text: str) -> list[str]:
    """The sentences of a multi-sentence fact, each led by the fact's ``Speaker:`` label if it has one; [] for one sentence."""
    label = _SPEAKER_LABEL.match(fact_text)
    body = fact_text[label.end():] if label else fact_text
    sentences = split_sentences(body)
    if len(sentences) < 2:
        return []
    return [f"{label.group(1)}: {s}" for s in sentences] if label else sentences
