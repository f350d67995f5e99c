"""Training targets: the judged model answer (paper) or the gold answer with a cited reasoning path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def cites(source_text: str, evidence_texts: Iterable[str]) -> bool:
    """Whether a unit's source dialogue contains one of the evidence messages (case- and space-insensitive)."""
    source = " ".join(source_text.lower().split())
    return any(e and " ".join(e.lower().split()) in source for e in evidence_texts)


def gold_reasoning_path(labels: Mapping[str, str], evidence_unit_ids: set[str]) -> str:
    """A short reasoning path citing the labels (MU#/F#) of the units that hold the gold evidence."""
    cited = [label for label, unit_id in labels.items() if unit_id in evidence_unit_ids]
    if not cited:
        return "No memory unit states this directly; the answer follows from the memory context."
    return f"The answer is stated in {', '.join(cited)}."
